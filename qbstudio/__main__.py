"""``python -m qbstudio``: start the workbench."""

import sys

from qbstudio.app import main

if __name__ == "__main__":  # multiprocessing children import this module too
    sys.exit(main())
