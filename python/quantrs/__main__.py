"""``python -m quantrs``: the same as the ``quantrs`` console script."""

import sys

from .cli import main

sys.exit(main())
