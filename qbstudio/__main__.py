"""``python -m qbstudio``: start the workbench."""

import sys

from qbstudio.app import main

sys.exit(main())
