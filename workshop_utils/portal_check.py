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

from __future__ import annotations

import argparse
import contextlib
import http.client
import ipaddress
import json
import math
import re
import socket
import ssl
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from dataclasses import dataclass

from .system.errors import OneLineParser, WorkshopError, exit_on_workshop_error

KERNEL_DISPLAY_NAME = "HPC DL workshop"
KERNEL_NAME = "hpc-dl-workshop"
REGISTER = (f"register it for every user in the environment the servers run in: python -m ipykernel install "
            f"--prefix <that environment> --name {KERNEL_NAME} --display-name \"{KERNEL_DISPLAY_NAME}\"")
TIMEOUT_S = 30.0  # each HTTP request, and each wait for a byte of its answer
EXAMPLE = "e.g. --hub https://portal.example.org"
_MAX_ANSWER_BYTES = 16 << 20  # an answer longer than this is cut: no API answer of the hub's is that long
_HOST_LABEL = re.compile(r"^[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?$", re.IGNORECASE)
_PLAIN_HTTP_ON_TLS = ("WRONG_VERSION_NUMBER", "record layer failure", "packet length too long", "HTTP_REQUEST",
                      "http request", "UNKNOWN_PROTOCOL", "unknown protocol")


# ---------------------------------------------------------------- the arguments, before any request


def check_hub_address(hub) -> str:
    """The hub's address as requests use it (scheme and host checked, no trailing /); one line if it cannot be."""
    if not isinstance(hub, str) or not hub:
        raise WorkshopError("--hub is empty.", f"give the address attendees open to log in, {EXAMPLE}.")
    shown = repr(hub)
    if any(c.isspace() or not c.isprintable() for c in hub):
        raise WorkshopError(f"--hub {shown} holds a space or a control character.",
                            f"give the address alone, {EXAMPLE}.")
    if "://" not in hub or hub.startswith("://"):
        bare = hub.split("://", 1)[-1].lstrip("/:")
        raise WorkshopError(f"--hub {shown} has no scheme (http:// or https://), so no request can go to it.",
                            f"write the address in full: --hub https://{bare} (or http://{bare} for a hub "
                            "without TLS).")
    try:
        parts = urllib.parse.urlsplit(hub)
        port = parts.port
    except ValueError as err:
        raise WorkshopError(f"--hub {shown} is not a web address: {_clean(str(err))}.",
                            f"give the hub's address, with a port from 1 to 65535 if any, {EXAMPLE}.") from None
    scheme = parts.scheme.lower()
    rest = hub.split("://", 1)[1]
    if scheme not in ("http", "https"):
        raise WorkshopError(f"--hub {shown} uses {parts.scheme}://, but a JupyterHub answers http:// or https:// only.",
                            f"use --hub https://{rest} (or http://{rest} for a hub without TLS).")
    if "@" in parts.netloc:
        raise WorkshopError(f"--hub {shown} holds a user name or password (before the @).",
                            "give the address without it: the token (--token) is what the check logs in with.")
    host = parts.hostname
    if not host:
        raise WorkshopError(f"--hub {shown} has no host name.", f"give the hub's host after {scheme}://, {EXAMPLE}.")
    if port == 0:
        raise WorkshopError(f"--hub {shown} names port 0, where nothing can listen.",
                            "give the hub's port (1 to 65535), or none for the scheme's own (443 for https).")
    if ":" in host:  # an IPv6 literal, in brackets in the address
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise WorkshopError(f"--hub {shown}: [{host}] is not an IPv6 address.",
                                "write an IPv6 address in brackets, e.g. --hub http://[::1]:8000.") from None
        netloc = f"[{host}]"
    else:
        try:
            ascii_host = host.encode("idna").decode("ascii")
        except UnicodeError:
            ascii_host = ""
        labels = ascii_host.rstrip(".").split(".")
        if not ascii_host or len(ascii_host) > 253 or not all(_HOST_LABEL.match(label) for label in labels):
            raise WorkshopError(f"--hub {shown}: {host!r} is not a host name.",
                                f"give the hub's host name or IP address, {EXAMPLE}.")
        netloc = ascii_host
    if port is not None:
        netloc += f":{port}"
    if "?" in hub or "#" in hub:
        raise WorkshopError(f"--hub {shown} holds a query or fragment (? or #).",
                            f"give the hub's address alone, {EXAMPLE}.")
    segments = [s for s in parts.path.split("/") if s]
    for index, segment in enumerate(segments):
        if segment in ("hub", "user"):
            base = f"{scheme}://{netloc}" + "".join("/" + s for s in segments[:index])
            raise WorkshopError(f"--hub {shown} goes past the hub's address into its /{segment}/ pages.",
                                f"give the address attendees open, without /{segment}/...: --hub {base}.")
    path = urllib.parse.quote(parts.path, safe="/%:@!$&'()*+,;=-._~")
    return f"{scheme}://{netloc}{path}".rstrip("/")


