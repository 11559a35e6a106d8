"""A JupyterHub on the loopback interface with the portal's recipe loaded, as the class and the portal test use it.

The hub runs ``portal/jupyterhub_config.py`` and ``portal/class_config.py`` (what a site loads), then what only
a local test adds: a login without passwords (DummyAuthenticator), servers as local processes, an API token for
the process that drives the class. Its proxy is configurable-http-proxy from ``portal/`` (npm). Every process it
starts runs in the hub's own process group, stopped by its id.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from ..portal_check import KERNEL_DISPLAY_NAME, KERNEL_NAME, request
from ..system.errors import WorkshopError
from ..system.results import repo_root

PORTAL = (repo_root() or Path.cwd()) / "portal"
PROXY = PORTAL / "node_modules" / ".bin" / "configurable-http-proxy"
BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(check, timeout_s: float, what: str):
    """Poll ``check`` until it returns something true; a WorkshopError naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        result = check()
        if result:
            return result
        time.sleep(0.5)
    raise WorkshopError(f"{what} not within {timeout_s:g} s.", "see the hub's log in the class folder.")


def missing_pieces() -> str | None:
    """What this machine lacks to start a hub, in one line, or None."""
    if not (BIN / "jupyterhub").exists():
        return "JupyterHub is not installed in this environment (pip install -e '.[test]', or make install)"
    if not PROXY.exists():
        return "the hub's proxy is not installed: npm ci --prefix portal (needs Node.js)"
    return None


def register_kernel(prefix: Path) -> Path:
    """The kit's kernel, registered for every user in a Jupyter data folder (the portal page's step 2)."""
    subprocess.run([sys.executable, "-m", "ipykernel", "install", "--prefix", str(prefix), "--name", KERNEL_NAME,
                    "--display-name", KERNEL_DISPLAY_NAME], check=True, capture_output=True)
    return prefix / "share" / "jupyter"


class Hub:
    """A JupyterHub process with the portal's recipe; ``settings`` are extra lines of its configuration."""

    def __init__(self, folder: Path, users: list[str], token: str, settings: str = "", password: str = "",
                 server_env: dict | None = None):
        self.folder, self.port, self.token = folder, free_port(), token
        self.url = f"http://127.0.0.1:{self.port}"
        environment = {"PATH": f"{BIN}:" + os.environ.get("PATH", ""), **(server_env or {})}
        config = folder / "jupyterhub_config.py"
        config.write_text(f"""
c = get_config()
load_subconfig({str(PORTAL / "jupyterhub_config.py")!r})
load_subconfig({str(PORTAL / "class_config.py")!r})
c.JupyterHub.bind_url = "{self.url}"
c.JupyterHub.hub_bind_url = "http://127.0.0.1:{free_port()}"
c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:{free_port()}"
c.JupyterHub.db_url = "sqlite:///{folder}/hub.sqlite"
c.JupyterHub.cookie_secret_file = "{folder}/cookie_secret"
c.JupyterHub.authenticator_class = "dummy"
c.DummyAuthenticator.password = {password!r}
c.Authenticator.allowed_users = set({users!r})
c.Spawner.cmd = ["{BIN / 'jupyterhub-singleuser'}"]
c.Spawner.environment.update({environment!r})
c.Spawner.start_timeout = c.Spawner.http_timeout = 300
c.JupyterHub.services = [{{"name": "driver", "api_token": "{token}"}}]
c.JupyterHub.load_roles = [{{"name": "driver", "services": ["driver"],
                            "scopes": ["admin:users", "admin:servers", "access:servers"]}}]
{settings}
""")
        self.log_path = folder / "hub.log"
        self.log = self.log_path.open("w")
        self.process = subprocess.Popen([str(BIN / "jupyterhub"), "-f", str(config)], cwd=folder,
                                        stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            wait_for(self._answers, 180, f"the hub at {self.url} (log: {self.log_path})")
        except BaseException:
            self.stop()
            raise

    def _answers(self) -> bool:
        if self.process.poll() is not None:
            raise WorkshopError(f"The hub exited ({self.process.returncode}): "
                                + self.log_path.read_text()[-600:].replace("\n", " | "), "see its log.")
        try:
            status, _ = request(f"{self.url}/hub/api", self.token, timeout_s=2)
            return status == 200
        except WorkshopError:
            return False

    def api(self, path: str, method: str = "GET") -> tuple[int, str]:
        return request(f"{self.url}/hub/api{path}", self.token, method=method)

    def server(self, user: str) -> dict:
        status, text = self.api(f"/users/{user}")
        return (json.loads(text).get("servers") or {}).get("", {}) if status == 200 else {}

    def start_server(self, user: str) -> None:
        status, text = self.api(f"/users/{user}/server", method="POST")
        if status not in (201, 202, 400):  # 400: already running
            raise WorkshopError(f"The hub would not start {user}'s server ({status}: {text[:200]}).",
                                f"see {self.log_path}.")

    def server_url(self, user: str, timeout_s: float = 300) -> str:
        """Wait for the user's server to be ready; its address through the hub's proxy."""
        ready = wait_for(lambda: self.server(user).get("ready") and self.server(user), timeout_s,
                         f"{user}'s server")
        return self.url + ready["url"].rstrip("/")

    def stop_server(self, user: str) -> None:
        self.api(f"/users/{user}/server", method="DELETE")
        wait_for(lambda: not self.server(user), 120, f"{user}'s server stopping")

    def stop(self) -> None:
        """The hub's group: the hub and its proxy (servers run in sessions of their own: stop them first)."""
        if self.process.poll() is None:
            for sig, wait in ((signal.SIGTERM, 60), (signal.SIGKILL, 10)):
                try:
                    os.killpg(self.process.pid, sig)
                    self.process.wait(timeout=wait)
                    break
                except ProcessLookupError:
                    break
                except subprocess.TimeoutExpired:
                    continue
        self.log.close()
