"""Frozen entry point of the ``qbstudio`` executable in the PyInstaller bundle.

``multiprocessing.freeze_support()`` comes first: the workbench compiles in a child process
(forkserver), and in a bundle every child is this same executable started with multiprocessing's
arguments; freeze_support runs the child's code and exits instead of opening a second window.
"""

import multiprocessing
import sys

if __name__ == "__main__":
    multiprocessing.freeze_support()
    from qbstudio.app import main

    sys.exit(main())
