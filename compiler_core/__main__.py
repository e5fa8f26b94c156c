"""``python -m compiler_core``: the qbcompiler CLI."""

from compiler_core.cli import main

main()
