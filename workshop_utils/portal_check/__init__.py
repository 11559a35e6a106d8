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
The arguments are checked before any request (an address with its http:// or https://, a user name
JupyterHub allows, a token of printable characters), and every answer is read as what it may be: another
web server, a proxy's error page, a redirect, silence, a certificate this machine does not trust. The
token is sent to the hub's address only (a redirect elsewhere is not followed) and never printed.
A self-signed portal is checked with its certificate trusted for this run: ``SSL_CERT_FILE=portal.pem``.
"""

# The docstring above is the command's --help. The parts: arguments (checked before any request, and the
# parser), answers (what a server sent, read defensively), kernel (one cell through the websocket); here, the
# requests themselves and the checks in order. Every request goes through _open, so a test can stand in for
# the network in one place.

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import re
import urllib.error
import urllib.parse
import urllib.request

from ..system.errors import OneLineParser, WorkshopError, exit_on_workshop_error
from .answers import (EXAMPLE, NOT_A_HUB, PROXY_PAGE, Answer, clean, describe, host_port, json_of, message_of,
                      no_answer, not_expected, origin, redirected, scrub)
from .arguments import (MAX_TIMEOUT_S, TokenSafeParser, check_hub_address, check_port, check_timeout, check_token,
                        check_user_name, port_flag, seconds_flag)
from .kernel import execute

# What was defined here before the check was split into a package; importers keep this one path.
__all__ = ["EXAMPLE", "KERNEL_DISPLAY_NAME", "KERNEL_NAME", "MAX_TIMEOUT_S", "NOT_A_HUB", "PROXY_PAGE", "REGISTER",
           "TIMEOUT_S", "request", "Answer", "WorkshopError", "build_parser", "check_hub_address", "check_port", "check_portal",
           "check_proxy", "check_timeout", "check_token", "check_user_name", "describe", "find_kernel", "hub_version",
           "kernel_socket", "main", "run_cells", "server_url"]

KERNEL_DISPLAY_NAME = "HPC DL workshop"
KERNEL_NAME = "hpc-dl-workshop"
REGISTER = (f"register it for every user in the environment the servers run in: python -m ipykernel install "
            f"--prefix <that environment> --name {KERNEL_NAME} --display-name \"{KERNEL_DISPLAY_NAME}\"")
TIMEOUT_S = 30.0  # each HTTP request, and each wait for a byte of its answer
_MAX_ANSWER_BYTES = 16 << 20  # an answer longer than this is cut: no API answer of the hub's is that long


class _SameOriginRedirects(urllib.request.HTTPRedirectHandler):
    """Follows a redirect only within the address asked (scheme, host and port): the token goes nowhere else."""

    max_redirections = 5

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        if origin(newurl) != origin(req.full_url):
            return None  # urlopen raises HTTPError with this 3xx status; _fetch names where it pointed
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def _open(request: urllib.request.Request, timeout_s: float):
    """One HTTP exchange: (status, headers, body, the URL that answered). An error status is an answer too; a
    redirect that is not followed, and every failure to get an answer, raise what urllib raises."""
    opener = urllib.request.build_opener(_SameOriginRedirects)  # built per request: proxy settings as they are now
    try:
        with opener.open(request, timeout=timeout_s) as response:
            return response.status, response.headers, response.read(_MAX_ANSWER_BYTES), response.url
    except urllib.error.HTTPError as err:
        if 300 <= err.code < 400:
            raise
        with err:
            return err.code, err.headers, err.read(_MAX_ANSWER_BYTES), err.url


def _fetch(url: str, token: str, method: str = "GET", body: dict | None = None, timeout_s: float = TIMEOUT_S,
           expected: str = "the JupyterHub API") -> Answer:
    """One request with the token; anything but an HTTP answer from the address asked is one line."""
    data = json.dumps(body).encode() if body is not None else None
    try:
        request = urllib.request.Request(url, data=data, method=method,
                                         headers={"Authorization": f"token {token}",
                                                  "Content-Type": "application/json"})
        status, headers, raw, final_url = _open(request, timeout_s)
    except urllib.error.HTTPError as err:  # a redirect not followed: a loop, or to another address
        problem = redirected(url, err, expected)
        with contextlib.suppress(Exception):
            err.close()
        raise problem from None
    except (urllib.error.URLError, OSError, http.client.HTTPException, ValueError) as err:
        raise no_answer(url, err, timeout_s, expected, token) from None
    content_type = (headers.get("Content-Type", "") if headers is not None else "") or ""
    return Answer(url, int(status), str(content_type), bytes(raw or b"").decode("utf-8", errors="replace"),
                  str(final_url or ""))


def request(url: str, token: str, method: str = "GET", body: dict | None = None, timeout_s: float = TIMEOUT_S):
    """(status, text) of one HTTP request with the token; no answer from the address is one line."""
    answer = _fetch(url, token, method, body, timeout_s)
    return answer.status, answer.text


def hub_version(hub: str, token: str, timeout_s: float = TIMEOUT_S) -> str:
    """JupyterHub's version from ``<hub>/hub/api``; one line when no JupyterHub answers there."""
    answer = _fetch(f"{hub}/hub/api", token, timeout_s=timeout_s)
    value = json_of(answer)
    if answer.status == 200 and isinstance(value, dict) and isinstance(value.get("version"), str):
        return clean(value["version"], 40)
    if answer.status in (502, 503, 504) and value is None:
        raise not_expected(answer, "the JupyterHub API", PROXY_PAGE)
    if isinstance(value, dict) and answer.status == 200:
        raise WorkshopError(f"{answer.url} answered JSON without JupyterHub's version ({describe(answer)}) where the "
                            "JupyterHub API was expected.", NOT_A_HUB)
    raise not_expected(answer, "the JupyterHub API", NOT_A_HUB)


