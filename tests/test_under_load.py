"""The stress check's runner (make test-loaded): burners beside the command, all stopped, the command's status kept."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

RUNNER = Path(__file__).resolve().parent / "under_load.py"
BURN = "while True: sum(i * i for i in range(10_000))"  # what each burner runs


@pytest.mark.slow
@pytest.mark.parametrize("status", [0, 3])
def test_the_command_runs_beside_busy_burners_which_are_all_stopped_after(status):
    # Only the runner's own burners (children of the probe's parent): the suite may itself run under load.
    probe = f"""import os
def own_burner(pid):
    try:
        command = open(f'/proc/{{pid}}/cmdline', 'rb').read().split(b'\\0')[-2:-1]
        parent = int(open(f'/proc/{{pid}}/stat').read().rsplit(')', 1)[1].split()[1])
    except OSError:  # a process that ended meanwhile
        return False
    return command == [{BURN.encode()!r}] and parent == os.getppid()
print('burners seen:', sum(own_burner(p) for p in os.listdir('/proc') if p.isdigit()))
raise SystemExit({status})
"""
    done = subprocess.run([sys.executable, str(RUNNER), "--burners", "2", "--", sys.executable, "-c", probe],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == status, done.stderr
    assert "burners seen: 2" in done.stdout
    pids = [int(p) for p in re.search(r"pids ([\d, ]+)\)", done.stdout).group(1).split(", ")]
    for pid in pids:
        assert not os.path.exists(f"/proc/{pid}") or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]
    assert "stopped 2 burner(s)" in done.stdout


def test_without_a_command_it_says_so_in_one_line():
    done = subprocess.run([sys.executable, str(RUNNER), "--burners", "1"], capture_output=True, text=True, timeout=30)
    assert done.returncode == 2 and "give a command after --" in done.stderr
