"""``python -m workshop_utils.gpu_check``: the command is the package's ``main``."""

import sys

from . import main

sys.exit(main())