def check_user_name(user) -> str:
    """``user`` if JupyterHub allows it as a user name (as its Authenticator does); one line if not."""
    fix = "give the name the attendee logs in with (the hub's Admin page lists every user)."
    if not isinstance(user, str) or not user:
        raise WorkshopError("--user is empty.", fix)
    shown = repr(user)
    if any(not c.isprintable() for c in user):
        raise WorkshopError(f"--user {shown} holds a control character, which no JupyterHub user name has.", fix)
    if user != user.strip():
        raise WorkshopError(f"--user {shown} begins or ends with a space, which JupyterHub does not allow.", fix)
    if "/" in user:
        raise WorkshopError(f"--user {shown} holds a /, which JupyterHub does not allow in a user name.", fix)
    if set(user) == {"."} or set(urllib.parse.unquote(user)) == {"."}:
        raise WorkshopError(f"--user {shown} is only dots, which JupyterHub does not allow as a user name.", fix)
    if user != user.lower():
        raise WorkshopError(f"--user {shown} has capitals, but JupyterHub keeps user names in lower case (it "
                            "lower-cases what attendees type at login).", f"use --user {user.lower()!r}.")
    return user


def check_token(token) -> str:
    """``token`` if it can be sent in a header; one line (never showing it) if not."""
    fix = "pass a hub API token (the hub's Token page, or `jupyterhub token`), copied whole and alone."
    if not isinstance(token, str) or not token:
        raise WorkshopError("--token is empty.", fix)
    if not (token.isascii() and token.isprintable()) or " " in token:
        raise WorkshopError("The --token value holds a space, a control character or a character outside ASCII: "
                            "no hub token does.", fix)
    return token


def check_port(port) -> int:
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise WorkshopError(f"Port {port!r} is not a TCP port.", "give a port from 1 to 65535, e.g. 6006 for "
                                                                 "TensorBoard.")
    return port


MAX_TIMEOUT_S = 86_400.0  # a day: more is a mistake, and past about 9e9 s the socket layer cannot hold it


def check_timeout(timeout_s) -> float:
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not (
            math.isfinite(timeout_s) and 0 < timeout_s <= MAX_TIMEOUT_S):
        raise WorkshopError(f"Timeout {timeout_s!r} is not a number of seconds above 0 and at most "
                            f"{MAX_TIMEOUT_S:,.0f}.", "use e.g. --timeout 30.")
    return float(timeout_s)


# ---------------------------------------------------------------- one request, its answer read defensively


@dataclass
class Answer:
    """What one request got: its status, content type and text (cut at 16 MiB)."""

    url: str
    status: int
    content_type: str
    text: str
    final_url: str = ""  # where a redirect within the hub's address led, if it did


