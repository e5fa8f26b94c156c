"""qb Compiler core: parse models to MBLT, check device support, quantize and compile to MXQ.

The vendor-style API is importable from the top level (``from compiler_core import mblt_compile,
mxq_compile, quantize, CompileConfig``). Those names load on first use, so ``import compiler_core``
stays light (the workbench imports it at start-up).
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

from compiler_core.errors import QBCompilerError  # noqa: E402

_LAZY = {
    "get_body_subgraph": "compiler_core.api",
    "mblt_compile": "compiler_core.api",
    "mblt_compile_with_callback": "compiler_core.api",
    "mxq_compile": "compiler_core.api",
    "mxq_compile_with_callback": "compiler_core.api",
    "mxq_compile_from_source": "compiler_core.api",
    "mxq_compile_from_mblt": "compiler_core.api",
    "parse_model": "compiler_core.api",
    "quantize": "compiler_core.api",
    "read_provenance": "compiler_core.api",
    "CompileConfig": "compiler_core.config.models",
    "list_presets": "compiler_core.config",
    "dump_default_config": "compiler_core.config",
}

__all__ = ["QBCompilerError", "__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    """Load the public API names on first access (PEP 562)."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'compiler_core' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
