"""``python -m workshop_utils.portal_check``: the command is the package's ``main``."""

from . import main

main()
