"""Labels that show text from the user's data (paths, error messages) wrap instead of widening the window.

A QLabel asks its layout for the width of its longest line (or word, with word wrap). A long error
or a deep path then sets the window's minimum width: the window grew past the screen after a failed
compile. :func:`fit_width` makes a label take the width its layout gives it and wrap (or clip a
single unbreakable word) within it.
"""

from __future__ import annotations

from PySide6.QtWidgets import QLabel, QSizePolicy


def fit_width(label: QLabel) -> QLabel:
    """Let ``label`` wrap within the width it is given and never ask for more; returns it."""
    label.setWordWrap(True)
    policy = label.sizePolicy()
    policy.setHorizontalPolicy(QSizePolicy.Policy.Ignored)
    label.setSizePolicy(policy)
    return label
