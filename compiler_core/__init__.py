"""qb Compiler core: parse models to MBLT, check device support, quantize and compile to MXQ."""

__version__ = "0.1.0"

from compiler_core.errors import QBCompilerError  # noqa: E402

__all__ = ["QBCompilerError", "__version__"]