def server_url(hub: str, user: str, token: str, timeout_s: float = TIMEOUT_S) -> str:
    """The attendee's running server, as the hub's proxy serves it; one line if it is not running."""
    answer = _fetch(f"{hub}/hub/api/users/{urllib.parse.quote(user, safe='@')}", token, timeout_s=timeout_s,
                    expected=f"the hub's record of user {user}")
    value = json_of(answer)
    scopes = ("use a token that may read the user and reach the server (scopes read:users, read:servers, "
              "access:servers): the hub's Token page, or `jupyterhub token`.")
    if answer.status in (401, 403) and isinstance(value, dict):
        raise WorkshopError(f"The hub refused the token at {answer.url} ({answer.status}: {message_of(answer)}).",
                            scopes)
    if answer.status == 404 and isinstance(value, dict):
        raise WorkshopError(f"The hub has no user {user!r} that this token may see ({answer.url} answered 404: "
                            f"{message_of(answer)}).",
                            "check --user (the name the attendee logs in with, in lower case) and that the token "
                            "may read users (scope read:users).")
    if answer.status in (502, 503, 504) and value is None:
        raise not_expected(answer, f"the hub's record of user {user}", PROXY_PAGE)
    if answer.status != 200 or not isinstance(value, dict) or not any(k in value for k in ("name", "kind", "servers")):
        raise not_expected(answer, f"the hub's record of user {user}",
                           "check --hub (the hub's own address) and that the token may read users (scope "
                           "read:users).")
    if "servers" not in value:
        raise WorkshopError(f"The hub's record of user {user} lists no servers: the token may not read them.",
                            "give the token the scope read:servers (or admin:servers) as well.")
    servers = value.get("servers") or {}
    server = servers.get("") if isinstance(servers, dict) else None
    if not isinstance(server, dict) or not server.get("ready"):
        raise WorkshopError(f"User {user} has no running server on the portal.",
                            f"log in as {user} and start one (or POST {hub}/hub/api/users/{user}/server).")
    path = server.get("url")
    if not isinstance(path, str) or not path.strip():
        raise WorkshopError(f"The hub's record of user {user} gives its running server no address "
                            f"({describe(answer)}).", "check the hub's log for that server; restart it.")
    try:
        server = urllib.parse.urljoin(hub + "/", path.strip()).rstrip("/")
    except ValueError:
        server = ""
    if origin(server) is None or not server.startswith(("http://", "https://")) or not clean(server) == server:
        raise WorkshopError(f"The hub's record of user {user} gives its running server an address no request can go "
                            f"to ({clean(path, 80)!r}).", "check the hub's configuration (base_url, public_url).")
    if origin(server) != origin(hub):
        raise WorkshopError(f"The hub's record of user {user} puts its server at {host_port(server)}, not at the hub's "
                            f"{host_port(hub)}: the token is sent to the hub's address only, so that server is not "
                            "checked.", "attendees reach their server through the hub's proxy: check the hub's "
                                        "configuration (public_url), or give --hub the address attendees use.")
    return server


