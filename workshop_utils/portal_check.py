"""``python -m workshop_utils.portal_check``: does a Jupyter portal give an attendee what the workshop needs?

Run by an administrator (or the kit's tests) against a running JupyterHub, with an API token that may
reach the attendee's server (the ``access:servers`` scope)::

    python -m workshop_utils.portal_check --hub https://portal.example.org --user alice --token $TOKEN \\
        --tensorboard-port 6006

It asks the attendee's single-user server, through the hub's proxy, what an attendee would meet:

1. the server is running;
2. the kit's kernel is offered by its display name (and whether it is the default for new notebooks);
3. that kernel starts and runs the first cells of a notebook (by default ``import workshop_utils``),
   through the kernel's websocket, as JupyterLab would;
4. a web tool listening on the attendee's node answers at ``<server>/proxy/<port>/`` (jupyter-server-proxy),
   as TensorBoard does for the notebooks.

Each problem is one line, with what to do about it; a portal that passes prints one line per check.
"""

from __future__ import annotations

import argparse
import json
import time
import urllib.error
import urllib.request
import uuid

from .system.errors import WorkshopError, exit_on_workshop_error

KERNEL_DISPLAY_NAME = "HPC DL workshop"
KERNEL_NAME = "hpc-dl-workshop"
REGISTER = (f"register it for every user in the environment the servers run in: python -m ipykernel install "
            f"--prefix <that environment> --name {KERNEL_NAME} --display-name \"{KERNEL_DISPLAY_NAME}\"")


