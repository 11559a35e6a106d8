"""Bad input to the commands: a wrong address for the portal check, and arbitrary flags for every entry.

``python -m workshop_utils.portal_check`` is what a portal administrator runs, often against the wrong
address first. The table below gives it addresses and servers that are not a JupyterHub (each started
here, on 127.0.0.1 and an ephemeral port, and stopped by the test): every one ends in one line naming what
answered where the hub's API was expected, with the fix, and exit status 2; the token never shows. A
property-based sweep then gives it arbitrary flags and arbitrary answers (the network faked), and gives
every other entry (``python -m workshop_utils.<entry>`` and ``benchmarks/*.py``) arbitrary flags: each
ends normally or in the kit's one line, never a traceback. Nothing long runs: where an entry's arguments
pass, the work behind them is replaced by a stop (``Reached``), so only the argument checks are exercised.
"""

from __future__ import annotations

import argparse
import contextlib
import email.message
import http.client
import http.server
import importlib
import importlib.util
import json
import socket
import ssl
import threading
import urllib.error
import urllib.parse
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import workshop_utils as wu
from workshop_utils import portal_check

ROOT = Path(__file__).resolve().parents[1]
USER, TOKEN = "alice", "tok-0123456789abcdef-never-printed"

# A self-signed certificate for 127.0.0.1 and localhost (EC P-256, valid until 2126): the portal behind TLS that
# this machine does not trust. Made with: openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1
# -nodes -days 36500 -subj /CN=127.0.0.1 -addext subjectAltName=IP:127.0.0.1,DNS:localhost
SELF_SIGNED_KEY = """-----BEGIN PRIVATE KEY-----
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgcYu+5xSKr4oW5oJT
Ki58hB29k0OUGV/8lX/95a7rICehRANCAARnKoqw1CmJK9h3S5LQqIm7NwkBwf+r
KeRQYCblhAm8gJGcVntsVq/jVn9dTuPLwJSsET8hVmg2D3pO4ftnZG1Y
-----END PRIVATE KEY-----
"""
SELF_SIGNED_CERT = """-----BEGIN CERTIFICATE-----
MIIBmjCCAUGgAwIBAgIUINGp8dkLfBkBjRLz5snhBqiYeCAwCgYIKoZIzj0EAwIw
FDESMBAGA1UEAwwJMTI3LjAuMC4xMCAXDTI2MTEyNjE1NDQ0M1oYDzIxMjYxMTAy
MTU0NDQzWjAUMRIwEAYDVQQDDAkxMjcuMC4wLjEwWTATBgcqhkjOPQIBBggqhkjO
PQMBBwNCAARnKoqw1CmJK9h3S5LQqIm7NwkBwf+rKeRQYCblhAm8gJGcVntsVq/j
Vn9dTuPLwJSsET8hVmg2D3pO4ftnZG1Yo28wbTAdBgNVHQ4EFgQUl2TiAbd51EZ6
q091BjQbWM1lGOEwHwYDVR0jBBgwFoAUl2TiAbd51EZ6q091BjQbWM1lGOEwDwYD
VR0TAQH/BAUwAwEB/zAaBgNVHREEEzARhwR/AAABgglsb2NhbGhvc3QwCgYIKoZI
zj0EAwIDRwAwRAIgDcDCIs4JikvonFtWpBbwC9nRBwlzsbnAoZTEok7oYqcCIAwn
OyfhG31UxiPPDAcYRZX1J/uF/n/a0XVGXqR93FPZ
-----END CERTIFICATE-----
"""


@pytest.fixture(autouse=True)
def no_proxy_variables(monkeypatch):
    """Requests to 127.0.0.1 go straight there, whatever proxy the machine's environment names."""
    for name in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)


def one_error_line(capsys, *words) -> str:
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and " Fix: " in lines[0], captured.err
    for word in words:
        assert word in lines[0], (word, lines[0])
    assert TOKEN not in captured.out + captured.err
    return lines[0]


# ---------------------------------------------------------------- loopback servers, each stopped by its test

HUB_USER = {"kind": "user", "name": USER, "servers": {"": {"ready": True, "url": f"/user/{USER}/"}}}
KERNELSPECS = {"default": "hpc-dl-workshop",
               "kernelspecs": {"hpc-dl-workshop": {"spec": {"display_name": "HPC DL workshop"}},
                               "python3": {"spec": {"display_name": "Python 3"}}}}


def json_answer(value, status: int = 200):
    return status, "application/json", json.dumps(value)


def html_answer(title: str, status: int = 200):
    return status, "text/html", f"<!DOCTYPE html><html><head><title>{title}</title></head><body>{title}</body></html>"


def fake_hub(**answers):
    """A JupyterHub's API as far as the check asks it; ``answers`` replace its answer at a path."""
    routes = {"/hub/api": json_answer({"version": "5.2.1"}), f"/hub/api/users/{USER}": json_answer(HUB_USER),
              f"/user/{USER}/api/kernelspecs": json_answer(KERNELSPECS),
              f"/user/{USER}/api/kernels": json_answer({"id": "k-1", "name": "hpc-dl-workshop"}, 201),
              f"/user/{USER}/api/kernels/k-1": (204, "text/plain", ""),
              f"/user/{USER}/proxy/6006/": html_answer("TensorBoard")}
    routes.update({path.replace("USER", USER): answer for path, answer in answers.items()})
    routes = {path.rstrip("/"): answer for path, answer in routes.items()}
    return lambda handler: routes.get(handler.path.rstrip("/"), html_answer("404 Not Found", 404))