class _SameOriginRedirects(urllib.request.HTTPRedirectHandler):
    """Follows a redirect only within the address asked (scheme, host and port): the token goes nowhere else."""

    max_redirections = 5

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        if _origin(newurl) != _origin(req.full_url):
            return None  # urlopen raises HTTPError with this 3xx status; _fetch names where it pointed
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def _origin(url: str):
    try:
        parts = urllib.parse.urlsplit(url)
        return parts.scheme.lower(), parts.hostname, parts.port or {"http": 80, "https": 443}.get(parts.scheme.lower())
    except ValueError:
        return None


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
        problem = _redirected(url, err, expected)
        with contextlib.suppress(Exception):
            err.close()
        raise problem from None
    except (urllib.error.URLError, OSError, http.client.HTTPException, ValueError) as err:
        raise _no_answer(url, err, timeout_s, expected, token) from None
    content_type = (headers.get("Content-Type", "") if headers is not None else "") or ""
    return Answer(url, int(status), str(content_type), bytes(raw or b"").decode("utf-8", errors="replace"),
                  str(final_url or ""))


def _request(url: str, token: str, method: str = "GET", body: dict | None = None, timeout_s: float = TIMEOUT_S):
    """(status, text) of one HTTP request with the token; no answer from the address is one line."""
    answer = _fetch(url, token, method, body, timeout_s)
    return answer.status, answer.text


