"""Run a command while every core is also busy with other work: the kit's verdicts must not change.

    python tests/under_load.py [--burners N] -- COMMAND ...      (make test-loaded)

Starts N processes (default: one per core this process may use) that spin on arithmetic, runs COMMAND,
then stops every burner it started, by its process id, and exits with COMMAND's status. This is the
machine CI may meet: a shared runner whose load average sits at two or three times its core count.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys

BURN = "while True: sum(i * i for i in range(10_000))"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--burners", type=int, default=len(os.sched_getaffinity(0)),
                        help="busy processes beside the command (default: one per core)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command or args.burners < 0:
        parser.error("give a command after --, and --burners 0 or more")
    burners = [subprocess.Popen([sys.executable, "-c", BURN]) for _ in range(args.burners)]
    print(f"under load: {len(burners)} CPU burner(s) (pids {', '.join(str(b.pid) for b in burners)}) "
          f"beside: {' '.join(command)}", flush=True)
    try:
        return subprocess.call(command)
    finally:
        for burner in burners:
            burner.send_signal(signal.SIGTERM)
        for burner in burners:
            burner.wait(timeout=30)
        print(f"under load: stopped {len(burners)} burner(s); load average {os.getloadavg()[0]:.1f}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
