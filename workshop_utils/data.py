"""``python -m workshop_utils.data``: fetch or check CIFAR-10 on a login node.

The reading, checking and loading code lives in ``spine/data.py``; this is its command.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from torchvision.datasets import CIFAR10

from .spine.data import cifar_folder, verify_cifar10
from .system.errors import OneLineParser, WorkshopError, exit_on_workshop_error


def folder_name(text: str) -> str:
    """A --root value a folder can have, or the parser's one-line error (an empty name, a control character)."""
    if not text or any(not c.isprintable() for c in text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a folder name (empty, or with a control character)")
    return text


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="python -m workshop_utils.data",
        description="Fetch or check CIFAR-10. Run `download` on a login node (compute nodes often have no "
        "internet), then point WORKSHOP_DATA at the same folder in your jobs.",
        fix="see `python -m workshop_utils.data --help`: download --root DIR, or verify --root DIR.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="{download,verify}")
    for name, text in (("download", "download CIFAR-10 (about 170 MB) and verify its checksums"),
                       ("verify", "check that a folder holds complete, uncorrupted CIFAR-10")):
        cmd = sub.add_parser(name, help=text, fix=parser.fix)
        cmd.add_argument("--root", required=True, type=folder_name,
                         help="folder that holds (or will hold) cifar-10-batches-py")
    return parser


@exit_on_workshop_error
def main(argv=None) -> None:
    args = build_parser().parse_args(argv)
    root = Path(args.root)
    if args.command == "download":
        root.mkdir(parents=True, exist_ok=True)
        try:
            CIFAR10(str(root), train=True, download=True)
        except Exception as err:  # network errors come in many types
            raise WorkshopError(f"Download into {root} failed: {err}.",
                                "run this on a login node with internet access, or copy the data in.") from None
    folder = cifar_folder(root)
    if folder is None:
        raise WorkshopError(f"No CIFAR-10 files in {root}.", "run `download` first.")
    verify_cifar10(folder)
    print(f"OK: {folder} holds complete CIFAR-10 (checksums verified). Use WORKSHOP_DATA={root.resolve()}")


if __name__ == "__main__":
    main()