def everywhere(status: int, content_type: str, body: str, headers=()):
    return lambda handler: (status, content_type, body, *([dict(headers)] if headers else []))


def redirect_to(location):
    return lambda handler: (302, "text/html", "", {"Location": location(handler)})


class Handler(http.server.BaseHTTPRequestHandler):
    answer = None  # set per server: handler -> (status, content type, body[, headers])

    def _reply(self):
        status, content_type, body, *more = type(self).answer(self)
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        for key, value in (more[0] if more else {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_DELETE = _reply

    def log_message(self, *args):  # the test's stderr holds the check's one line only
        pass


@contextlib.contextmanager
def serving(answer, tls_files=None):
    """An HTTP (or, with a certificate, HTTPS) server on 127.0.0.1 in a thread; yields its address."""
    handler = type("Answering", (Handler,), {"answer": staticmethod(answer)})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    server.handle_error = lambda request, address: None  # a client that hangs up or fails TLS is no test failure
    if tls_files:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(*tls_files)
        # The handshake happens in the request's thread, so that a client speaking plain HTTP cannot block the server.
        server.socket = context.wrap_socket(server.socket, server_side=True, do_handshake_on_connect=False)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"{'https' if tls_files else 'http'}://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


@contextlib.contextmanager
def silent_port():
    """A port that accepts connections (the kernel's backlog) and never answers: a hub that hangs."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"


@contextlib.contextmanager
def closed_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    yield f"http://127.0.0.1:{port}"


@pytest.fixture
def tls_files(tmp_path):
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    key.write_text(SELF_SIGNED_KEY)
    cert.write_text(SELF_SIGNED_CERT)
    return str(cert), str(key)


def run_check(capsys, *argv):
    with pytest.raises(SystemExit) as stop:
        portal_check.main(list(argv))
    assert stop.value.code == 2
    return one_error_line(capsys)


# Each row: how the address is made, how the check is called, and the words its one line must hold.
ADDRESS_ROWS = {
    "no scheme": ("localhost", ["has no scheme", "--hub https://localhost"]),
    "host:port without scheme": ("localhost:8000", ["has no scheme", "https://localhost:8000"]),
    "another scheme": ("ftp://portal.example.org", ["ftp://", "http:// or https://"]),
    "no host": ("http://", ["no host name"]),
    "port out of range": ("http://127.0.0.1:99999", ["Port out of range", "1 to 65535"]),
    "port not a number": ("http://127.0.0.1:http", ["not a web address", "port"]),
    "port 0": ("http://127.0.0.1:0", ["port 0"]),
    "credentials in the address": ("https://admin:secret@portal.example.org", ["user name or password"]),
    "the hub's own pages": ("https://portal.example.org/hub/home", ["/hub/", "--hub https://portal.example.org."]),
    "a user's server": ("https://portal.example.org/jupyter/user/alice/lab",
                        ["/user/", "--hub https://portal.example.org/jupyter."]),
    "a query": ("https://portal.example.org/?next=/hub", ["query"]),
    "a space": ("https://portal example.org", ["space or a control character"]),
    "a line break": ("https://portal.example.org\n", ["space or a control character", "\\n"]),
    "not a host name": ("https://portal..example.org", ["is not a host name"]),
    "a broken IPv6 address": ("http://[::1:8000", ["not a web address"]),
    "not IPv6 in brackets": ("http://[portal]:8000", ["not"]),
    "empty": ("", ["--hub is empty"]),
}


@pytest.mark.parametrize("hub, words", ADDRESS_ROWS.values(), ids=ADDRESS_ROWS.keys())
def test_an_address_no_request_can_go_to_is_one_line_before_any_request(hub, words, capsys, monkeypatch):
    monkeypatch.setattr(portal_check, "_open", lambda *a, **k: pytest.fail("a request was made"))
    line = run_check(capsys, "--hub", hub, "--user", USER, "--token", TOKEN)
    for word in words:
        assert word in line, (word, line)


ARGUMENT_ROWS = {
    "capitals in the user name": (["--user", "Alice"], ["lower case", "--user 'alice'"]),
    "a / in the user name": (["--user", "a/b"], ["holds a /"]),
    "a user name of dots": (["--user", ".."], ["only dots"]),
    "a user name with a space around it": (["--user", " alice"], ["begins or ends with a space"]),
    "an empty user name": (["--user", ""], ["--user is empty"]),
    "a token with a space": (["--token", TOKEN + " x"], ["--token value holds a space"]),
    "an empty token": (["--token", ""], ["--token is empty"]),
    "a port out of range": (["--tensorboard-port", "70000"], ["not a TCP port"]),
    "a port of 0": (["--tensorboard-port", "0"], ["not a TCP port"]),
    "a timeout of 0": (["--timeout", "0"], ["seconds above 0"]),
    "a timeout of nan": (["--timeout", "nan"], ["seconds above 0"]),
    "a misspelt token flag": (["--tokn", TOKEN], ["arguments are required: --token"]),
    "a misspelt flag after the token": (["--tensorbord-port", TOKEN], ["Unrecognized arguments", "<token>"]),
}


@pytest.mark.parametrize("extra, words", ARGUMENT_ROWS.values(), ids=ARGUMENT_ROWS.keys())
def test_bad_arguments_are_one_line_before_any_request(extra, words, capsys, monkeypatch):
    monkeypatch.setattr(portal_check, "_open", lambda *a, **k: pytest.fail("a request was made"))
    given = {"--hub": "http://127.0.0.1:8000", "--user": USER, "--token": TOKEN}
    for flag, value in zip(extra, extra[1:]):
        given.pop(flag, None)
    if extra[0] == "--tokn":
        given.pop("--token")
    argv = [text for pair in given.items() for text in pair] + extra
    line = run_check(capsys, *argv)
    for word in words:
        assert word in line, (word, line)


HTML_404 = html_answer("404 Not Found", 404)
SERVER_ROWS = {  # a server answering in place of the hub: (what it answers, the words)
    "a web server answering every path with a page": (everywhere(*html_answer("Welcome to nginx!")),
                                                      ["/hub/api answered 200 with an HTML page titled "
                                                       "'Welcome to nginx!'", "JupyterHub API", "--hub"]),
    "a proxy's error page": (everywhere(*html_answer("502 Bad Gateway", 502)),
                             ["answered 502 with an HTML page titled '502 Bad Gateway'",
                              "a proxy in front of the hub"]),
    "JSON that is not the hub's": (everywhere(*json_answer({"status": "ok"})),
                                   ["JSON without JupyterHub's version", "--hub"]),
    "a single-user Jupyter server": (everywhere(*json_answer({"message": "Not Found", "reason": None}, 404)),
                                     ["answered 404 with JSON", "JupyterHub API"]),
    "an empty answer": (everywhere(200, "text/plain", ""), ["an empty answer"]),
    "plain text": (everywhere(200, "text/plain", "hello\nworld"), ["text starting 'hello world'"]),
    "a redirect loop": (redirect_to(lambda h: h.path), ["redirects in a loop", "login page or proxy"]),
    "a redirect to another address": (redirect_to(lambda h: "https://127.0.0.1:1/hub/api"),
                                      ["redirected (302) to https://127.0.0.1:1/hub/api",
                                       "does not send the token", "--hub https://127.0.0.1:1."]),
    "a redirect to a login page": (lambda h: (302, "text/html", "", {"Location": "/sso/login?next=" + h.path})
                                   if h.path.startswith("/hub") else html_answer("Sign in"),
                                   ["(redirected to http://127.0.0.1:", "/sso/login?next=/hub/api) answered 200 with "
                                    "an HTML page titled 'Sign in'"]),
    "a hub without that user": (fake_hub(**{"/hub/api/users/USER": json_answer({"status": 404, "message":
                                                                                 "Not Found"}, 404)}),
                                ["has no user 'alice'", "--user"]),
    "a hub refusing the token": (fake_hub(**{"/hub/api/users/USER": json_answer(
        {"status": 403, "message": "Missing or invalid credentials"}, 403)}),
        ["refused the token", "Missing or invalid credentials", "scopes"]),
    "a hub whose user has no server running": (fake_hub(**{"/hub/api/users/USER": json_answer(
        {"kind": "user", "name": USER, "servers": {}})}), ["no running server", "log in as alice"]),
    "a token that may not read servers": (fake_hub(**{"/hub/api/users/USER": json_answer(
        {"kind": "user", "name": USER})}), ["lists no servers", "read:servers"]),
    "a hub behind a proxy that is down": (fake_hub(**{"/hub/api/users/USER": html_answer("503 Service Unavailable",
                                                                                          503)}),
                                          ["answered 503 with an HTML page", "a proxy in front of the hub"]),
    "a hub routing the server to a web page": (fake_hub(**{"/user/USER/api/kernelspecs": html_answer("Sign in")}),
                                               ["/api/kernelspecs answered 200 with an HTML page titled 'Sign in'",
                                                "kernel list"]),
    "a hub whose kernel record is not one": (fake_hub(**{"/user/USER/api/kernels": json_answer(["k-1"], 201)}),
                                             ["started kernel's record"]),
    "a server where the kernel does not start": (fake_hub(**{"/user/USER/api/kernels": json_answer(
        {"message": "No such kernel\nTraceback"}, 500)}), ["is registered but does not start: No such kernel."]),
}


@pytest.mark.parametrize("answer, words", SERVER_ROWS.values(), ids=SERVER_ROWS.keys())
def test_a_server_that_is_not_the_hub_is_one_line_naming_what_answered(answer, words, capsys):
    with serving(answer) as hub:
        line = run_check(capsys, "--hub", hub, "--user", USER, "--token", TOKEN, "--timeout", "10")
    for word in words:
        assert word in line, (word, line)


@pytest.mark.parametrize("case", ["connection refused", "timeout"])
def test_silence_is_one_line(case, capsys):
    with (closed_port() if case == "connection refused" else silent_port()) as hub:
        line = run_check(capsys, "--hub", hub, "--user", USER, "--token", TOKEN, "--timeout", "0.3")
    expected = ["Nothing listens at 127.0.0.1:", "connection refused"] if case == "connection refused" else \
        ["did not answer within 0.3 s", "--timeout SECONDS"]
    for word in expected:
        assert word in line, (word, line)


def test_tls_with_a_self_signed_certificate_is_one_line_and_its_fix_works(capsys, monkeypatch, tls_files):
    answer = fake_hub(**{"/hub/api/users/USER": json_answer({"status": 404, "message": "Not Found"}, 404)})
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    with serving(answer, tls_files) as hub:
        line = run_check(capsys, "--hub", hub, "--user", USER, "--token", TOKEN, "--timeout", "10")
        assert "certificate this machine does not trust" in line and "self" in line and "SSL_CERT_FILE" in line
        monkeypatch.setenv("SSL_CERT_FILE", tls_files[0])  # the fix the line gives: trust that certificate
        line = run_check(capsys, "--hub", hub, "--user", USER, "--token", TOKEN, "--timeout", "10")
        assert "has no user 'alice'" in line  # past TLS: the hub itself answered


def test_https_to_a_plain_http_server_and_http_to_a_tls_one_are_one_line(capsys, tls_files):
    with serving(fake_hub()) as plain:
        line = run_check(capsys, "--hub", plain.replace("http:", "https:"), "--user", USER, "--token", TOKEN,
                         "--timeout", "10")
    assert "TLS" in line and "http://" in line
    with serving(fake_hub(), tls_files) as tls:
        line = run_check(capsys, "--hub", tls.replace("https:", "http:"), "--user", USER, "--token", TOKEN,
                         "--timeout", "10")
    assert "closed the connection or answered something that is not HTTP" in line and "https://" in line


class FakeKernelSocket:
    """The kernel's websocket: every execute request runs, prints its code and goes idle."""

    def __init__(self, *args, **kwargs):
        self.replies = []

    def send(self, text):
        request = json.loads(text)
        parent = {"msg_id": request["header"]["msg_id"]}
        self.replies += [{"parent_header": {"msg_id": "someone else's"}, "msg_type": "status", "content": {}},
                         {"parent_header": parent, "msg_type": "stream",
                          "content": {"text": request["content"]["code"]}},
                         {"parent_header": parent, "msg_type": "status", "content": {"execution_state": "idle"}}]

    def recv(self):
        return json.dumps(self.replies.pop(0))

    def close(self):
        pass


def test_a_portal_that_passes_says_so_one_line_per_check(capsys, monkeypatch):
    import websocket

    monkeypatch.setattr(websocket, "create_connection", FakeKernelSocket)
    with serving(fake_hub()) as hub:
        portal_check.main(["--hub", hub + "/", "--user", USER, "--token", TOKEN, "--tensorboard-port", "6006"])
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"ok  alice's server runs at {hub}/user/alice (JupyterHub 5.2.1)"
    assert out[1].endswith("the default for new notebooks") and out[2].startswith("ok  1 cell(s) ran")
    assert out[3].startswith("ok  TensorBoard answers") and len(out) == 4


class Reached(BaseException):
    """The entry's arguments passed and its work was about to start: the sweep stops it there.

    A BaseException, so that no ``except Exception`` on the way (torchrun's error recorder) takes it."""


# ---------------------------------------------------------------- the portal check, fuzzed: flags and answers

FUZZ = settings(max_examples=200, deadline=None, database=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=12)
HUBS = st.one_of(st.sampled_from(["http://127.0.0.1:8000", "https://127.0.0.1", "http://[::1]:8000", "http://h/x",
                                  "localhost", "http://h:0", "http://h:65536", "ftp://h", "http://h/hub",
                                  "http://bücher.example", "HTTP://H", "http://h?", "http://h#x", "http://u@h",
                                  "http://" + "a" * 70 + ".org", "http://[::g]", "http://1.2.3.4:99", "://h"]),
                 TEXT, TEXT.map(lambda t: "http://" + t), TEXT.map(lambda t: "https://h:" + t))
USERS = st.one_of(st.sampled_from([USER, "Alice", "a/b", ".", "%2e%2e", "", " a", "a\tb", "alice@example.org",
                                   "é", "a b", "a?b#c"]), TEXT)
GOOD_TOKENS = st.text(alphabet="abcdef0123456789", min_size=10, max_size=20).map(lambda t: "tok-" + t)
TOKENS = st.one_of(GOOD_TOKENS, st.sampled_from(["", " ", "a b", "\n", "é"]))
FLAG_VALUES = st.one_of(
    st.tuples(st.just("--hub"), HUBS), st.tuples(st.just("--user"), USERS),
    st.tuples(st.just("--tensorboard-port"), st.one_of(st.sampled_from(["6006", "0", "-1", "65536", "x", ""]),
                                                       TEXT)),
    st.tuples(st.just("--timeout"), st.sampled_from(["1", "0", "-1", "nan", "inf", "1e-9", "x"])),
    st.tuples(st.just("--cell"), TEXT), st.tuples(st.sampled_from(["--tok", "-h2", "--", "x", "--hub=x"]), TEXT))

JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
                    max_leaves=8)


def right_and_wrong(path: str):
    """What a JupyterHub (or the user's server behind it) answers at ``path``, and a strategy of wrong versions."""
    if path.endswith("/hub/api"):
        return {"version": "5.2.1"}, st.fixed_dictionaries({"version": JSON})
    if "/hub/api/users/" in path:
        server = st.fixed_dictionaries({}, optional={"ready": JSON, "url": st.one_of(JSON, st.sampled_from(
            ["", " ", "http://elsewhere.example/user/alice/", "//evil.example/", "ftp://x/", "/user/a\nb/"]))})
        return HUB_USER, st.fixed_dictionaries({"name": st.just(USER)}, optional={"servers": st.one_of(
            st.fixed_dictionaries({"": server}), JSON)})
    if path.endswith("/api/kernelspecs"):
        return KERNELSPECS, st.fixed_dictionaries({"kernelspecs": st.one_of(JSON, st.dictionaries(
            st.text(max_size=5), st.one_of(JSON, st.fixed_dictionaries({"spec": JSON})), max_size=3))},
            optional={"default": JSON})
    if path.endswith("/api/kernels"):
        return {"id": "k-1"}, st.fixed_dictionaries({"id": st.one_of(JSON, st.just("../x"))})
    if "/proxy/" in path:
        return "<html><title>TensorBoard</title></html>", st.text(max_size=20)
    return {}, JSON


def headers_with(**fields):
    message = email.message.Message()
    for key, value in fields.items():
        message[key] = value
    return message


def failures(url: str):
    """Every way a request can fail to get an answer, as urllib raises it."""
    cert_error = ssl.SSLCertVerificationError(1, "certificate verify failed")
    cert_error.verify_message = "self-signed certificate"
    redirect = st.sampled_from(["/hub/api", "https://elsewhere.example/hub/api", "", "::", "http://[x"]).map(
        lambda location: urllib.error.HTTPError(url, 302, "Found", headers_with(Location=location), None))
    return st.one_of(st.sampled_from([
        urllib.error.URLError(cert_error), urllib.error.URLError(ssl.SSLError(1, "[SSL: WRONG_VERSION_NUMBER] x")),
        urllib.error.URLError(ssl.SSLError(1, "[SSL] handshake failure")),
        urllib.error.URLError(socket.gaierror(-2, "Name or service not known")),
        urllib.error.URLError(ConnectionRefusedError(111, "Connection refused")),
        urllib.error.URLError(TimeoutError("timed out")), TimeoutError("timed out"),
        http.client.RemoteDisconnected("Remote end closed connection without response"),
        http.client.BadStatusLine("\x15\x03\x01"), http.client.IncompleteRead(b"x"), ConnectionResetError(104, "reset"),
        urllib.error.URLError("unknown url type: x"), ValueError("Invalid header value"), OSError(5, "I/O error"),
        urllib.error.HTTPError(url, 302, "The HTTP server returned a redirect error that would lead to an infinite "
                                    "loop.\nThe last 30x error message was:\nFound",
                               headers_with(Location="/hub/api"), None)]), redirect)


def answers(url: str):
    """Mostly the right answer, so that the check gets far; else a wrong body, any status and body, or a failure."""
    path = urllib.parse.urlsplit(url).path
    right, wrong = right_and_wrong(path)
    status = 201 if path.endswith("/api/kernels") else 200
    as_body = (lambda value: value if isinstance(value, str) else json.dumps(value))
    ctype = st.sampled_from(["application/json", "text/html", "", "text/plain; charset=utf-8"])
    anything = st.tuples(st.sampled_from([200, 201, 204, 301, 400, 401, 403, 404, 500, 502, 503]), ctype, st.one_of(
        wrong.map(as_body), JSON.map(json.dumps), st.text(max_size=40), st.sampled_from(
            ["", "<html><title>x\ny</title>", "[" * 5000, "{", "null", "1e999", "\x00"])))
    return st.integers(0, 9).flatmap(lambda pick: (
        st.just((status, "application/json", as_body(right))) if pick <= 6 else
        wrong.map(lambda value: (status, "application/json", as_body(value))) if pick == 7 else
        anything if pick == 8 else failures(url)))


class FuzzedKernelSocket:
    """A websocket answering with drawn frames: well-formed replies, others' messages, garbage, a closed socket."""

    def __init__(self, data):
        self.data, self.msg_id, self.frames = data, None, 0

    def send(self, text):
        self.msg_id = json.loads(text)["header"]["msg_id"]

    def recv(self):
        import websocket

        self.frames += 1
        if self.frames > 8:
            raise websocket.WebSocketTimeoutException("timed out")
        mine = {"msg_id": self.msg_id}
        pick = self.data.draw(st.integers(0, 9), label="frame")
        if pick <= 5:  # the cell's end: the kernel goes idle
            return json.dumps({"parent_header": mine, "msg_type": "status", "content": {"execution_state": "idle"}})
        if pick == 6:
            return json.dumps({"parent_header": mine, "msg_type": "stream", "content": {"text": "printed\n"}})
        if pick == 7:
            return json.dumps({"parent_header": mine, "msg_type": "error",
                               "content": self.data.draw(st.one_of(JSON, st.fixed_dictionaries(
                                   {"ename": JSON, "evalue": st.one_of(JSON, st.just("a\nb"))})))})
        if pick == 8:
            return self.data.draw(st.one_of(JSON.map(json.dumps), st.fixed_dictionaries(
                {"parent_header": st.one_of(JSON, st.just(mine)), "msg_type": JSON, "content": JSON}).map(json.dumps)))
        trouble = self.data.draw(st.sampled_from(["closed", "not json", "bytes", "timeout"]))
        if trouble == "closed":
            raise websocket.WebSocketConnectionClosedException("closed")
        if trouble == "timeout":
            raise websocket.WebSocketTimeoutException("timed out")
        return "not json" if trouble == "not json" else b"\x00\xff"

    def close(self):
        pass


def ends_in_ok_lines_or_one_error_line(argv, capsys, token) -> str:
    """Run the check; what it ended with: "passed", "help" or the error line (asserted to be one line)."""
    capsys.readouterr()
    try:
        portal_check.main(argv)
        outcome = "passed"
        captured = capsys.readouterr()
        assert all(line.startswith("ok  ") for line in captured.out.splitlines()) and not captured.err
    except SystemExit as stop:
        captured = capsys.readouterr()
        if stop.code == 0 and captured.out.startswith("usage:"):  # a drawn -h: the help, and nothing else
            return "help"
        assert stop.code == 2, (argv, captured.err)
        lines = captured.err.splitlines()
        assert len(lines) == 1 and lines[0].startswith("error:") and " Fix: " in lines[0], (argv, captured.err)
        outcome = lines[0]
    if len(token) >= 10:
        assert token not in captured.out + captured.err, argv
    return outcome


@FUZZ
@given(token=TOKENS, draws=st.lists(FLAG_VALUES, max_size=5),
       required=st.sets(st.sampled_from(["--hub", "--user", "--token"])))
def test_any_flags_end_in_one_error_line_before_any_request(token, draws, required, capsys, monkeypatch):
    monkeypatch.setattr(portal_check, "_open", lambda request, timeout_s: (_ for _ in ()).throw(Reached()))
    base = {"--hub": "http://127.0.0.1:8000", "--user": USER, "--token": token}
    argv = [text for flag in sorted(required) for text in (flag, base[flag])]
    argv += [text for flag, value in draws for text in (flag, value)]
    try:
        ends_in_ok_lines_or_one_error_line(argv, capsys, token)
    except Reached:  # the arguments passed: the first request is where this test stops
        pass


@FUZZ
@given(data=st.data(), token=GOOD_TOKENS,
       extra=st.lists(st.sampled_from([("--tensorboard-port", "6006"), ("--cell", "print(1)"), ("--cell", ""),
                                       ("--timeout", "5")]), max_size=3))
def test_any_answers_end_in_ok_lines_or_one_error_line(data, token, extra, capsys, monkeypatch):
    import websocket

    asked = []

    def fake_open(request, timeout_s):
        asked.append(request.get_method() + " " + urllib.parse.urlsplit(request.full_url).path.rsplit("/", 1)[-1])
        outcome = data.draw(answers(request.full_url), label=f"{request.get_method()} {request.full_url}")
        if isinstance(outcome, BaseException):
            raise outcome
        status, content_type, body = outcome
        return status, {"Content-Type": content_type}, body.encode("utf-8", errors="surrogatepass"), request.full_url

    monkeypatch.setattr(portal_check, "_open", fake_open)
    monkeypatch.setattr(websocket, "create_connection", lambda *a, **k: FuzzedKernelSocket(data))
    argv = ["--hub", "http://127.0.0.1:8000", "--user", USER, "--token", token, *[t for pair in extra for t in pair]]
    outcome = ends_in_ok_lines_or_one_error_line(argv, capsys, token)
    event(f"{', '.join(asked)}: {'passed' if outcome == 'passed' else 'one error line'}")  # how far it got


# ---------------------------------------------------------------- every other entry's flags, swept

def reached(*args, **kwargs):
    raise Reached


def load_benchmark(name: str):
    spec = importlib.util.spec_from_file_location(f"bad_input_benchmark_{name}", ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


BENCHMARKS = sorted(p.stem for p in (ROOT / "benchmarks").glob("*.py") if not p.stem.startswith("_"))
# The call each entry makes once its arguments are good: replaced by Reached, so nothing long ever runs.
WORK = {
    "train": [("workshop_utils.train", "stop_on_signals"), ("workshop_utils.train", "train")],
    "data": [("workshop_utils.data", "CIFAR10"), ("workshop_utils.data", "cifar_folder")],
    "report": [("workshop_utils.report", "write_report")],
    "run_notebooks": [("workshop_utils.run_notebooks", "run_notebooks")],
    "parallel_demos": [("workshop_utils.spine.distributed", "setup_distributed"),
                       ("workshop_utils.parallel_demos", "hide_gpus")],
    "comm_model": [("workshop_utils.comm_model", "setup_distributed")],
    "postmortem": [("workshop_utils.postmortem", "root_cause")],
}
DIST_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "SLURM_NTASKS", "SLURM_PROCID",
                  "TORCHELASTIC_ERROR_FILE")
# Values any flag may get: near misses and garbage. No "/" in drawn text: paths stay in the test's folder.
GARBAGE = st.one_of(st.sampled_from(["0", "1", "2", "-1", "2.5", "1e-3", "nan", "inf", "-inf", "", " ", "abc", "-",
                                     "--", "\x00", "a\nb", "\u2028", "é", ".", "..", "{}", "[]", '{"steps": 2}',
                                     "9" * 25, "cpu", "cuda", "auto", "gpu", "all", "fp8", "bf16"]),
                    st.text(alphabet=st.characters(blacklist_characters="/", blacklist_categories=("Cs",)),
                            max_size=6))
SWEEP = settings(max_examples=80, deadline=None, database=None, derandomize=True,
                 suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def argv_of(parser):
    """Command lines for ``parser``: mostly its own shape (sub-command, positionals, then flags with allowed values,
    garbage or nothing), sometimes any of its words in any order."""
    positionals, flags, commands, words = [], {}, None, []
    for action in parser._actions:
        choices = [str(choice) for choice in action.choices] if action.choices and not isinstance(
            action, argparse._SubParsersAction) else []
        if isinstance(action, argparse._SubParsersAction):
            commands = action.choices
        elif action.option_strings:
            for flag in action.option_strings:
                if flag not in ("-h", "--help"):
                    flags[flag] = choices
        else:
            positionals.append(choices)
        words += [f for f in action.option_strings if f not in ("-h", "--help")] + choices
    value = lambda choices: st.one_of(st.sampled_from(choices), GARBAGE) if choices else GARBAGE  # noqa: E731
    pairs = st.lists(st.sampled_from(sorted(flags)).flatmap(
        lambda flag: st.tuples(st.just(flag), st.one_of(value(flags[flag]), value(flags[flag]), st.none()))),
        max_size=4).map(lambda drawn: [t for flag, v in drawn for t in ([flag] if v is None else [flag, v])]) \
        if flags else st.just([])
    shaped = st.tuples(st.tuples(*[value(c) for c in positionals]).map(list), pairs).map(lambda both: both[0] + both[1])
    if commands:  # a sub-command, then that command's own shape
        names = sorted(commands)
        shaped = st.sampled_from(names).flatmap(lambda name: argv_of(commands[name]).map(lambda rest: [name] + rest))
        words += names + [w for sub in commands.values() for w in sub_words(sub)]
    anything = st.lists(st.one_of(st.sampled_from(sorted(set(words)) or ["--verbose"]), GARBAGE), max_size=6)
    return st.one_of(shaped, shaped, anything)


def sub_words(parser) -> list[str]:
    return [f for action in parser._actions for f in action.option_strings if f not in ("-h", "--help")]


def sweep_entry(main, parser, data, capsys):
    check_argv(main, data.draw(argv_of(parser), label="argv"), capsys)


NASTY = ["", "\x00", "a\nb", "-1", "0", "nan", "..", "9" * 25, "{}", "é"]


def nasty_argvs(parser, prefix=()):
    """The parser's own shape with one nasty value at a time: in each positional, and after each flag."""
    positionals, flags = [], []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return [argv for name, sub in sorted(action.choices.items()) for argv in nasty_argvs(sub, (*prefix, name))]
        if action.option_strings:
            flags += [f for f in action.option_strings if f not in ("-h", "--help")]
        else:
            positionals.append(str(next(iter(action.choices))) if action.choices else "x")
    base = [*prefix, *positionals]
    argvs = [base[:len(prefix) + i] + [value] + base[len(prefix) + i + 1:]
             for i in range(len(positionals)) for value in NASTY]
    return argvs + [base + [flag, value] for flag in flags for value in NASTY] + [base + [flag] for flag in flags]


def check_argv(main, argv, capsys) -> None:
    capsys.readouterr()
    try:
        main(argv)
    except Reached:
        return
    except SystemExit as stop:
        captured = capsys.readouterr()
        if stop.code == 0 and captured.out.startswith("usage:"):
            return
        assert stop.code == 2, (argv, stop.code, captured.err)
        lines = captured.err.splitlines()
        assert len(lines) == 1 and lines[0].startswith("error:") and " Fix: " in lines[0], (argv, captured.err)
        return
    raise AssertionError(f"{argv} neither stopped at its work nor ended in one error line")


@pytest.fixture
def stopped_work(monkeypatch, tmp_path):
    """Every entry's work replaced by Reached; the test's folder as the working one, no torchrun variables."""
    monkeypatch.chdir(tmp_path)
    for name in DIST_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    for module, name in [pair for pairs in WORK.values() for pair in pairs]:
        monkeypatch.setattr(importlib.import_module(module), name, reached)
    for name in ("load_data", "load_text", "train"):  # what every benchmark calls first once its flags are good
        monkeypatch.setattr(wu, name, reached)


# Every python -m entry of the package but the portal check (swept above with its answers); one not in WORK
# is swept through its parser alone: once its arguments parse, it stops there.
ENTRIES = sorted([p.stem for p in (ROOT / "workshop_utils").glob("*.py") if not p.stem.startswith("_")]
                 + [p.parent.name for p in (ROOT / "workshop_utils").glob("*/__main__.py")
                    if p.parent.name != "portal_check"])


def parse_only(module, monkeypatch) -> None:
    """``module.main`` stops with Reached as soon as its arguments parse: nothing of an unknown entry's work runs."""
    original = module.build_parser

    def build():
        parser = original()
        parse = parser.parse_args

        def parse_args(args=None, namespace=None):
            parse(args, namespace)
            raise Reached

        parser.parse_args = parse_args
        return parser

    monkeypatch.setattr(module, "build_parser", build)


def entry_modules():
    return [(f"workshop_utils.{entry}", lambda entry=entry: importlib.import_module(f"workshop_utils.{entry}"))
            for entry in ENTRIES] + [(f"benchmarks/{name}.py", lambda name=name: load_benchmark(name))
                                     for name in BENCHMARKS]


@pytest.mark.parametrize("entry, load", entry_modules(), ids=[name for name, _ in entry_modules()])
def test_each_flag_with_each_nasty_value_reaches_the_work_or_is_one_error_line(entry, load, stopped_work, capsys,
                                                                                monkeypatch):
    module = load()
    parser = module.build_parser()
    if entry.startswith("workshop_utils.") and entry.split(".")[1] not in WORK:
        parse_only(module, monkeypatch)
    for argv in nasty_argvs(parser):
        check_argv(module.main, argv, capsys)


@pytest.mark.parametrize("entry", ENTRIES)
def test_any_flags_of_an_entry_reach_its_work_or_end_in_one_error_line(entry, stopped_work, capsys, monkeypatch):
    module = importlib.import_module(f"workshop_utils.{entry}")
    parser = module.build_parser()
    if entry not in WORK:
        parse_only(module, monkeypatch)

    @SWEEP
    @given(data=st.data())
    def sweep(data):
        sweep_entry(module.main, parser, data, capsys)

    sweep()


@pytest.mark.parametrize("name", BENCHMARKS)
def test_any_flags_of_a_benchmark_reach_its_work_or_end_in_one_error_line(name, stopped_work, capsys):
    module = load_benchmark(name)

    @SWEEP
    @given(data=st.data())
    def sweep(data):
        sweep_entry(module.main, module.build_parser(), data, capsys)

    sweep()


def test_every_entry_has_a_parser_the_sweep_can_read():
    assert {"train", "data", "report", "run_notebooks", "parallel_demos", "comm_model", "postmortem"} <= set(ENTRIES)
    for entry in ENTRIES:
        module = importlib.import_module(f"workshop_utils.{entry}")
        assert callable(getattr(module, "build_parser", None)) and callable(getattr(module, "main", None)), entry


# ---------------------------------------------------------------- found by an attempt to break the check


def test_a_server_record_pointing_elsewhere_gets_no_token(capsys):
    seen = []

    def elsewhere(handler):
        seen.append(handler.headers.get("Authorization"))
        return json_answer({"kernelspecs": {}})

    with serving(elsewhere) as other:
        record = {**HUB_USER, "servers": {"": {**HUB_USER["servers"][""], "url": f"{other}/user/{USER}/"}}}
        for url in (f"{other}/user/{USER}/", "//" + other.split("://", 1)[1] + f"/user/{USER}/"):
            record["servers"][""]["url"] = url
            with serving(fake_hub(**{"/hub/api/users/USER": json_answer(record)})) as hub:
                line = run_check(capsys, "--hub", hub, "--user", USER, "--token", TOKEN)
            assert "not at the hub's" in line and TOKEN not in line
    assert seen == []


def test_the_kernels_websocket_follows_no_redirect(monkeypatch):
    import websocket

    calls = []
    monkeypatch.setattr(websocket, "create_connection",
                        lambda *a, **k: calls.append(k) or (_ for _ in ()).throw(websocket.WebSocketException("x")))
    with serving(fake_hub()) as hub, pytest.raises(portal_check.WorkshopError):
        portal_check.run_cells(f"{hub}/user/{USER}", TOKEN, "hpc-dl-workshop", ["1"])
    assert calls and calls[0].get("redirect_limit") == 0


@pytest.mark.parametrize("timeout", ["1e10", "9223372037", "86401"])
def test_a_timeout_past_a_day_is_one_line(timeout, capsys):
    run_check(capsys, "--hub", "http://127.0.0.1:1", "--user", USER, "--token", TOKEN, "--timeout", timeout)


@pytest.mark.parametrize("where", ["message", "version"])
def test_a_server_that_echoes_the_token_never_gets_it_printed(where, capsys, monkeypatch):
    import websocket

    monkeypatch.setattr(websocket, "create_connection", FakeKernelSocket)
    if where == "message":
        answers = {"/hub/api/users/USER": json_answer({"status": 403, "message": f"bad token {TOKEN}"}, 403)}
    else:
        answers = {"/hub/api": json_answer({"version": TOKEN})}
    with serving(fake_hub(**answers)) as hub:
        with contextlib.suppress(SystemExit):
            portal_check.main(["--hub", hub, "--user", USER, "--token", TOKEN])
    out = capsys.readouterr()
    assert TOKEN not in out.out + out.err and "<token>" in out.out + out.err


def test_an_error_reply_without_an_error_message_fails_the_cell(monkeypatch):
    class ErrorReply(FakeKernelSocket):
        def send(self, text):
            parent = {"msg_id": json.loads(text)["header"]["msg_id"]}
            self.replies += [{"parent_header": parent, "msg_type": "execute_reply", "content": {"status": "error"}},
                             {"parent_header": parent, "msg_type": "status", "content": {"execution_state": "idle"}}]

    import websocket

    monkeypatch.setattr(websocket, "create_connection", ErrorReply)
    with serving(fake_hub()) as hub, pytest.raises(portal_check.WorkshopError, match="failed in kernel"):
        portal_check.run_cells(f"{hub}/user/{USER}", TOKEN, "hpc-dl-workshop", ["1"])
