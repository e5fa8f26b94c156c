"""Defer SymPy in the workbench process until something needs symbolic shape arithmetic.

onnx-ir imports SymPy at module level (``onnx_ir._core`` and ``onnx_ir._symbolic_shapes``, whose
table of allowed functions reads ``sympy.Max`` & co. at import), although it only builds SymPy
expressions lazily, when code does arithmetic on a symbolic dimension (``SymbolicDim + 1``).
Importing SymPy costs 0.4-0.6 s of CPU, about a third of the start-up of the workbench on a model
whose shapes are static, where it is never used.

:func:`defer_sympy` puts a stand-in module for ``sympy`` and for ``onnx_ir._symbolic_shapes`` in
``sys.modules`` before onnx-ir is imported. The stand-in carries the real module's ``__spec__`` (so
the import system sees a loaded module) and, on the first access of any other attribute, imports
the real module, copies its namespace into itself and hands the attribute over: after that the
stand-in *is* the module for everyone who holds it, and ``sys.modules`` has the real one. The
load is guarded by a lock, so a parse in a worker thread and the GUI thread cannot load it twice.
``tests/gui/test_app.py::test_sympy_is_deferred_until_symbolic_arithmetic`` shows both halves:
not loaded after parsing a static model, loaded and correct on the first symbolic expression.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import sys
import threading
import types

logger = logging.getLogger(__name__)

DEFERRED = ("sympy", "onnx_ir._symbolic_shapes")
"""The modules :func:`defer_sympy` defers (the second reads SymPy attributes when it is imported)."""


class DeferredModule(types.ModuleType):
    """A module whose real import happens on the first access of an attribute it does not have."""

    def __getattr__(self, attribute: str):
        with self.__dict__["_deferred_lock"]:
            if sys.modules.get(self.__name__) is self:
                logger.debug("importing %s now (first use: %s)", self.__name__, attribute)
                del sys.modules[self.__name__]
                try:
                    real = importlib.import_module(self.__name__)
                except BaseException:
                    sys.modules[self.__name__] = self
                    raise
                namespace = dict(real.__dict__)
                namespace.pop("_deferred_lock", None)
                self.__dict__.update(namespace)
        return getattr(sys.modules[self.__name__], attribute)


def _find_spec(name: str):
    """The spec of ``name`` without importing its parent package (which the parent's import must not precede)."""
    parent, _, _ = name.rpartition(".")
    if not parent:
        return importlib.util.find_spec(name)
    parent_spec = importlib.util.find_spec(parent)
    if parent_spec is None or not parent_spec.submodule_search_locations:
        return None
    for finder in sys.meta_path:  # the path finder in a checkout, the frozen importer in a bundle
        find_spec = getattr(finder, "find_spec", None)
        try:
            spec = find_spec(name, parent_spec.submodule_search_locations) if find_spec else None
        except Exception:  # noqa: BLE001 - a finder that cannot answer: the module is imported normally
            spec = None
        if spec is not None:
            return spec
    return None


def defer(name: str) -> bool:
    """Put a :class:`DeferredModule` for ``name`` in ``sys.modules``.

    Returns:
        True if ``name`` is deferred now; False if it is already imported or cannot be found
        (then the normal import happens, nothing else changes).
    """
    if name in sys.modules:
        return isinstance(sys.modules[name], DeferredModule)
    spec = _find_spec(name)
    if spec is None:
        return False
    stand_in = DeferredModule(name)
    stand_in.__spec__ = spec
    stand_in.__dict__["_deferred_lock"] = threading.RLock()
    sys.modules[name] = stand_in
    return True


def defer_sympy() -> bool:
    """Defer SymPy and onnx-ir's symbolic-expression parser (call before onnx-ir is imported).

    Returns:
        True if both are deferred.
    """
    if "onnx_ir" in sys.modules:
        return False
    return all([defer(name) for name in DEFERRED])


def is_deferred(name: str) -> bool:
    """Whether ``name`` is still a stand-in that has not been imported."""
    return isinstance(sys.modules.get(name), DeferredModule)