def find_kernel(server: str, token: str, display_name: str = KERNEL_DISPLAY_NAME,
                timeout_s: float = TIMEOUT_S) -> tuple[str, bool]:
    """(the kernel's name, whether it is the default for new notebooks); one line if the portal lacks it."""
    expected = "the Jupyter server's kernel list"
    answer = _fetch(f"{server}/api/kernelspecs", token, timeout_s=timeout_s, expected=expected)
    value = json_of(answer)
    if answer.status >= 400 and isinstance(value, dict):
        raise WorkshopError(f"{expected[0].upper() + expected[1:]}: {answer.url} answered {answer.status} "
                            f"({message_of(answer)}).",
                            "check that the token may reach the user's server (scope access:servers).")
    specs = value.get("kernelspecs") if isinstance(value, dict) else None
    if answer.status != 200 or not isinstance(specs, dict):
        raise not_expected(answer, expected, "check that the hub's proxy routes /user/<name>/ to the attendee's "
                                             "Jupyter server (jupyterhub-singleuser), and that it runs.")
    names = {}
    for name, spec in specs.items():
        inner = spec.get("spec") if isinstance(spec, dict) else None
        shown = inner.get("display_name") if isinstance(inner, dict) else None
        if isinstance(shown, str):
            names[shown] = name
    if display_name not in names:
        offered = ", ".join(clean(n, 40) for n in sorted(names)) or "none"
        raise WorkshopError(f"The portal offers no kernel named \"{display_name}\" (it offers: "
                            f"{clean(offered, 300)}).", REGISTER)
    return names[display_name], value.get("default") == names[display_name]


@contextlib.contextmanager
def kernel_socket(server: str, token: str, kernel: str, path: str | None = None, timeout_s: float = 120):
    """A started ``kernel``'s websocket, shut down at the end; one line when it does not start or connect.

    With ``path`` (a notebook's path under the server's root) it is started as JupyterLab starts a notebook's
    kernel, through the sessions API: in the notebook's folder, so that runs/ lands beside it.
    """
    import websocket  # websocket-client, a dependency of jupyter_server

    if path is None:
        answer = _fetch(f"{server}/api/kernels", token, method="POST", body={"name": kernel}, timeout_s=timeout_s,
                        expected="the Jupyter server's kernels API")
    else:
        answer = _fetch(f"{server}/api/sessions", token, method="POST", timeout_s=timeout_s,
                        body={"path": path, "name": path, "type": "notebook", "kernel": {"name": kernel}},
                        expected="the Jupyter server's sessions API")
    value = json_of(answer)
    if answer.status >= 400:
        raise WorkshopError(f"Kernel {kernel} is registered but does not start: {message_of(answer)}.",
                            f"check its kernel.json (jupyter kernelspec list); {REGISTER}")
    record = value.get("kernel") if path is not None and isinstance(value, dict) else value
    kernel_id = record.get("id") if isinstance(record, dict) else None
    if not isinstance(kernel_id, str) or not re.fullmatch(r"[A-Za-z0-9_-]+", kernel_id):
        raise not_expected(answer, "a started kernel's record", "check that the hub's proxy routes /user/<name>/ "
                                                                "to the attendee's Jupyter server.")
    ended = (f"{server}/api/sessions/{value['id']}" if path is not None and isinstance(value.get("id"), str)
             else f"{server}/api/kernels/{kernel_id}")
    socket_url = "ws" + server[len("http"):] + f"/api/kernels/{kernel_id}/channels"
    try:
        try:
            # No redirect followed: the token goes to the hub's address only.
            ws = websocket.create_connection(socket_url, header=[f"Authorization: token {token}"], timeout=timeout_s,
                                             redirect_limit=0)
        except (OSError, websocket.WebSocketException, ValueError) as err:
            raise WorkshopError(f"Kernel {kernel} started but its websocket did not open "
                                f"({scrub(clean(str(err) or type(err).__name__), token)}).",
                                "check that the proxy passes websockets (configurable-http-proxy does).") from None
        try:
            yield ws
        finally:
            try:
                ws.close()
            except Exception:  # noqa: BLE001 -- a socket already gone is closed enough
                pass
    finally:
        try:
            _fetch(ended, token, method="DELETE", timeout_s=timeout_s)
        except WorkshopError:
            pass  # the kernel's shutdown is a courtesy: the problem already found is the one to tell


def run_cells(server: str, token: str, kernel: str, cells: list[str], timeout_s: float = 120) -> list[str]:
    """Start ``kernel`` on the server, run ``cells`` one by one through its websocket, shut it down.

    Returns each cell's printed output; a cell that raises is one line with its exception.
    """
    with kernel_socket(server, token, kernel, timeout_s=timeout_s) as ws:
        return [execute(ws, code, number, kernel, timeout_s) for number, code in enumerate(cells, 1)]


