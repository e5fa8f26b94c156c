"""qb Studio's data files (Netron overlay scripts, the sample project).

Not imported from the checkout: the wheel installs this folder as the package ``qbstudio_resources``
so that :func:`compiler_core.resources.resource_dir` finds it through :mod:`importlib.resources`.
"""
