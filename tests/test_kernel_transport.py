"""The main job's kernels talk over Unix-domain (IPC) sockets in a private folder, not over TCP ports.

Over TCP every user of a shared node can reach a kernel's ports, and ipykernel warns on each start
that "Kernel is running over TCP without encryption". A tiny notebook, run by the main job's own
``run_one``, reports from inside its kernel how it is connected; capfd holds what the kernel process
itself wrote to stderr (its log, where that warning goes).
"""

import json
import os
import tempfile
from pathlib import Path

import nbformat
import papermill
from nbformat.v4 import new_code_cell, new_notebook

import workshop_utils.run_notebooks as rn

TCP_WARNING = "running over TCP without encryption"

REPORT = '''
import json, os, stat
import ipykernel, psutil
info = ipykernel.get_connection_info(unpack=True)
folder = os.path.dirname(info["ip"]) if info["transport"] == "ipc" else None
print("CONNECTION " + json.dumps({
    "transport": info["transport"], "ip": info["ip"],
    "connection_file": ipykernel.get_connection_file(),
    "folder": folder,
    "folder_mode": stat.S_IMODE(os.stat(folder).st_mode) if folder else None,
    "folder_owner": os.stat(folder).st_uid if folder else None,
    "sockets": [stat.S_ISSOCK(os.stat(f"{info['ip']}-{info[name]}").st_mode)
                for name in ("shell_port", "iopub_port", "stdin_port", "control_port", "hb_port")]
               if folder else [],
    "tcp_listening": [c.laddr.port for c in psutil.Process().net_connections("inet") if c.status == "LISTEN"],
    # ipykernel's own pipe for output of forked child processes: always TCP on 127.0.0.1, not configurable,
    # and it drops every message without the random 16-byte key the children inherit.
    "fork_pipe_port": getattr(get_ipython().kernel.iopub_thread, "_pipe_port", None),
}))
'''


def reporting_notebook(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    nb = new_notebook(cells=[new_code_cell('profile = "auto"\nrun_dir = None', metadata={"tags": ["parameters"]}),
                             new_code_cell(REPORT)])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    path = folder / "01_transport.ipynb"
    nbformat.write(nb, path)
    return path


def connection_of(executed: Path) -> dict:
    nb = nbformat.read(executed, as_version=4)
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    line = next(line for line in text.splitlines() if line.startswith("CONNECTION "))
    return json.loads(line.removeprefix("CONNECTION "))


def test_the_main_jobs_kernel_uses_ipc_sockets_in_a_private_folder_and_no_tcp(tmp_path, capfd):
    notebook = reporting_notebook(tmp_path / "notebooks")
    (tmp_path / "run" / "notebooks").mkdir(parents=True)  # as run_notebooks makes it
    entry = rn.run_one(notebook, tmp_path / "run", "cpu")
    captured = capfd.readouterr()
    assert entry["status"] == "ok", entry
    seen = connection_of(tmp_path / "run" / "notebooks" / notebook.name)
    assert seen["transport"] == "ipc", seen
    assert seen["sockets"] == [True] * 5, seen  # five Unix-domain sockets: shell, iopub, stdin, control, hb
    # No channel of the kernel on a TCP port: at most ipykernel's internal pipe for forked children listens.
    assert set(seen["tcp_listening"]) <= {seen["fork_pipe_port"]}, seen
    assert seen["folder_mode"] & 0o777 == 0o700 and seen["folder_owner"] == os.getuid(), seen
    assert Path(seen["folder"]).name.startswith("workshop-kernel-")
    assert Path(seen["connection_file"]).parent == Path(seen["folder"]), seen  # its key beside the sockets
    assert not Path(seen["folder"]).exists(), "the private folder must be removed when the notebook ends"
    assert TCP_WARNING not in captured.out + captured.err, captured.err


def test_a_plain_papermill_kernel_is_on_tcp_and_warns_so_the_check_above_can_fail(tmp_path, capfd):
    """The control: without the main job's kernel manager, the same notebook reports tcp (and the warning)."""
    notebook = reporting_notebook(tmp_path / "notebooks")
    executed = tmp_path / "executed.ipynb"
    papermill.execute_notebook(str(notebook), str(executed), kernel_name="python3", cwd=str(notebook.parent),
                               progress_bar=False)
    captured = capfd.readouterr()
    seen = connection_of(executed)
    assert seen["transport"] == "tcp" and len(set(seen["tcp_listening"]) - {seen["fork_pipe_port"]}) == 5, seen
    import inspect

    import ipykernel.kernelapp

    if "without encryption" in inspect.getsource(ipykernel.kernelapp):  # this ipykernel has the warning
        assert TCP_WARNING in captured.out + captured.err, captured.err


def test_a_temporary_folder_too_long_for_a_socket_path_falls_back_to_tmp(tmp_path, monkeypatch):
    """A job's $TMPDIR can be deep; a Unix socket's path holds about 100 bytes. No kernel is started here."""
    deep = tmp_path / ("d" * 120)
    deep.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(deep))
    with rn.private_kernel_config() as config:
        settings = config["KernelManager"]
        folder = Path(settings["ip"]).parent
        assert settings["transport"] == "ipc" and folder.parent == Path("/tmp"), settings
        assert os.stat(folder).st_mode & 0o777 == 0o700
        assert Path(settings["connection_file"]).parent == folder
    assert not folder.exists()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # short enough: the usual place is kept
    with rn.private_kernel_config() as config:
        assert Path(config["KernelManager"]["ip"]).parent.parent == tmp_path
