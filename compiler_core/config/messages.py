"""Turning pydantic validation errors into one readable line that names the key and the fix."""

from __future__ import annotations

import difflib
import enum
import types
import typing
from typing import Any, Literal, Union

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from compiler_core.errors import ConfigError

MAX_LISTED_ERRORS = 5
"""How many errors one message spells out; the rest are counted."""

_TYPE_PHRASES = {"int": "an integer", "float": "a number", "bool": "true or false", "string": "a string",
                 "list": "a list", "dict": "a mapping", "model": "a mapping"}
_BOUND_SYMBOLS = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<", "less_than_equal": "<="}
_HINT = "See docs/config.md, or write a valid template with `qbcompiler dump-config`."


def format_validation_error(err: ValidationError, source: str | None = None,
                            model: type[BaseModel] | None = None) -> str:
    """One line describing every error in ``err``.

    Example: ``config.yaml: calibration.maxPercentile.percentil: unknown key (allowed: percentile,
    topkRatio)``.

    Args:
        err: The pydantic error.
        source: What was validated (a file name, ``preset 'x'``); prefixed when given.
        model: The model validated at the root of the error locations (default CompileConfig).
    """
    root = model if model is not None else _compile_config()
    details = err.errors(include_url=False)
    lines = [_describe(detail, root) for detail in details[:MAX_LISTED_ERRORS]]
    if len(details) > MAX_LISTED_ERRORS:
        lines.append(f"and {len(details) - MAX_LISTED_ERRORS} more errors")
    text = "; ".join(lines)
    return f"{source}: {text}" if source else text


def config_error_from_validation(err: ValidationError, source: str | None = None, *,
                                 file: str | None = None, model: type[BaseModel] | None = None) -> ConfigError:
    """A ConfigError carrying the formatted message, the first offending key and the file."""
    root = model if model is not None else _compile_config()
    first = err.errors(include_url=False)[0]
    key = _walk(root, first["loc"])[0] or None
    return ConfigError(format_validation_error(err, source, root).rstrip(".") + ".", hint=_HINT, file=file, key=key)


def error_key_paths(err: ValidationError, model: type[BaseModel] | None = None) -> list[str]:
    """The dotted key path of every error (``preprocessing.pipeline[0].height``)."""
    root = model if model is not None else _compile_config()
    return [_walk(root, detail["loc"])[0] for detail in err.errors(include_url=False)]


def _compile_config() -> type[BaseModel]:
    from compiler_core.config.models import CompileConfig  # models imports this module

    return CompileConfig


def _describe(detail: ErrorDetails, root: type[BaseModel]) -> str:
    path, leaf, parent = _walk(root, detail["loc"])
    text = _explain(detail, leaf, parent)
    return f"{path}: {text}" if path else text


def _explain(detail: ErrorDetails, leaf: Any, parent: type[BaseModel] | None) -> str:
    kind, ctx = detail["type"], detail.get("ctx", {})
    if kind == "extra_forbidden":
        return _unknown_key(str(detail["loc"][-1]), parent)
    if kind == "missing":
        return "required key is missing"
    if kind in ("union_tag_invalid", "union_tag_not_found"):
        tags = ctx.get("expected_tags", "")
        given = f"unknown op {ctx['tag']!r}" if kind == "union_tag_invalid" else "missing 'op'"
        return f"{given} (allowed: {tags})"
    if kind in ("value_error", "assertion_error"):
        return detail["msg"].split(", ", 1)[-1]
    return f"expected {_expected(kind, ctx, leaf, detail['msg'])}, got {_show(detail['input'])}"


def _expected(kind: str, ctx: dict[str, Any], leaf: Any, msg: str) -> str:
    if isinstance(leaf, type) and issubclass(leaf, enum.IntEnum):
        return _enum_phrase(leaf)
    if kind == "literal_error":
        return f"one of {ctx['expected'].replace(' or ', ', ')}"
    if kind in _BOUND_SYMBOLS:
        bound = next(iter(ctx.values()))
        return f"a value {_BOUND_SYMBOLS[kind]} {bound}"
    if kind == "string_pattern_mismatch":
        return f"a string matching {ctx['pattern']}"
    prefix = kind.split("_", 1)[0]
    if prefix in _TYPE_PHRASES and kind.endswith(("_type", "_parsing", "_from_float")):
        return _TYPE_PHRASES[prefix]
    return msg.removeprefix("Input should be ")


def _enum_phrase(leaf: type[enum.IntEnum]) -> str:
    members = list(leaf)
    names = ", ".join(f"{member.value} {member.name}" for member in members)
    return f"an integer {members[0].value}-{members[-1].value} ({names})"


def _unknown_key(key: str, parent: type[BaseModel] | None) -> str:
    if parent is None:
        return "unknown key"
    allowed = [field.alias or name for name, field in parent.model_fields.items()]
    close = difflib.get_close_matches(key, allowed, n=1)
    suggestion = f"; did you mean '{close[0]}'?" if close else ""
    return f"unknown key{suggestion} (allowed: {', '.join(allowed)})"


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


# ------------------------------------------------ following an error location through the types


def _walk(root: type[BaseModel], loc: tuple[int | str, ...]) -> tuple[str, Any, type[BaseModel] | None]:
    """Dotted path of ``loc``, the annotation found there, and the model that holds the last key."""
    path, current, parent = "", root, None
    for part in loc:
        current = _unwrap(current)
        if _is_model(current):
            parent, current = current, _field_annotation(current, str(part))
            path = f"{path}.{part}" if path else str(part)
        elif _tagged_member(current, part) is not None:
            current = _tagged_member(current, part)
        elif isinstance(part, int):
            path, current = f"{path}[{part}]", _container_item(current)
        else:
            path, current = (f"{path}.{part}" if path else str(part)), _container_item(current)
    return path, _unwrap(current), parent


def _unwrap(annotation: Any) -> Any:
    while True:
        origin = typing.get_origin(annotation)
        if origin is typing.Annotated:
            annotation = typing.get_args(annotation)[0]
        elif origin in (Union, types.UnionType) and type(None) in typing.get_args(annotation):
            members = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
            annotation = members[0] if len(members) == 1 else Union[tuple(members)]  # noqa: UP007
        else:
            return annotation


def _is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _field_annotation(model: type[BaseModel], key: str) -> Any:
    for name, field in model.model_fields.items():
        if key in (name, field.alias):
            return field.annotation
    return None


def _tagged_member(annotation: Any, tag: int | str) -> Any:
    if typing.get_origin(annotation) not in (Union, types.UnionType):
        return None
    for member in typing.get_args(annotation):
        op = member.model_fields.get("op") if _is_model(member) else None
        if op is not None and typing.get_origin(op.annotation) is Literal and tag in typing.get_args(op.annotation):
            return member
    return None


def _container_item(annotation: Any) -> Any:
    args = typing.get_args(annotation)
    return args[-1] if args and typing.get_origin(annotation) in (list, dict) else None
