"""qb Studio: the Qt desktop workbench around compiler_core."""
