"""Package list for setuptools (everything else is in pyproject.toml).

pyproject.toml cannot combine automatic package discovery with a renamed data package, so the list
is computed here: ``compiler_core`` and ``qbstudio`` with their subpackages, plus ``qbstudio_resources``
(and one entry per folder in it), which ``[tool.setuptools.package-dir]`` maps onto the checkout's
``resources/`` folder.
"""

from pathlib import Path

from setuptools import find_namespace_packages, setup

RESOURCES = Path(__file__).parent / "resources"


def resource_packages() -> list[str]:
    """``qbstudio_resources`` and its data-only subfolders, as dotted names."""
    folders = [RESOURCES, *sorted(p for p in RESOURCES.rglob("*") if p.is_dir() and p.name != "__pycache__")]
    return [".".join(["qbstudio_resources", *folder.relative_to(RESOURCES).parts]) for folder in folders]


# namespace discovery: some subpackages (compiler_core.backend, .quantization ...) have no __init__.py
setup(packages=[*find_namespace_packages(include=["compiler_core", "compiler_core.*", "qbstudio", "qbstudio.*"],
                                         exclude=["*.__pycache__"]),
                *resource_packages()])