def check_proxy(server: str, token: str, port: int, expect: str = "", timeout_s: float = TIMEOUT_S) -> int:
    """The status of ``<server>/proxy/<port>/``; one line when jupyter-server-proxy is missing or nothing listens."""
    url = f"{server}/proxy/{check_port(port)}/"
    answer = _fetch(url, token, timeout_s=timeout_s, expected=f"the web tool on port {port}")
    status, text = answer.status, answer.text
    if status == 404:
        raise WorkshopError(f"{url} answered 404: the portal's servers have no jupyter-server-proxy.",
                            "pip install jupyter-server-proxy into the environment the servers run in, and restart "
                            "the servers.")
    if status >= 500:
        raise WorkshopError(f"{url} answered {status}: nothing on the attendee's node listens on port {port}.",
                            f"start the tool there first, e.g. tensorboard --logdir runs/ --port {port}.")
    if expect and expect not in text:
        raise WorkshopError(f"{url} answered {status}, but not with {expect!r} ({describe(answer)}).",
                            "check which program listens on that port.")
    return status


def check_portal(hub: str, user: str, token: str, cells=("import workshop_utils",), tensorboard_port=None,
                 display_name: str = KERNEL_DISPLAY_NAME, say=None, timeout_s: float = TIMEOUT_S) -> list[str]:
    """Every check in order, one line each (also handed to ``say`` as it passes); WorkshopError at the first problem.

    The arguments are checked first, before any request.
    """
    hub, user, token = check_hub_address(hub), check_user_name(user), check_token(token)
    timeout_s = check_timeout(timeout_s)
    if tensorboard_port is not None:
        check_port(tensorboard_port)
    if isinstance(cells, str) or not all(isinstance(cell, str) for cell in cells):
        raise WorkshopError("cells must be a list of code strings.", "pass e.g. cells=['import workshop_utils'].")
    cells = list(cells)
    said = []

    def passed(line: str) -> None:
        said.append(f"ok  {line}")
        if say:
            say(said[-1])

    version = hub_version(hub, token, timeout_s)
    server = server_url(hub, user, token, timeout_s)
    passed(f"{user}'s server runs at {server} (JupyterHub {version})")
    kernel, default = find_kernel(server, token, display_name, timeout_s)
    passed(f"kernel \"{display_name}\" ({kernel}) offered" + (", the default for new notebooks" if default
                                                                else "; not the default for new notebooks"))
    run_cells(server, token, kernel, cells, timeout_s=max(120.0, timeout_s))
    passed(f"{len(cells)} cell(s) ran in it through the kernel's websocket")
    if tensorboard_port:
        check_proxy(server, token, tensorboard_port, expect="TensorBoard", timeout_s=timeout_s)
        passed(f"TensorBoard answers at {server}/proxy/{tensorboard_port}/")
    return said


def build_parser() -> OneLineParser:
    parser = TokenSafeParser(prog="python -m workshop_utils.portal_check", description=__doc__, allow_abbrev=False,
                             formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hub", required=True, help="the portal's address, e.g. https://portal.example.org")
    parser.add_argument("--user", required=True, help="the attendee whose running server is checked")
    parser.add_argument("--token", required=True, help="a hub API token that may reach that server (never printed)")
    parser.add_argument("--tensorboard-port", type=port_flag, metavar="PORT",
                        help="also fetch TensorBoard through <server>/proxy/PORT/")
    parser.add_argument("--cell", action="append", help="code to run in the kernel (repeatable; default: "
                                                        "import workshop_utils)")
    parser.add_argument("--timeout", type=seconds_flag, default=TIMEOUT_S, metavar="SECONDS",
                        help=f"how long each request may wait for an answer (default: {TIMEOUT_S:g})")
    return parser


@exit_on_workshop_error
def main(argv=None) -> None:
    args = build_parser().parse_args(argv)
    # A server's own words can hold the token (an error page that echoes the request): never printed.
    try:
        check_portal(args.hub, args.user, args.token, tuple(args.cell or ("import workshop_utils",)),
                     args.tensorboard_port, say=lambda line: print(scrub(line, args.token), flush=True),
                     timeout_s=args.timeout)
    except WorkshopError as err:
        raise WorkshopError(scrub(err.problem, args.token), err.fix and scrub(err.fix, args.token)) from None
