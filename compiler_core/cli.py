"""The ``qbcompiler`` command line: parse, check, info, presets, dump-config.

Errors print as one ``ERROR [CODE]: message`` line on stderr with a non-zero exit code. With
``QBCOMPILER_JSONL=1`` every stdout line is one JSON object (``status``, ``progress``, ``log``,
``result``, ``error``) and the stream ends with ``result`` or ``error``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from compiler_core import __version__
from compiler_core.errors import ArgumentError, InternalError, QBCompilerError
from compiler_core.progress import ProgressEvent

logger = logging.getLogger("compiler_core.cli")

EXIT_OK, EXIT_ERROR, EXIT_USAGE = 0, 1, 2
_NOISY_LOGGERS = ("onnxscript", "onnx_ir")


class _Parser(argparse.ArgumentParser):
    """argparse that reports usage errors in the ``ERROR [ARGUMENT_ERROR]`` form."""

    def error(self, message: str) -> NoReturn:
        raise ArgumentError(f"{message}.", hint=f"See `{self.prog} --help`.")


# -- output channels -----------------------------------------------------------------------------


class Output:
    """Human output: progress on stderr (when a terminal), results on stdout."""

    jsonl = False

    def __init__(self, quiet: bool = False) -> None:
        self.quiet = quiet
        self._tty = sys.stderr.isatty()

    def status(self, message: str) -> None:
        if not self.quiet:
            print(message, file=sys.stderr)

    def progress(self, event: ProgressEvent) -> None:
        if self.quiet or not self._tty:
            return
        total = f"/{event.total}" if event.total else ""
        print(f"\r[{event.stage}] {event.done}{total} {event.message}"[:100].ljust(100), end="", file=sys.stderr)
        if event.total and event.done >= event.total:
            print(file=sys.stderr)

    def result(self, payload: dict[str, Any], text: str) -> None:
        print(text)

    def error(self, error: QBCompilerError) -> None:
        print(error.one_line(), file=sys.stderr)


class JsonlOutput(Output):
    """Machine channel: one JSON object per stdout line."""

    jsonl = True

    def _emit(self, kind: str, **payload: Any) -> None:
        print(json.dumps({"type": kind, **payload}, default=str), flush=True)

    def status(self, message: str) -> None:
        self._emit("status", message=message)

    def progress(self, event: ProgressEvent) -> None:
        self._emit("progress", **event.to_dict())

    def result(self, payload: dict[str, Any], text: str) -> None:
        self._emit("result", **payload)

    def error(self, error: QBCompilerError) -> None:
        self._emit("error", **error.to_dict())


class _JsonlLogHandler(logging.Handler):
    def __init__(self, output: JsonlOutput) -> None:
        super().__init__(logging.INFO)
        self.output = output

    def emit(self, record: logging.LogRecord) -> None:
        self.output._emit("log", level=record.levelname.lower(), logger=record.name, message=record.getMessage())


# -- argument helpers ----------------------------------------------------------------------------


def _shape_pairs(items: Sequence[str] | None) -> dict[str, list[int]]:
    """``name=1,3,224,224`` (repeatable) -> ``{name: [1, 3, 224, 224]}``."""
    shapes = {}
    for item in items or []:
        name, sep, dims = item.partition("=")
        try:
            shapes[name] = [int(d) for d in dims.replace("x", ",").split(",") if d.strip()]
        except ValueError:
            shapes[name] = None
        if not sep or not name or not shapes[name]:
            raise ArgumentError(f"--input-shape '{item}' is not NAME=D0,D1,...", hint="Example: --input-shape input=1,3,224,224.")
    return shapes


def _bind_pairs(items: Sequence[str] | None) -> dict[str, Any]:
    """``name=value`` (repeatable, value a number or comma list) -> constants to bind."""
    import numpy as np

    bound = {}
    for item in items or []:
        name, sep, text = item.partition("=")
        try:
            values = [float(v) if "." in v or "e" in v.lower() else int(v) for v in text.split(",")]
        except ValueError:
            values = []
        if not sep or not name or not values:
            raise ArgumentError(f"--bind-input '{item}' is not NAME=VALUE", hint="Example: --bind-input sr=16000.")
        bound[name] = np.array(values[0] if len(values) == 1 else values)
    return bound


# -- commands ------------------------------------------------------------------------------------


def cmd_parse(args: argparse.Namespace, out: Output) -> dict[str, Any]:
    from compiler_core.api import mblt_compile, read_provenance

    config = _resolve_config(args)
    output = args.output or str(Path(args.model).with_suffix(".mblt").name)
    started = time.perf_counter()
    path = mblt_compile(args.model, output, backend=config.backend, target_device=config.target_device,
                        input_shape_dict=config.input_shape_dict, constant_inputs=_bind_pairs(args.bind_input),
                        callback=out.progress)
    elapsed = time.perf_counter() - started
    summary = _mblt_summary(path)
    payload = {"command": "parse", "output": str(path), "seconds": round(elapsed, 3), **summary,
               "provenance": read_provenance(path)}
    text = (f"Wrote {path} ({summary['nodes']} nodes, {summary['size_bytes'] / 1e6:.2f} MB) in {elapsed:.2f} s\n"
            f"ops: {_ops_text(summary['ops'])}")
    if config.target_device:
        report = _support_report(path, config.target_device)
        payload["support"] = report.counts()
        text += f"\nsupport on {config.target_device}: {_counts_text(report.counts())}"
    out.result(payload, text)
    return payload


def cmd_check(args: argparse.Namespace, out: Output) -> dict[str, Any]:
    from compiler_core.targets import format_report_table

    if bool(args.model) == bool(args.mblt):
        raise ArgumentError("Give exactly one of --model or --mblt.", hint="Example: qbcompiler check --mblt m.mblt --target-device aries-rb.")
    if args.mblt:
        report = _support_report(args.mblt, args.target_device)
    else:
        report = _support_report_for_model(args, out)
    payload = {"command": "check", **report.to_dict()}
    text = payload if args.json else format_report_table(report, only_flagged=not args.all)
    out.result(payload, json.dumps(text, indent=2) if args.json else text)
    return payload


def cmd_info(args: argparse.Namespace, out: Output) -> dict[str, Any]:
    from compiler_core.api import read_provenance

    if not args.mblt:
        raise ArgumentError("Give --mblt FILE.", hint="Example: qbcompiler info --mblt model.mblt.")
    payload = {"command": "info", "file": args.mblt, "provenance": read_provenance(args.mblt), **_mblt_summary(args.mblt)}
    out.result(payload, json.dumps(payload, indent=2))
    return payload


def cmd_presets(args: argparse.Namespace, out: Output) -> dict[str, Any]:
    from compiler_core.config import describe_presets

    presets = describe_presets()
    width = max(len(name) for name in presets)
    out.result({"command": "presets", "presets": presets},
               "\n".join(f"{name.ljust(width)}  {description}" for name, description in presets.items()))
    return presets


def cmd_dump_config(args: argparse.Namespace, out: Output) -> dict[str, Any]:
    from compiler_core.config import dump_default_config

    path = dump_default_config(args.output, preset=args.preset)
    payload = {"command": "dump-config", "output": str(path), "preset": args.preset}
    out.result(payload, f"Wrote {path}" + (f" (preset {args.preset})" if args.preset else ""))
    return payload


def _resolve_config(args: argparse.Namespace):
    """The CompileConfig from --compile-config/--config-preset with the explicit flags on top."""
    from compiler_core.config import resolve_config

    return resolve_config(compile_config=args.compile_config, config_preset=getattr(args, "config_preset", None),
                          backend=args.backend, target_device=args.target_device,
                          input_shape_dict=_shape_pairs(args.input_shape) or None)


def _support_report(mblt_path: str | Path, device: str):
    from compiler_core.mblt.io import load_mblt
    from compiler_core.targets import check_support, get_device

    get_device(device)  # validate the string before reading the model
    return check_support(load_mblt(mblt_path), device)


def _support_report_for_model(args: argparse.Namespace, out: Output):
    from compiler_core.api import parse_model
    from compiler_core.targets import check_support, get_device

    get_device(args.target_device)
    graph, _ = parse_model(args.model, backend=args.backend, input_shape_dict=_shape_pairs(args.input_shape),
                           constant_inputs=_bind_pairs(args.bind_input), callback=out.progress)
    return check_support(graph, args.target_device)


def _mblt_summary(path: str | Path) -> dict[str, Any]:
    import onnx

    proto = onnx.load(str(path), load_external_data=False)
    ops = Counter(node.op_type for node in proto.graph.node)
    return {"size_bytes": Path(path).stat().st_size, "nodes": len(proto.graph.node),
            "ops": dict(ops.most_common()), "opset": next((o.version for o in proto.opset_import if o.domain == ""), None),
            "inputs": [_value_text(v) for v in proto.graph.input],
            "outputs": [_value_text(v) for v in proto.graph.output]}


def _value_text(value) -> dict[str, Any]:
    dims = [d.dim_value if d.HasField("dim_value") else d.dim_param for d in value.type.tensor_type.shape.dim]
    return {"name": value.name, "shape": dims}


def _ops_text(ops: dict[str, int]) -> str:
    return ", ".join(f"{op} x{count}" for op, count in ops.items())


def _counts_text(counts: dict[str, int]) -> str:
    return ", ".join(f"{count} {status}" for status, count in counts.items())


# -- parser --------------------------------------------------------------------------------------


def _add_model_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backend", choices=["onnx", "torch", "torchscript", "tf", "tflite"],
                        help="source format (default: detected from the file)")
    parser.add_argument("--input-shape", action="append", metavar="NAME=D0,D1,...",
                        help="static shape for an input with dynamic dims (repeatable)")
    parser.add_argument("--bind-input", action="append", metavar="NAME=VALUE",
                        help="bind an input to a constant, e.g. sr=16000 (repeatable)")


def build_parser() -> argparse.ArgumentParser:
    """The argparse tree of ``qbcompiler``."""
    parser = _Parser(prog="qbcompiler", description="qb Compiler (open implementation): source model -> MBLT -> MXQ.")
    parser.add_argument("--version", action="version", version=f"qbcompiler {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more log output (-vv for debug)")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress output")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    parse = sub.add_parser("parse", help="parse a source model to a canonical MBLT")
    parse.add_argument("--model", required=True, help="source model file")
    parse.add_argument("--output", "-o", help="output .mblt (default: <model name>.mblt in the current folder)")
    parse.add_argument("--target-device", help="also report device support (aries-rb, regulus-ra, ...)")
    parse.add_argument("--compile-config", metavar="FILE", help="JSON/YAML CompileConfig (inputShapeDict, backend ...)")
    _add_model_options(parse)
    parse.set_defaults(handler=cmd_parse)

    check = sub.add_parser("check", help="list which layers a device supports")
    check.add_argument("--model", help="source model file (parsed in memory)")
    check.add_argument("--mblt", help="parsed MBLT file")
    check.add_argument("--target-device", required=True, help="aries-rb, regulus-ra, regulus-rb or regulus-rb-usb")
    check.add_argument("--json", action="store_true", help="print the report as JSON")
    check.add_argument("--all", action="store_true", help="list every node, not only flagged ones")
    _add_model_options(check)
    check.set_defaults(handler=cmd_check)

    info = sub.add_parser("info", help="show an MBLT's provenance and summary")
    info.add_argument("--mblt", help="MBLT file")
    info.set_defaults(handler=cmd_info)

    presets = sub.add_parser("presets", help="list configuration presets")
    presets.set_defaults(handler=cmd_presets)

    dump = sub.add_parser("dump-config", help="write a default (or preset) compile configuration")
    dump.add_argument("--output", "-o", required=True, help="x.json, x.yaml or x.yml")
    dump.add_argument("--preset", help="start from this preset")
    dump.set_defaults(handler=cmd_dump_config)
    return parser


def _configure_logging(verbosity: int, out: Output) -> None:
    root = logging.getLogger()
    root.handlers.clear()
    if out.jsonl:
        root.addHandler(_JsonlLogHandler(out))
    else:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        root.addHandler(handler)
    root.setLevel(logging.DEBUG if verbosity > 1 else logging.INFO if verbosity else logging.WARNING)
    for name in _NOISY_LOGGERS:
        logging.getLogger(name).setLevel(logging.DEBUG if verbosity > 1 else logging.ERROR)


def run(argv: Sequence[str] | None = None) -> int:
    """Run the CLI with ``argv``; returns the exit code."""
    out: Output = JsonlOutput() if os.environ.get("QBCOMPILER_JSONL") == "1" else Output()
    try:
        args = build_parser().parse_args(argv)
        out.quiet = args.quiet
        _configure_logging(args.verbose, out)
        if not args.command:
            raise ArgumentError("No command given.", hint="Run `qbcompiler --help` to list the commands.")
        handler: Callable[[argparse.Namespace, Output], Any] = args.handler
        handler(args, out)
        return EXIT_OK
    except QBCompilerError as error:
        logger.debug("error details", exc_info=True)
        out.error(error)
        return EXIT_ERROR
    except BrokenPipeError:  # output piped into `head` and closed early
        sys.stderr.close()
        return EXIT_OK
    except KeyboardInterrupt:
        out.error(QBCompilerError("Interrupted."))
        return 130
    except Exception as error:  # a bug: one line for the user, the traceback in the log
        logger.debug("internal error", exc_info=True)
        out.error(InternalError(f"Unexpected {type(error).__name__}: {error}.",
                                hint="Please report this with the output of the same command run with -vv."))
        return EXIT_ERROR


def main() -> None:
    """Console-script entry point."""
    sys.exit(run())


if __name__ == "__main__":
    main()
