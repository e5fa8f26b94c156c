"""Widgets of the qb Studio workbench."""
