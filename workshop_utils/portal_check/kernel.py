"""One cell run in a Jupyter kernel through its websocket, as JupyterLab runs it: an execute request, then
the kernel's messages until it is idle again; what the cell showed, or one line for what went wrong.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass

from ..system.errors import WorkshopError
from .answers import clean


@dataclass
class Cell:
    """What one cell did: its status ("ok", "error", "aborted", "died" or "timeout"), everything it showed as text
    (streams, and the plain-text form of what it displayed: a check's ✓ line), and its error's name and value."""

    status: str
    text: str
    error: str = ""


def run_cell(ws, code: str, number: int, kernel: str, timeout_s: float) -> Cell:
    """Send ``code`` and read the kernel's messages for it until the kernel is idle again (or ``timeout_s`` runs out).

    A closed websocket or a frame that is no Jupyter message is one line (WorkshopError); a cell that fails
    is a ``Cell`` with status "error", as JupyterLab shows it, for the caller to judge.
    """
    import websocket

    msg_id = uuid.uuid4().hex
    closed = WorkshopError(f"The websocket of kernel {kernel} closed while cell {number} ran.",
                           "check the kernel's log (the server's) for a crash or a kernel that never started (two "
                           "kernels started at once can race for a port), and that the proxy keeps websockets open.")
    try:
        ws.send(json.dumps({"header": {"msg_id": msg_id, "msg_type": "execute_request", "username": "portal-check",
                                       "session": uuid.uuid4().hex, "version": "5.3"},
                            "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
                            "content": {"code": code, "silent": False, "store_history": False,
                                        "user_expressions": {}, "allow_stdin": False}}))
    except (OSError, websocket.WebSocketException):
        raise closed from None
    shown, status, error, deadline = [], "ok", "", time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            frame = ws.recv()
        except websocket.WebSocketTimeoutException:
            break
        except (OSError, websocket.WebSocketException):
            raise closed from None
        try:
            message = json.loads(frame)
        except (ValueError, TypeError):
            message = None
        if not isinstance(message, dict):
            raise WorkshopError(f"The websocket of kernel {kernel} sent {clean(repr(frame), 60)} while cell {number} "
                                "ran, not a Jupyter message.",
                                "check that the hub's proxy routes /user/<name>/ to the attendee's Jupyter server.")
        kind, content = message.get("msg_type"), message.get("content")
        content = content if isinstance(content, dict) else {}
        if kind == "status" and content.get("execution_state") in ("restarting", "dead"):
            # The server's word that the kernel process died (killed for memory, a crash): no reply will come.
            return Cell("died", "".join(shown), "the kernel died while the cell ran (killed for memory, or a crash) "
                                                "and the server restarted it")
        parent = message.get("parent_header")
        if not isinstance(parent, dict) or parent.get("msg_id") != msg_id:
            continue
        if kind == "stream":
            shown.append(str(content.get("text", "")))
        elif kind in ("display_data", "execute_result"):
            data = content.get("data")
            text = data.get("text/plain") if isinstance(data, dict) else None
            if isinstance(text, str):
                shown.append(text + "\n")
        elif kind == "error":
            status, error = "error", f"{clean(content.get('ename', '?'), 60)}: {clean(content.get('evalue', ''), 300)}"
        elif kind == "execute_reply" and content.get("status") in ("error", "aborted"):
            status = str(content.get("status"))
            error = error or clean(content.get("ename", ""), 60)
        elif kind == "status" and content.get("execution_state") == "idle":
            return Cell(status, "".join(shown), error)
    return Cell("timeout", "".join(shown), f"did not finish within {timeout_s:g} s")


def execute(ws, code: str, number: int, kernel: str, timeout_s: float) -> str:
    """``run_cell`` for the portal check: what the cell printed, or one line on why it did not run."""
    cell = run_cell(ws, code, number, kernel, timeout_s)
    if cell.status == "timeout":
        raise WorkshopError(f"Cell {number} did not finish within {timeout_s:g} s in kernel {kernel}.",
                            "run it in JupyterLab to see where it waits.")
    if cell.status == "died":
        raise WorkshopError(f"Cell {number}: {cell.error} (kernel {kernel}).",
                            "check the server's memory limit against what the kernel needs, and the server's log.")
    if cell.status != "ok" and ":" in cell.error:
        raise WorkshopError(f"Cell {number} failed in kernel {kernel}: {cell.error}.",
                            "install the kit into the kernel's environment (pip install -e . there).")
    if cell.status != "ok":
        raise WorkshopError(f"Cell {number} {'failed' if cell.status == 'error' else 'was aborted'} in "
                            f"kernel {kernel} ({cell.error or 'no error named'}).",
                            "run it in JupyterLab to see the error; install the kit into the kernel's environment.")
    return cell.text
