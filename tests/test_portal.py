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
import socket
import subprocess
import sys
import urllib.parse
import urllib.request
from pathlib import Path

import nbformat
import pytest

import workshop_utils as wu
from workshop_utils import portal_check
from workshop_utils.classroom.hub import PROXY, Hub as ClassHub, free_port, wait_for

ROOT = Path(__file__).resolve().parents[1]
PORTAL = ROOT / "portal"
BIN = Path(sys.executable).parent
USER, PASSWORD, TOKEN = "attendee", "workshop-password", "portal-check-token-0123456789abcdef"

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which("node") is None or not (BIN / "jupyterhub").exists(),
                                 reason="needs Node.js (apt-get install nodejs npm) and JupyterHub (make install)")]


class Hub(ClassHub):
    """The class's hub with one attendee who logs in with a password; its folder holds the servers' Jupyter paths."""

    def __init__(self, folder: Path):
        self.jupyter_path = folder / "portal-env" / "share" / "jupyter"  # where the kernel is registered
        self.config_path = folder / "server-config"  # extra jupyter_server configuration of the servers
        self.config_path.mkdir(parents=True)
        (folder / "home").mkdir()
        root = '"--allow-root"' if os.geteuid() == 0 else ""
        super().__init__(folder, [USER], TOKEN, password=PASSWORD,
                         server_env={"JUPYTER_PATH": str(self.jupyter_path), "JUPYTER_CONFIG_PATH": str(self.config_path)},
                         settings=f"""
c.JupyterHub.spawner_class = "simple"
c.SimpleLocalProcessSpawner.home_dir_template = "{folder}/home/{{username}}"
c.Spawner.args = [*c.Spawner.args, {root}]
""")

    def server_ready(self) -> bool:
        return bool(self.server(USER).get("ready"))

    def restart_server(self) -> None:
        """Stop the attendee's server and start it again, so that it reads the changed Jupyter paths."""
        self.api(f"/users/{USER}/server", method="DELETE")
        wait_for(lambda: not self.server_ready() and self.api(f"/users/{USER}/server", method="POST")[0] in (201, 202),
                  120, "the server stopping and starting again")
        wait_for(self.server_ready, 180, f"{USER}'s server")

    def stop(self) -> None:
        if self.server(USER):
            self.stop_server(USER)
        super().stop()


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
    wait_for(hub.server_ready, 180, f"{USER}'s server after logging in")


def _attendee_cells(tmp_path) -> list[str]:
    """The first code cells of notebook 01's attendee copy, after its parameters (those the kernel can run fast)."""
    path = tmp_path / "01_single_gpu_baseline.ipynb"
    wu.attendee_notebook(ROOT / "notebooks" / path.name, path)
    code = [c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]
    return [code[0].replace("run_dir = None", f"run_dir = {str(tmp_path / 'run')!r}"), code[1]]


def test_an_attendee_logs_in_and_finds_the_kit_its_kernel_and_tensorboard(hub, tmp_path):
    _log_in_and_start_a_server(hub)
    board_port = free_port()
    board = subprocess.Popen([str(BIN / "tensorboard"), "--logdir", str(tmp_path), "--port", str(board_port),
                              "--host", "127.0.0.1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: _listens(board_port), 120, "TensorBoard")
        said = portal_check.check_portal(hub.url, USER, TOKEN, cells=_attendee_cells(tmp_path),
                                         tensorboard_port=board_port)
    finally:
        board.terminate()
        board.wait(timeout=30)
    assert said[1].endswith("the default for new notebooks"), said  # the recipe's default kernel
    assert said[2].startswith("ok  2 cell(s) ran") and said[3].startswith("ok  TensorBoard answers"), said
    # JupyterLab's settings from portal/lab-settings/overrides.json: no news pop-up for the attendees
    server = portal_check.server_url(hub.url, USER, TOKEN)
    status, text = portal_check.request(f"{server}/lab/api/settings/@jupyterlab/apputils-extension:notification",
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
        done = _portal_check(hub, "--tensorboard-port", str(free_port()))
    finally:
        off.unlink()
        hub.restart_server()
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stdout + done.stderr
    assert "answered 404: the portal's servers have no jupyter-server-proxy" in lines[0]
