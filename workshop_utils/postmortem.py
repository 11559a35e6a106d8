"""``python -m workshop_utils.postmortem LOG_DIR``: after a failed torchrun job, the rank that failed first.

When one rank fails, every rank prints an error, and the job's log ends with the last of them.
The job scripts run this when torchrun exits with an error: one line naming the rank whose failure
came first, its own error and the fix, then that rank's last lines (``parallel/failures.py``).
LOG_DIR is torchrun's --log-dir, where each rank's error file is; --output is a file holding what
torchrun printed, whose report gives each failed rank's exit status or signal.

    torchrun --log-dir=logs ... 2>&1 | tee torchrun.out ||
        python -m workshop_utils.postmortem logs --output torchrun.out
"""

from __future__ import annotations

from pathlib import Path

from .parallel.failures import root_cause
from .system.errors import OneLineParser, positive_int


def build_parser() -> OneLineParser:
    parser = OneLineParser(prog="python -m workshop_utils.postmortem",
                           description="Name the rank of a failed torchrun job that failed first, with its own "
                                       "error, and show its last lines.")
    parser.add_argument("log_dir", help="torchrun's --log-dir: the ranks' error files")
    parser.add_argument("--output", metavar="FILE", help="what torchrun printed (its report of the failed ranks)")
    parser.add_argument("--world-size", type=positive_int, metavar="N",
                        help="processes in the job: a rank missing from the report had finished")
    return parser


def main(argv=None) -> None:
    args = build_parser().parse_args(argv)
    output = Path(args.output) if args.output else None
    lines = output.read_text(errors="replace").splitlines() if output is not None and output.is_file() else []
    cause = root_cause(lines, args.world_size, args.log_dir)
    if cause is None:
        print(f"postmortem: no rank left an error file in {args.log_dir} or an entry in torchrun's report: "
              "the output above says what failed.", flush=True)
        raise SystemExit(1)
    print(f"error: {cause.message()}", flush=True)
    if cause.last_lines:
        print(cause.last_lines_text(), flush=True)


if __name__ == "__main__":
    main()
