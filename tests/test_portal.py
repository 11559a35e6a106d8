"""The Jupyter portal, for real: a JupyterHub on the loopback interface, as attendees meet it.

The hub runs portal/jupyterhub_config.py (the README's recipe) with a test login (DummyAuthenticator)
and servers started as local processes; its proxy is configurable-http-proxy from portal/ (npm). An
attendee logs in through the login form and starts a server; ``workshop_utils.portal_check`` then asks
that server, through the hub's proxy, for the kit's kernel, runs the first cells of an attendee copy in
it over the kernel's websocket, and fetches TensorBoard through ``/user/<name>/proxy/<port>/``. A broken
kernel registration and a server without jupyter-server-proxy each fail the check with one line. Every
process started here (the hub with its proxy and servers, TensorBoard) is stopped by its id.
"""

from __future__ import annotations

import http.cookiejar
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import nbformat
import pytest

import workshop_utils as wu
from workshop_utils import portal_check

ROOT = Path(__file__).resolve().parents[1]
PORTAL = ROOT / "portal"
PROXY = PORTAL / "node_modules" / ".bin" / "configurable-http-proxy"
BIN = Path(sys.executable).parent
USER, PASSWORD, TOKEN = "attendee", "workshop-password", "portal-check-token-0123456789abcdef"

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which("node") is None or not (BIN / "jupyterhub").exists(),
                                 reason="needs Node.js (apt-get install nodejs npm) and JupyterHub (make install)")]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for(check, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        result = check()
        if result:
            return result
        time.sleep(0.5)
    raise AssertionError(f"{what} not within {timeout_s:g} s")


class Hub:
    """A JupyterHub process with the recipe loaded; its folder holds the servers' extra Jupyter paths."""

    def __init__(self, folder: Path):
        self.folder, self.port = folder, _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.jupyter_path = folder / "portal-env" / "share" / "jupyter"  # where the kernel is registered
        self.config_path = folder / "server-config"  # extra jupyter_server configuration of the servers
        self.config_path.mkdir(parents=True)
        (folder / "home").mkdir()
        config = folder / "jupyterhub_config.py"
        config.write_text(f"""
c = get_config()
load_subconfig({str(PORTAL / "jupyterhub_config.py")!r})
c.JupyterHub.bind_url = "{self.url}"
c.JupyterHub.hub_bind_url = "http://127.0.0.1:{_free_port()}"
c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:{_free_port()}"
c.JupyterHub.db_url = "sqlite:///{folder}/hub.sqlite"
c.JupyterHub.cookie_secret_file = "{folder}/cookie_secret"
c.JupyterHub.authenticator_class = "dummy"
c.DummyAuthenticator.password = "{PASSWORD}"
c.Authenticator.allowed_users = {{"{USER}"}}
c.JupyterHub.spawner_class = "simple"
c.SimpleLocalProcessSpawner.home_dir_template = "{folder}/home/{{username}}"
c.Spawner.cmd = ["{BIN / 'jupyterhub-singleuser'}"]
c.Spawner.args = [*c.Spawner.args, {'"--allow-root"' if os.geteuid() == 0 else ''}]
c.Spawner.environment = {{"JUPYTER_PATH": "{self.jupyter_path}", "JUPYTER_CONFIG_PATH": "{self.config_path}",
                         "PATH": "{BIN}:" + __import__("os").environ["PATH"]}}
c.Spawner.start_timeout = c.Spawner.http_timeout = 180
c.JupyterHub.services = [{{"name": "portal-check", "api_token": "{TOKEN}"}}]
c.JupyterHub.load_roles = [{{"name": "portal-check", "services": ["portal-check"],
                            "scopes": ["admin:users", "admin:servers", "access:servers"]}}]
""")
        self.log = (folder / "hub.log").open("w")
        self.process = subprocess.Popen([str(BIN / "jupyterhub"), "-f", str(config)], cwd=folder,
                                        stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        _wait_for(lambda: self._answers(), 120, f"the hub at {self.url} (log: {folder / 'hub.log'})")

    def _answers(self) -> bool:
        if self.process.poll() is not None:
            raise AssertionError(f"the hub exited ({self.process.returncode}):\n"
                                 + (self.folder / "hub.log").read_text()[-3000:])
        try:
            with urllib.request.urlopen(f"{self.url}/hub/api", timeout=2):
                return True
        except OSError:
            return False

    def api(self, path: str, method: str = "GET") -> int:
        status, _ = portal_check._request(f"{self.url}/hub/api{path}", TOKEN, method=method)
        return status

    def server_ready(self) -> bool:
        status, text = portal_check._request(f"{self.url}/hub/api/users/{USER}", TOKEN)
        return status == 200 and bool((json.loads(text).get("servers") or {}).get("", {}).get("ready"))

    def restart_server(self) -> None:
        """Stop the attendee's server and start it again, so that it reads the changed Jupyter paths."""
        self.api(f"/users/{USER}/server", method="DELETE")
        _wait_for(lambda: not self.server_ready() and self.api(f"/users/{USER}/server", method="POST") in (201, 202),
                  120, "the server stopping and starting again")
        _wait_for(self.server_ready, 180, f"{USER}'s server")

    def stop(self) -> None:
        os.killpg(self.process.pid, signal.SIGTERM)  # the hub's group: the hub, its proxy and the servers it spawned
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self.log.close()


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    if not PROXY.exists():  # make test installs it; a bare pytest run does it here
        subprocess.run(["npm", "ci", "--prefix", str(PORTAL), "--no-audit", "--no-fund", "--loglevel=error"],
                       check=True, timeout=600)
    folder = tmp_path_factory.mktemp("portal")
    # The README's step: the kit's kernel registered for every user, in the servers' environment.
    subprocess.run([sys.executable, "-m", "ipykernel", "install", "--prefix", str(folder / "portal-env"),
                    "--name", portal_check.KERNEL_NAME, "--display-name", portal_check.KERNEL_DISPLAY_NAME],
                   check=True, capture_output=True)
    running = Hub(folder)
    try:
        yield running
    finally:
        running.stop()


def _log_in_and_start_a_server(hub: Hub) -> None:
    """What an attendee does: the login form, then the spawn page."""
    cookies = http.cookiejar.CookieJar()
    session = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(cookies))
    with session.open(f"{hub.url}/hub/login", timeout=30) as page:
        page.read()
    xsrf = next((cookie.value for cookie in cookies if cookie.name == "_xsrf"), "")  # the form's own token
    form = urllib.parse.urlencode({"username": USER, "password": PASSWORD, "_xsrf": xsrf}).encode()
    with session.open(f"{hub.url}/hub/login?next=%2Fhub%2Fspawn", data=form, timeout=180) as page:
        page.read()
    _wait_for(hub.server_ready, 180, f"{USER}'s server after logging in")


def _attendee_cells(tmp_path) -> list[str]:
    """The first code cells of notebook 01's attendee copy, after its parameters (those the kernel can run fast)."""
    path = tmp_path / "01_single_gpu_baseline.ipynb"
    wu.attendee_notebook(ROOT / "notebooks" / path.name, path)
    code = [c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]
    return [code[0].replace("run_dir = None", f"run_dir = {str(tmp_path / 'run')!r}"), code[1]]


def test_an_attendee_logs_in_and_finds_the_kit_its_kernel_and_tensorboard(hub, tmp_path):
    _log_in_and_start_a_server(hub)
    board_port = _free_port()
    board = subprocess.Popen([str(BIN / "tensorboard"), "--logdir", str(tmp_path), "--port", str(board_port),
                              "--host", "127.0.0.1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_for(lambda: _listens(board_port), 120, "TensorBoard")
        said = portal_check.check_portal(hub.url, USER, TOKEN, cells=_attendee_cells(tmp_path),
                                         tensorboard_port=board_port)
    finally:
        board.terminate()
        board.wait(timeout=30)
    assert said[1].endswith("the default for new notebooks"), said  # the recipe's default kernel
    assert said[2].startswith("ok  2 cell(s) ran") and said[3].startswith("ok  TensorBoard answers"), said
    # JupyterLab's settings from portal/lab-settings/overrides.json: no news pop-up for the attendees
    server = portal_check.server_url(hub.url, USER, TOKEN)
    status, text = portal_check._request(f"{server}/lab/api/settings/@jupyterlab/apputils-extension:notification",
                                         TOKEN)
    assert status == 200 and json.loads(text)["schema"]["properties"]["fetchNews"]["default"] == "false"


def _listens(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _portal_check(hub: Hub, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "workshop_utils.portal_check", "--hub", hub.url, "--user", USER,
                           "--token", TOKEN, *extra], capture_output=True, text=True, timeout=300)


def test_a_broken_kernel_registration_fails_the_check_in_one_line(hub):
    spec = hub.jupyter_path / "kernels" / portal_check.KERNEL_NAME / "kernel.json"
    good = spec.read_text()
    broken = json.loads(good)
    broken["argv"][0] = "/nonexistent/python3"  # an environment that was moved or deleted
    spec.write_text(json.dumps(broken))
    try:
        hub.restart_server()
        done = _portal_check(hub)
    finally:
        spec.write_text(good)
    assert done.returncode == 2 and done.stdout.startswith("ok  attendee's server runs"), done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: Kernel {portal_check.KERNEL_NAME} is registered but "
                                                   "does not start"), done.stderr


def test_a_portal_without_the_proxy_extension_fails_the_check_in_one_line(hub):
    off = hub.config_path / "jupyter_server_config.json"
    off.write_text(json.dumps({"ServerApp": {"jpserver_extensions": {"jupyter_server_proxy": False}}}))
    try:
        hub.restart_server()
        done = _portal_check(hub, "--tensorboard-port", str(_free_port()))
    finally:
        off.unlink()
        hub.restart_server()
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stdout + done.stderr
    assert "answered 404: the portal's servers have no jupyter-server-proxy" in lines[0]
