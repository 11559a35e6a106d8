"""One cell run in a Jupyter kernel through its websocket, as JupyterLab runs it: an execute request, then
the kernel's messages until it is idle again; what the cell printed, or one line for what went wrong.
"""

from __future__ import annotations

import json
import time
import uuid

from ..system.errors import WorkshopError
from .answers import clean


def execute(ws, code: str, number: int, kernel: str, timeout_s: float) -> str:
    import websocket

    msg_id = uuid.uuid4().hex
    closed = WorkshopError(f"The websocket of kernel {kernel} closed while cell {number} ran.",
                           "check the kernel's log (the server's) for a crash, and that the proxy keeps websockets "
                           "open.")
    try:
        ws.send(json.dumps({"header": {"msg_id": msg_id, "msg_type": "execute_request", "username": "portal-check",
                                       "session": uuid.uuid4().hex, "version": "5.3"},
                            "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
                            "content": {"code": code, "silent": False, "store_history": False,
                                        "user_expressions": {}, "allow_stdin": False}}))
    except (OSError, websocket.WebSocketException):
        raise closed from None
    printed, deadline = [], time.monotonic() + timeout_s
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
        parent = message.get("parent_header")
        if not isinstance(parent, dict) or parent.get("msg_id") != msg_id:
            continue
        kind, content = message.get("msg_type"), message.get("content")
        content = content if isinstance(content, dict) else {}
        if kind == "stream":
            printed.append(str(content.get("text", "")))
        elif kind == "error":
            raise WorkshopError(f"Cell {number} failed in kernel {kernel}: {clean(content.get('ename', '?'), 60)}: "
                                f"{clean(content.get('evalue', ''), 300)}.",
                                "install the kit into the kernel's environment (pip install -e . there).")
        elif kind == "execute_reply" and content.get("status") in ("error", "aborted"):
            raise WorkshopError(f"Cell {number} {'failed' if content.get('status') == 'error' else 'was aborted'} in "
                                f"kernel {kernel} ({clean(content.get('ename', ''), 60) or 'no error named'}).",
                                "run it in JupyterLab to see the error; install the kit into the kernel's environment.")
        elif kind == "status" and content.get("execution_state") == "idle":
            return "".join(printed)
    raise WorkshopError(f"Cell {number} did not finish within {timeout_s:g} s in kernel {kernel}.",
                        "run it in JupyterLab to see where it waits.")
