"""Frozen entry point of the ``qbcompiler`` command-line executable in the PyInstaller bundle."""

import multiprocessing
import sys

if __name__ == "__main__":
    multiprocessing.freeze_support()
    from compiler_core.cli import run

    sys.exit(run())
