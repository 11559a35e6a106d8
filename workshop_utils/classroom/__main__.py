"""``python -m workshop_utils.classroom``: the command is the package's ``main``."""

from . import main

main()