def _request(url: str, token: str, method: str = "GET", body: dict | None = None, timeout_s: float = 30):
    """(status, text) of one HTTP request with the token; an unreachable address is one line."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method,
                                     headers={"Authorization": f"token {token}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return response.status, response.read().decode(errors="replace")
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode(errors="replace")
    except (urllib.error.URLError, OSError) as err:
        raise WorkshopError(f"{url} did not answer ({getattr(err, 'reason', err)}).",
                            "check the hub's address and that the hub is running.") from None


def _json(url: str, token: str, what: str, **options) -> dict:
    status, text = _request(url, token, **options)
    if status >= 400:
        raise WorkshopError(f"{what}: {url} answered {status}.",
                            "check that the token may reach the user's server (scope access:servers).")
    return json.loads(text) if text else {}


def server_url(hub: str, user: str, token: str) -> str:
    """The attendee's running server, as the hub's proxy serves it; one line if it is not running."""
    model = _json(f"{hub}/hub/api/users/{user}", token, f"the hub's record of user {user}")
    server = (model.get("servers") or {}).get("")
    if not server or not server.get("ready"):
        raise WorkshopError(f"User {user} has no running server on the portal.",
                            f"log in as {user} and start one (or POST {hub}/hub/api/users/{user}/server).")
    return hub + server["url"].rstrip("/")


def find_kernel(server: str, token: str, display_name: str = KERNEL_DISPLAY_NAME) -> tuple[str, bool]:
    """(the kernel's name, whether it is the default for new notebooks); one line if the portal lacks it."""
    specs = _json(f"{server}/api/kernelspecs", token, "the server's kernel list")
    names = {spec["spec"]["display_name"]: name for name, spec in specs.get("kernelspecs", {}).items()}
    if display_name not in names:
        offered = ", ".join(sorted(names)) or "none"
        raise WorkshopError(f"The portal offers no kernel named \"{display_name}\" (it offers: {offered}).", REGISTER)
    return names[display_name], specs.get("default") == names[display_name]


def run_cells(server: str, token: str, kernel: str, cells: list[str], timeout_s: float = 120) -> list[str]:
    """Start ``kernel`` on the server, run ``cells`` one by one through its websocket, shut it down.

    Returns each cell's printed output; a cell that raises is one line with its exception.
    """
    import websocket  # websocket-client, a dependency of jupyter_server

    status, text = _request(f"{server}/api/kernels", token, method="POST", body={"name": kernel}, timeout_s=timeout_s)
    if status >= 400:
        reason = (json.loads(text).get("message") if text.lstrip().startswith("{") else "") or f"status {status}"
        raise WorkshopError(f"Kernel {kernel} is registered but does not start: {reason.splitlines()[0]}.",
                            f"check its kernel.json (jupyter kernelspec list); {REGISTER}")
    kernel_id = json.loads(text)["id"]
    socket_url = server.replace("http", "ws", 1) + f"/api/kernels/{kernel_id}/channels"
    outputs = []
    try:
        try:
            ws = websocket.create_connection(socket_url, header=[f"Authorization: token {token}"], timeout=timeout_s)
        except (OSError, websocket.WebSocketException) as err:
            raise WorkshopError(f"Kernel {kernel} started but its websocket did not open ({err}).",
                                "check that the proxy passes websockets (configurable-http-proxy does).") from None
        try:
            for number, code in enumerate(cells, 1):
                outputs.append(_execute(ws, code, number, kernel, timeout_s))
        finally:
            ws.close()
    finally:
        _request(f"{server}/api/kernels/{kernel_id}", token, method="DELETE")
    return outputs


def _execute(ws, code: str, number: int, kernel: str, timeout_s: float) -> str:
    msg_id = uuid.uuid4().hex
    ws.send(json.dumps({"header": {"msg_id": msg_id, "msg_type": "execute_request", "username": "portal-check",
                                   "session": uuid.uuid4().hex, "version": "5.3"},
                        "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
                        "content": {"code": code, "silent": False, "store_history": False,
                                    "user_expressions": {}, "allow_stdin": False}}))
    printed, deadline = [], time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        message = json.loads(ws.recv())
        if message.get("parent_header", {}).get("msg_id") != msg_id:
            continue
        kind, content = message["msg_type"], message["content"]
        if kind == "stream":
            printed.append(content["text"])
        elif kind == "error":
            raise WorkshopError(f"Cell {number} failed in kernel {kernel}: {content['ename']}: {content['evalue']}.",
                                "install the kit into the kernel's environment (pip install -e . there).")
        elif kind == "status" and content.get("execution_state") == "idle":
            return "".join(printed)
    raise WorkshopError(f"Cell {number} did not finish within {timeout_s:g} s in kernel {kernel}.",
                        "run it in JupyterLab to see where it waits.")


def check_proxy(server: str, token: str, port: int, expect: str = "") -> int:
    """The status of ``<server>/proxy/<port>/``; one line when jupyter-server-proxy is missing or nothing listens."""
    url = f"{server}/proxy/{port}/"
    status, text = _request(url, token)
    if status == 404:
        raise WorkshopError(f"{url} answered 404: the portal's servers have no jupyter-server-proxy.",
                            "pip install jupyter-server-proxy into the environment the servers run in, and restart "
                            "the servers.")
    if status >= 500:
        raise WorkshopError(f"{url} answered {status}: nothing on the attendee's node listens on port {port}.",
                            f"start the tool there first, e.g. tensorboard --logdir runs/ --port {port}.")
    if expect and expect not in text:
        raise WorkshopError(f"{url} answered {status}, but not with {expect!r}.",
                            "check which program listens on that port.")
    return status


def check_portal(hub: str, user: str, token: str, cells=("import workshop_utils",), tensorboard_port=None,
                 display_name: str = KERNEL_DISPLAY_NAME, say=None) -> list[str]:
    """Every check in order, one line each (also handed to ``say`` as it passes); WorkshopError at the first problem."""
    said = []

    def passed(line: str) -> None:
        said.append(f"ok  {line}")
        if say:
            say(said[-1])

    hub = hub.rstrip("/")
    server = server_url(hub, user, token)
    passed(f"{user}'s server runs at {server}")
    kernel, default = find_kernel(server, token, display_name)
    passed(f"kernel \"{display_name}\" ({kernel}) offered" + (", the default for new notebooks" if default
                                                                else "; not the default for new notebooks"))
    run_cells(server, token, kernel, list(cells))
    passed(f"{len(cells)} cell(s) ran in it through the kernel's websocket")
    if tensorboard_port:
        check_proxy(server, token, tensorboard_port, expect="TensorBoard")
        passed(f"TensorBoard answers at {server}/proxy/{tensorboard_port}/")
    return said


@exit_on_workshop_error
def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m workshop_utils.portal_check", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hub", required=True, help="the portal's address, e.g. https://portal.example.org")
    parser.add_argument("--user", required=True, help="the attendee whose running server is checked")
    parser.add_argument("--token", required=True, help="a hub API token that may reach that server")
    parser.add_argument("--tensorboard-port", type=int, help="also fetch TensorBoard through <server>/proxy/PORT/")
    parser.add_argument("--cell", action="append", help="code to run in the kernel (repeatable; default: "
                                                        "import workshop_utils)")
    args = parser.parse_args(argv)
    check_portal(args.hub, args.user, args.token, tuple(args.cell or ("import workshop_utils",)),
                 args.tensorboard_port, say=lambda line: print(line, flush=True))


if __name__ == "__main__":
    main()
