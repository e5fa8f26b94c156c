"""Qt-free state of the workbench: project, compile settings, runs, preferences, model facts.

Nothing in this package imports Qt, so all of it is tested without a display
(``tests/test_state.py``); the widgets only read and edit these objects.
"""