def _where(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    port = parts.port or {"http": 80, "https": 443}.get(parts.scheme, "")
    host = f"[{parts.hostname}]" if ":" in (parts.hostname or "") else parts.hostname
    return f"{host}:{port}"


def _base_of(url: str) -> str | None:
    """The hub's address in a URL of its pages (what comes before /hub/ or /user/), if it has one."""
    parts = urllib.parse.urlsplit(url)
    for marker in ("/hub/", "/user/"):
        at = (parts.path + "/").find(marker)
        if at >= 0:
            return f"{parts.scheme}://{parts.netloc}{parts.path[:at]}"
    return None


def _redirected(url: str, err: urllib.error.HTTPError, expected: str) -> WorkshopError:
    try:
        location = (err.headers.get("Location") or err.headers.get("URI") or "") if err.headers is not None else ""
        target = _clean(urllib.parse.urljoin(url, location), 200) if location else ""
    except ValueError:
        target = ""
    if "infinite loop" in str(err.msg):
        return WorkshopError(f"{url} answered with redirects in a loop ({err.code}, last to {target or 'nowhere'}) "
                             f"where {expected} was expected.",
                             "check --hub: ask the hub itself, not a login page or proxy in front of it that "
                             "redirects every request (its log shows the loop).")
    if not target:
        return WorkshopError(f"{url} answered {err.code}, a redirect to nowhere, where {expected} was expected.",
                             NOT_A_HUB)
    base = _base_of(target)
    elsewhere = _origin(target) != _origin(url)
    return WorkshopError(f"{url} redirected ({err.code}) to {target} where {expected} was expected"
                         + ("; the check does not send the token to another address." if elsewhere else "."),
                         f"use the address it points to: --hub {base}." if base else
                         "check --hub: give the address attendees end up at in a browser.")


def _no_answer(url: str, err: Exception, timeout_s: float, expected: str, token: str) -> WorkshopError:
    reason = err.reason if isinstance(err, urllib.error.URLError) else err
    where, host = _where(url), urllib.parse.urlsplit(url).hostname
    tls = url.lower().startswith("https:")
    plain = "http://" + url.split("://", 1)[-1]
    if isinstance(reason, ssl.SSLCertVerificationError):
        return WorkshopError(f"{where} answered TLS with a certificate this machine does not trust "
                             f"({_clean(reason.verify_message or str(reason))}), so {url} was not asked for "
                             f"{expected}.",
                             "trust the portal's certificate for this check: SSL_CERT_FILE=<its CA certificate, "
                             "or the self-signed certificate itself, as .pem> python -m workshop_utils.portal_check "
                             "...; better, give the portal a certificate from a trusted authority.")
    if isinstance(reason, ssl.SSLError):
        text = str(reason)
        if any(marker in text for marker in _PLAIN_HTTP_ON_TLS):
            return WorkshopError(f"{where} answers plain HTTP, not TLS, where {url} expected {expected} over https.",
                                 f"use http:// (--hub {_base_of(plain) or plain}), or the hub's TLS port.")
        return WorkshopError(f"The TLS handshake with {where} failed ({_clean(text)}) where {url} expected {expected}.",
                             "check that the address is the hub's https:// one, and that its certificate and TLS "
                             "version suit this machine's OpenSSL.")
    if isinstance(reason, socket.gaierror):
        return WorkshopError(f"The host name {host} does not resolve ({_clean(reason.strerror or str(reason))}), so "
                             f"nothing was asked at {url}.",
                             f"check the spelling of --hub, and that this machine's DNS knows it "
                             f"(getent hosts {host}).")
    if isinstance(reason, ConnectionRefusedError):
        return WorkshopError(f"Nothing listens at {where} (connection refused) where {url} expected {expected}.",
                             "check --hub's port (https: 443, http: 80, unless given), and that the hub runs there "
                             "(its service's status and log).")
    if isinstance(reason, TimeoutError):
        return WorkshopError(f"{url} did not answer within {timeout_s:g} s where {expected} was expected.",
                             "check the address (a firewall that drops the connection looks like this) and that the "
                             "hub is not overloaded; --timeout SECONDS waits longer.")
    if isinstance(reason, (ConnectionResetError, http.client.HTTPException, ConnectionAbortedError, EOFError)):
        detail = _clean(type(reason).__name__ + (f": {reason}" if str(reason) else ""))
        return WorkshopError(f"{where} closed the connection or answered something that is not HTTP ({detail}) where "
                             f"{url} expected {expected}.",
                             "check --hub's address and port" + ("" if tls else
                                                                 "; if the hub serves TLS there, use https://") + ".")
    if isinstance(reason, OSError):
        return WorkshopError(f"{url} did not answer ({_scrub(_clean(str(reason)), token)}) where {expected} was "
                             "expected.", "check the hub's address and that the hub is running.")
    return WorkshopError(f"No request could go to {url} ({_scrub(_clean(str(reason)), token)}).",
                         f"check --hub, {EXAMPLE}.")


def _clean(text: str, limit: int = 120) -> str:
    """Text from elsewhere, fit for one line: whitespace collapsed, control characters dropped, cut short."""
    text = " ".join("".join(c if c.isprintable() else " " for c in str(text)).split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _scrub(text: str, token: str) -> str:
    return text.replace(token, "<token>") if token else text


def describe(answer: Answer) -> str:
    """What an answer holds, in words: an HTML page and its title, nothing, JSON, or the start of its text."""
    text = answer.text.strip()
    if not text:
        return "an empty answer"
    head = text[:2000].lower()
    if "html" in answer.content_type.lower() or head.startswith(("<!doctype html", "<html")) or "<html" in head:
        title = re.search(r"<title[^>]*>(.*?)</title", text[:20000], re.IGNORECASE | re.DOTALL)
        title = _clean(title.group(1), 80) if title else ""
        return f"an HTML page titled {title!r}" if title else "an HTML page"
    try:
        json.loads(text)
    except (ValueError, RecursionError):
        return f"text starting {_clean(text, 60)!r}"
    return f"JSON {_clean(text, 60)}"


def _json(answer: Answer):
    try:
        return json.loads(answer.text)
    except (ValueError, RecursionError):  # RecursionError: JSON nested deeper than Python's stack
        return None


def _message(answer: Answer) -> str:
    """The ``message`` of a Jupyter or JupyterHub error answer, else what the answer is."""
    value = _json(answer)
    if isinstance(value, dict) and isinstance(value.get("message"), str) and value["message"].strip():
        return _clean(value["message"].strip().splitlines()[0])
    return describe(answer)


def _not_expected(answer: Answer, expected: str, fix: str) -> WorkshopError:
    led = f" (redirected to {_clean(answer.final_url, 200)})" if answer.final_url not in ("", answer.url) else ""
    return WorkshopError(f"{answer.url}{led} answered {answer.status} with {describe(answer)} where {expected} was "
                         "expected.", fix)


NOT_A_HUB = ("check --hub: it is the address attendees open to log in (where /hub/login is), " + EXAMPLE
             + "; a Jupyter server of its own, or another web server, answers here.")
PROXY_PAGE = ("a proxy in front of the hub answered for it: check that the hub runs (its service's status and log) "
              "and that the proxy forwards to it; or --hub is not the hub's address.")


# ---------------------------------------------------------------- the checks


def hub_version(hub: str, token: str, timeout_s: float = TIMEOUT_S) -> str:
    """JupyterHub's version from ``<hub>/hub/api``; one line when no JupyterHub answers there."""
    answer = _fetch(f"{hub}/hub/api", token, timeout_s=timeout_s)
    value = _json(answer)
    if answer.status == 200 and isinstance(value, dict) and isinstance(value.get("version"), str):
        return _clean(value["version"], 40)
    if answer.status in (502, 503, 504) and value is None:
        raise _not_expected(answer, "the JupyterHub API", PROXY_PAGE)
    if isinstance(value, dict) and answer.status == 200:
        raise WorkshopError(f"{answer.url} answered JSON without JupyterHub's version ({describe(answer)}) where the "
                            "JupyterHub API was expected.", NOT_A_HUB)
    raise _not_expected(answer, "the JupyterHub API", NOT_A_HUB)


def server_url(hub: str, user: str, token: str, timeout_s: float = TIMEOUT_S) -> str:
    """The attendee's running server, as the hub's proxy serves it; one line if it is not running."""
    answer = _fetch(f"{hub}/hub/api/users/{urllib.parse.quote(user, safe='@')}", token, timeout_s=timeout_s,
                    expected=f"the hub's record of user {user}")
    value = _json(answer)
    scopes = ("use a token that may read the user and reach the server (scopes read:users, read:servers, "
              "access:servers): the hub's Token page, or `jupyterhub token`.")
    if answer.status in (401, 403) and isinstance(value, dict):
        raise WorkshopError(f"The hub refused the token at {answer.url} ({answer.status}: {_message(answer)}).", scopes)
    if answer.status == 404 and isinstance(value, dict):
        raise WorkshopError(f"The hub has no user {user!r} that this token may see ({answer.url} answered 404: "
                            f"{_message(answer)}).",
                            "check --user (the name the attendee logs in with, in lower case) and that the token "
                            "may read users (scope read:users).")
    if answer.status in (502, 503, 504) and value is None:
        raise _not_expected(answer, f"the hub's record of user {user}", PROXY_PAGE)
    if answer.status != 200 or not isinstance(value, dict) or not any(k in value for k in ("name", "kind", "servers")):
        raise _not_expected(answer, f"the hub's record of user {user}",
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
    if _origin(server) is None or not server.startswith(("http://", "https://")) or not _clean(server) == server:
        raise WorkshopError(f"The hub's record of user {user} gives its running server an address no request can go "
                            f"to ({_clean(path, 80)!r}).", "check the hub's configuration (base_url, public_url).")
    if _origin(server) != _origin(hub):
        raise WorkshopError(f"The hub's record of user {user} puts its server at {_where(server)}, not at the hub's "
                            f"{_where(hub)}: the token is sent to the hub's address only, so that server is not "
                            "checked.", "attendees reach their server through the hub's proxy: check the hub's "
                                        "configuration (public_url), or give --hub the address attendees use.")
    return server


def find_kernel(server: str, token: str, display_name: str = KERNEL_DISPLAY_NAME,
                timeout_s: float = TIMEOUT_S) -> tuple[str, bool]:
    """(the kernel's name, whether it is the default for new notebooks); one line if the portal lacks it."""
    expected = "the Jupyter server's kernel list"
    answer = _fetch(f"{server}/api/kernelspecs", token, timeout_s=timeout_s, expected=expected)
    value = _json(answer)
    if answer.status >= 400 and isinstance(value, dict):
        raise WorkshopError(f"{expected[0].upper() + expected[1:]}: {answer.url} answered {answer.status} "
                            f"({_message(answer)}).",
                            "check that the token may reach the user's server (scope access:servers).")
    specs = value.get("kernelspecs") if isinstance(value, dict) else None
    if answer.status != 200 or not isinstance(specs, dict):
        raise _not_expected(answer, expected, "check that the hub's proxy routes /user/<name>/ to the attendee's "
                                              "Jupyter server (jupyterhub-singleuser), and that it runs.")
    names = {}
    for name, spec in specs.items():
        inner = spec.get("spec") if isinstance(spec, dict) else None
        shown = inner.get("display_name") if isinstance(inner, dict) else None
        if isinstance(shown, str):
            names[shown] = name
    if display_name not in names:
        offered = ", ".join(_clean(n, 40) for n in sorted(names)) or "none"
        raise WorkshopError(f"The portal offers no kernel named \"{display_name}\" (it offers: "
                            f"{_clean(offered, 300)}).", REGISTER)
    return names[display_name], value.get("default") == names[display_name]


def run_cells(server: str, token: str, kernel: str, cells: list[str], timeout_s: float = 120) -> list[str]:
    """Start ``kernel`` on the server, run ``cells`` one by one through its websocket, shut it down.

    Returns each cell's printed output; a cell that raises is one line with its exception.
    """
    import websocket  # websocket-client, a dependency of jupyter_server

    answer = _fetch(f"{server}/api/kernels", token, method="POST", body={"name": kernel}, timeout_s=timeout_s,
                    expected="the Jupyter server's kernels API")
    value = _json(answer)
    if answer.status >= 400:
        raise WorkshopError(f"Kernel {kernel} is registered but does not start: {_message(answer)}.",
                            f"check its kernel.json (jupyter kernelspec list); {REGISTER}")
    kernel_id = value.get("id") if isinstance(value, dict) else None
    if not isinstance(kernel_id, str) or not re.fullmatch(r"[A-Za-z0-9_-]+", kernel_id):
        raise _not_expected(answer, "a started kernel's record", "check that the hub's proxy routes /user/<name>/ "
                                                                 "to the attendee's Jupyter server.")
    socket_url = "ws" + server[len("http"):] + f"/api/kernels/{kernel_id}/channels"
    outputs = []
    try:
        try:
            # No redirect followed: the token goes to the hub's address only.
            ws = websocket.create_connection(socket_url, header=[f"Authorization: token {token}"], timeout=timeout_s,
                                             redirect_limit=0)
        except (OSError, websocket.WebSocketException, ValueError) as err:
            raise WorkshopError(f"Kernel {kernel} started but its websocket did not open "
                                f"({_scrub(_clean(str(err) or type(err).__name__), token)}).",
                                "check that the proxy passes websockets (configurable-http-proxy does).") from None
        try:
            for number, code in enumerate(cells, 1):
                outputs.append(_execute(ws, code, number, kernel, timeout_s))
        finally:
            try:
                ws.close()
            except Exception:  # noqa: BLE001 -- a socket already gone is closed enough
                pass
    finally:
        try:
            _fetch(f"{server}/api/kernels/{kernel_id}", token, method="DELETE", timeout_s=timeout_s)
        except WorkshopError:
            pass  # the kernel's shutdown is a courtesy: the problem already found is the one to tell
    return outputs


def _execute(ws, code: str, number: int, kernel: str, timeout_s: float) -> str:
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
            raise WorkshopError(f"The websocket of kernel {kernel} sent {_clean(repr(frame), 60)} while cell {number} "
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
            raise WorkshopError(f"Cell {number} failed in kernel {kernel}: {_clean(content.get('ename', '?'), 60)}: "
                                f"{_clean(content.get('evalue', ''), 300)}.",
                                "install the kit into the kernel's environment (pip install -e . there).")
        elif kind == "execute_reply" and content.get("status") in ("error", "aborted"):
            raise WorkshopError(f"Cell {number} {'failed' if content.get('status') == 'error' else 'was aborted'} in "
                                f"kernel {kernel} ({_clean(content.get('ename', ''), 60) or 'no error named'}).",
                                "run it in JupyterLab to see the error; install the kit into the kernel's environment.")
        elif kind == "status" and content.get("execution_state") == "idle":
            return "".join(printed)
    raise WorkshopError(f"Cell {number} did not finish within {timeout_s:g} s in kernel {kernel}.",
                        "run it in JupyterLab to see where it waits.")


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


# ---------------------------------------------------------------- the command


def _port_flag(text: str) -> int:
    try:
        return check_port(int(text))
    except (ValueError, WorkshopError):
        raise argparse.ArgumentTypeError(f"{text!r} is not a TCP port (1 to 65535)") from None


def _seconds_flag(text: str) -> float:
    try:
        return check_timeout(float(text))
    except (ValueError, WorkshopError):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds above 0") from None


class _Parser(OneLineParser):
    """The one-line parser, which never shows the token, even in a message about the flags around it."""

    secrets: tuple = ()

    def parse_args(self, args=None, namespace=None):
        argv = [str(a) for a in (sys.argv[1:] if args is None else args)]
        # The value after --token, and after any misspelling of it (--tokn), alone or after "=".
        self.secrets = tuple(value for flag, value in zip(argv, argv[1:]) if flag.lower().startswith("--tok")) + \
            tuple(a.split("=", 1)[1] for a in argv if a.lower().startswith("--tok") and "=" in a)
        return super().parse_args(argv, namespace)

    def error(self, message: str):
        for secret in sorted((s for s in self.secrets if isinstance(s, str) and s), key=len, reverse=True):
            message = message.replace(secret, "<token>")
        super().error(message)


def build_parser() -> OneLineParser:
    parser = _Parser(prog="python -m workshop_utils.portal_check", description=__doc__, allow_abbrev=False,
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hub", required=True, help="the portal's address, e.g. https://portal.example.org")
    parser.add_argument("--user", required=True, help="the attendee whose running server is checked")
    parser.add_argument("--token", required=True, help="a hub API token that may reach that server (never printed)")
    parser.add_argument("--tensorboard-port", type=_port_flag, metavar="PORT",
                        help="also fetch TensorBoard through <server>/proxy/PORT/")
    parser.add_argument("--cell", action="append", help="code to run in the kernel (repeatable; default: "
                                                        "import workshop_utils)")
    parser.add_argument("--timeout", type=_seconds_flag, default=TIMEOUT_S, metavar="SECONDS",
                        help=f"how long each request may wait for an answer (default: {TIMEOUT_S:g})")
    return parser


@exit_on_workshop_error
def main(argv=None) -> None:
    args = build_parser().parse_args(argv)
    # A server's own words can hold the token (an error page that echoes the request): never printed.
    try:
        check_portal(args.hub, args.user, args.token, tuple(args.cell or ("import workshop_utils",)),
                     args.tensorboard_port, say=lambda line: print(_scrub(line, args.token), flush=True),
                     timeout_s=args.timeout)
    except WorkshopError as err:
        raise WorkshopError(_scrub(err.problem, args.token), err.fix and _scrub(err.fix, args.token)) from None


if __name__ == "__main__":
    main()
