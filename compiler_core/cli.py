"""The ``qbcompiler`` command line: parse, check, compile, sweep, info, presets, dump-config ...

Errors print as one ``ERROR [CODE]: message`` line on stderr with a non-zero exit code. With
``QBCOMPILER_JSONL=1`` every stdout line is one JSON object (``status``, ``progress``, ``log``,
``point`` (one per finished sweep point), ``result``, ``error``) and the stream ends with ``result``
or ``error``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
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

    def point(self, record: dict[str, Any]) -> None:
        self.status(_point_text(record))

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

    def point(self, record: dict[str, Any]) -> None:
        self._emit("point", **record)

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


def _names(items: list[str] | None) -> list[str] | None:
    """``--output-names a,b --output-names c`` -> ``["a", "b", "c"]`` (None when not given)."""
    names = [name.strip() for item in items or [] for name in item.split(",") if name.strip()]
    return names or None


# -- commands ------------------------------------------------------------------------------------


def cmd_parse(args: argparse.Namespace, out: Output) -> dict[str, Any]:
    from compiler_core.api import mblt_compile, read_provenance

    config = _resolve_config(args)
    output = args.output or str(Path(args.model).with_suffix(".mblt").name)
    if not config.backend:
        from compiler_core.frontends.llm import is_causal_lm_source

        if is_causal_lm_source(args.model):
            return _parse_llm(args, out, output, config.target_device)
    started = time.perf_counter()
    path = mblt_compile(args.model, output, backend=config.backend, target_device=config.target_device,
                        input_shape_dict=config.input_shape_dict, constant_inputs=_bind_pairs(args.bind_input),
                        output_names=_names(args.output_names), callback=out.progress, **_frontend_options(args))
    elapsed = time.perf_counter() - started
    summary = _mblt_summary(path)
    payload = {"command": "parse", "output": str(path), "seconds": round(elapsed, 3), **summary,
               "provenance": read_provenance(path)}
    text = (f"Wrote {path} ({summary['nodes']} nodes, {summary['size_bytes'] / 1e6:.2f} MB) in {elapsed:.2f} s\n"
            f"ops: {_ops_text(summary['ops'])}")
    if config.target_device:
        report, _ = _support_report(path, config.target_device)
        payload["support"] = report.counts()
        text += f"\nsupport on {config.target_device}: {_counts_text(report.counts())}"
    out.result(payload, text)
    return payload


def _parse_llm(args: argparse.Namespace, out: Output, output: str, device: str | None) -> dict[str, Any]:
    """A decoder LLM -> its prefill MBLT at ``output`` and its decode MBLT beside it (``X.decode.mblt``)."""
    from compiler_core.llm import decode_mblt_path, parse_llm

    started = time.perf_counter()
    paths = parse_llm(args.model, output, decode_mblt_path(output), callback=out.progress)
    elapsed = time.perf_counter() - started
    payload: dict[str, Any] = {"command": "parse", "output": str(paths[0]), "seconds": round(elapsed, 3), "graphs": {}}
    lines = []
    for kind, path in zip(("prefill", "decode"), paths, strict=True):
        summary = _mblt_summary(path)
        payload["graphs"][kind] = {"output": str(path), **summary}
        lines.append(f"{kind}: {path} ({summary['nodes']} nodes, {summary['size_bytes'] / 1e6:.2f} MB)")
        if device:
            counts = _support_report(path, device)[0].counts()
            payload["graphs"][kind]["support"] = counts
            lines[-1] += f"; support on {device}: {_counts_text(counts)}"
    out.result(payload, f"Wrote a decoder LLM's two graphs in {elapsed:.2f} s\n" + "\n".join(lines)
               + f"\nCompile it with: qbcompiler compile --model {args.model} --output NAME.llm.json "
               "--calib-data-path TEXT.txt")
    return payload


def cmd_check(args: argparse.Namespace, out: Output) -> dict[str, Any]:
    from compiler_core.targets import format_report_table, get_device

    if bool(args.model) == bool(args.mblt):
        raise ArgumentError("Give exactly one of --model or --mblt.", hint="Example: qbcompiler check --mblt m.mblt --target-device aries-rb.")
    if args.model and (args.max_len is not None or str(args.model).lower().endswith(".gguf")):
        return _check_llm(args, out)
    if args.mblt:
        report, plan = _support_report(args.mblt, args.target_device, _resolve_config(args))
    else:
        report, plan = _support_report_for_model(args, out)
    fits = report.all_supported or (plan is not None and plan.npu_ready)  # _checked ran the fit check then
    payload = {"command": "check", **report.to_dict(), "fit_checked": fits}
    if plan is not None:
        payload["cpu_offload"] = plan.to_dict()
    text = payload if args.json else format_report_table(report, only_flagged=not args.all) + (
        f"\nfit: every layer tiles within a core's {get_device(args.target_device).sram_bytes_per_core // 1024:,} KiB"
        if fits else "\nfit: not checked (flagged nodes have no NPU kernel)") + (_plan_text(plan) if plan else "") + (
        f"\nwhat to do: {report.unsupported_error().hint}" if plan is None and report.blocking() else "")
    out.result(payload, json.dumps(text, indent=2) if args.json else text)
    return payload


def _check_llm(args: argparse.Namespace, out: Output) -> dict[str, Any]:
    """Memory fit of a decoder LLM (weights + KV cache vs the device); refused with the numbers."""
    from compiler_core.frontends.llm import DEFAULT_MAX_LEN, load_causal_lm
    from compiler_core.llm import check_memory_fit

    model, _ = load_causal_lm(args.model)
    fit = check_memory_fit(model.config, args.target_device, args.max_len or DEFAULT_MAX_LEN)
    payload = {"command": "check", "device": args.target_device, "llm_memory": fit}
    device = f"{fit['device_bytes'] / 1e9:.2f} GB" if fit["device_bytes"] else "not documented"
    text = (f"{args.target_device}: weights {fit['weights_bytes'] / 1e6:.1f} MB (prefill + decode copies) + KV cache "
            f"{fit['kv_cache_bytes'] / 1e6:.1f} MB ({fit['max_len']} positions) = {fit['total_bytes'] / 1e6:.1f} MB; "
            f"device memory {device}: fits")
    out.result(payload, json.dumps(payload, indent=2) if args.json else text)
    return payload


def cmd_info(args: argparse.Namespace, out: Output) -> dict[str, Any]:
    from compiler_core.api import read_provenance

    if bool(args.mblt) == bool(args.mxq):
        raise ArgumentError("Give exactly one of --mblt FILE or --mxq FILE.",
                            hint="Example: qbcompiler info --mxq model.mxq.")
    if args.mxq:
        from compiler_core.runtime import get_model_summary

        payload = {"command": "info", "file": args.mxq, **get_model_summary(args.mxq)}
        out.result(payload, json.dumps(payload, indent=2))
        return payload
    payload = {"command": "info", "file": args.mblt, "provenance": read_provenance(args.mblt), **_mblt_summary(args.mblt)}
    out.result(payload, json.dumps(payload, indent=2))
    return payload


def cmd_profile(args: argparse.Namespace, out: Output) -> dict[str, Any]:
    from compiler_core.runtime.profile import format_profile, profile_mxq

    report = profile_mxq(args.mxq, [args.core_mode] if args.core_mode else None)
    payload = {"command": "profile", **report}
    out.result(payload, json.dumps(payload, indent=2) if args.json else format_profile(report, args.top))
    return payload


def cmd_extract_body(args: argparse.Namespace, out: Output) -> dict[str, Any]:
    from compiler_core.api import get_body_subgraph, read_provenance

    path = get_body_subgraph(args.mblt, args.output, args.target_device)
    summary = _mblt_summary(path)
    cut = read_provenance(path).get("body_of") or {}
    payload = {"command": "extract-body", "output": str(path), **summary,
               "cpu_head": cut.get("cpu_head", []), "cpu_tail": cut.get("cpu_tail", [])}
    out.result(payload, f"Wrote {path} ({summary['nodes']} nodes; left out {len(payload['cpu_head'])} head and "
                        f"{len(payload['cpu_tail'])} tail node(s) that {args.target_device} cannot run)")
    return payload


def cmd_validate(args: argparse.Namespace, out: Output) -> dict[str, Any]:
    path = Path(args.file)
    if path.suffix.lower() == ".mxq":
        from compiler_core.mxq import validate_mxq
        from compiler_core.runtime.artifact import load_artifact

        report = validate_mxq(path)
        if report.get("ok"):
            artifact = load_artifact(path)  # also checks that the program is consistent
            report["operations"] = len(artifact.program.ops)
    else:
        report = _validate_mblt(path)
    payload = {"command": "validate", "file": str(path), **report}
    if not payload.get("ok"):
        from compiler_core.errors import MxqFormatError

        raise MxqFormatError(f"{path.name} is invalid: {'; '.join(payload.get('problems', []))}.",
                             hint="Compile or parse it again.", file=str(path))
    out.result(payload, f"{path.name}: OK ({payload.get('kind', 'MXQ')})")
    return payload


def _validate_mblt(path: Path) -> dict[str, Any]:
    import onnx

    from compiler_core.mblt.io import load_mblt

    model = load_mblt(path)
    problems = []
    try:
        onnx.checker.check_model(str(path), full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as error:
        problems.append(f"onnx.checker: {str(error).splitlines()[0]}")
    dynamic = [v.name for n in model.graph for v in n.outputs
               if v.shape is None or not all(isinstance(d, int) for d in v.shape)]
    if dynamic:
        problems.append(f"{len(dynamic)} value(s) without a static shape (e.g. {dynamic[0]})")
    return {"ok": not problems, "kind": "MBLT", "nodes": model.graph.num_nodes(), "problems": problems}


def cmd_run(args: argparse.Namespace, out: Output) -> dict[str, Any]:
    import numpy as np

    from compiler_core.runtime import Accelerator, Model, ModelConfig
    from compiler_core.runtime.inputs import class_scores, load_run_inputs, readable_inputs, top_k
    from compiler_core.runtime.profile import cpu_parts

    if args.prompt is not None:
        return _run_prompt(args, out)
    if not args.input:
        raise ArgumentError("No input given.", hint="Pass --input FILE (or --prompt TEXT with an .llm.json model).")
    paths, failed = readable_inputs(args.input)  # the others run; the unreadable ones are reported at the end
    config = ModelConfig()
    if args.core_mode and args.core_mode != "auto":
        getattr(config, f"set_{args.core_mode}_core_mode")()
    model = Model(args.mxq, config, input_layout="NCHW")
    model.launch(Accelerator(model.artifact.device))
    labels = Path(args.labels).read_text().splitlines() if args.labels else None
    classes = class_scores(model.artifact)  # top-k only for class scores (not landmarks, boxes, embeddings)
    results, written = [], []
    for sample, feeds in load_run_inputs(model.artifact, paths):
        started = time.perf_counter()
        outputs = model.infer(feeds)
        elapsed = time.perf_counter() - started
        files = [_display_path(source.describe()) for source in sample.sources]
        # a manifest entry (one file per model input) is shown by its short name; "files" lists them all
        entry = {"input": files[0] if len(files) == 1 else sample.label(), "files": files,
                 "seconds": round(elapsed, 4), "outputs": []}
        for spec, value in zip(model.artifact.output_specs, outputs):
            entry["outputs"].append({"name": spec.name, "shape": list(value.shape),
                                     **(top_k(value, args.top_k, labels) if classes.get(spec.name) else {})})
            if args.output_dir:
                target = Path(args.output_dir) / f"{_output_stem(sample.sources[0])}.{spec.name}.npy"
                target.parent.mkdir(parents=True, exist_ok=True)
                np.save(target, value)
                written.append(str(target))
        results.append(entry)
    payload = {"command": "run", "device": model.artifact.device, "core_mode": model.core_mode,
               "estimate": model.estimate(), "results": results, "written": written,
               "cpu_parts": cpu_parts(model.artifact.meta),
               "failed": [{"input": _display_path(name), "error": reason} for name, reason in failed.items()]}
    model.dispose()
    out.result(payload, _run_text(payload))
    if failed:
        from compiler_core.calibration.preprocess import IMAGE_FORMAT_NAMES
        from compiler_core.errors import CalibrationError

        listed = "; ".join(f"{entry['input']}: {entry['error']}" for entry in payload["failed"][:5])
        raise CalibrationError(f"{len(failed)} of the {len(args.input)} input file(s) cannot be read and were not run "
                               f"(the others were): {listed}{'; ...' if len(failed) > 5 else ''}.",
                               hint=f"Re-save or remove them; {IMAGE_FORMAT_NAMES} images, .wav recordings and .npy arrays "
                                    "can be read.",
                               files=list(failed))
    return payload


def _run_prompt(args: argparse.Namespace, out: Output) -> dict[str, Any]:
    """Greedy generation from a text prompt with a compiled LLM (``.llm.json``), tokens streamed to stdout."""
    from compiler_core.llm import manifest_estimate
    from compiler_core.runtime.llm import LlmModel

    lm = LlmModel(args.mxq)
    tokenizer = lm.tokenizer()
    if tokenizer is None:
        raise ArgumentError(f"{Path(args.mxq).name} has no tokenizer, so a text prompt cannot be encoded.",
                            hint="Compile from a GGUF file or a transformers folder with a tokenizer.")
    ids = tokenizer(args.prompt)["input_ids"]
    streamed: list[int] = []
    printed = ""

    def show(token: int) -> None:
        nonlocal printed
        streamed.append(token)
        text = tokenizer.decode(streamed, skip_special_tokens=True)
        if not out.quiet and not out.jsonl:
            sys.stdout.write(text[len(printed):])
            sys.stdout.flush()
        printed = text

    generation = lm.generate(ids, args.max_new_tokens, on_token=show)
    if not out.quiet and not out.jsonl:
        sys.stdout.write("\n")
    payload = {"command": "run", "prompt": args.prompt, "prompt_tokens": len(ids), "text": printed,
               **generation.to_dict(), "estimate": manifest_estimate(lm.manifest, Path(args.mxq).parent, len(ids))}
    timing = generation.to_dict()
    per_token = timing["decode_seconds_per_token"]
    out.result(payload, f"{len(generation.tokens)} tokens; simulator prefill {timing['prefill_seconds']:.2f} s"
                        + (f", {per_token * 1e3:.0f} ms per decode step" if per_token else ""))
    return payload


def _output_stem(source: Any) -> str:
    """The file-name stem of a sample's saved outputs: its input file's stem, with a recording window's start (the
    windows of one .wav file wrote one file, each over the last)."""
    stem = Path(getattr(source, "path", source.describe())).stem
    start = getattr(source, "start", None)
    return stem if start is None else f"{stem}@{start}"


def _display_path(name: str) -> str:
    """Paths under the current folder are shown relative to it."""
    path = Path(name)
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return name


def _ms(value: float) -> str:
    """Milliseconds to three decimals, or to two significant digits below 0.01 ms (a tiny model read "0.000 ms")."""
    return f"{value:.3f}" if value >= 0.01 or value == 0 else f"{value:.2g}"


def _run_text(payload: dict[str, Any]) -> str:
    estimate = payload["estimate"]
    from compiler_core.runtime.profile import host_note

    note = host_note(payload.get("cpu_parts") or [])
    host = f" ({note})" if note else ""
    lines = [f"{payload['device']} ({payload['core_mode']}): estimated {_ms(estimate['latency_ms'])} ms per "
             f"inference, {estimate['throughput_fps']:.0f} FPS on the device{host}"]
    for entry in payload["results"]:
        for output in entry["outputs"]:
            top = ", ".join(f"{t.get('label', t['index'])} ({t['score']:.3f})" for t in output.get("top_k", []))
            lines.append(f"{entry['input']}: {output['name']} {output['shape']}" + (f" top-k: {top}" if top else ""))
    lines.extend(f"Wrote {path}" for path in payload["written"])
    return "\n".join(lines)


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


def cmd_quantize(args: argparse.Namespace, out: Output) -> dict[str, Any]:
    from compiler_core.api import quantize
    from compiler_core.fileio import atomic_write_text
    from compiler_core.quantization.qdq import save_qdq

    if args.output:
        return _compile(args, out, model=args.mblt)
    started = time.perf_counter()
    result = quantize(args.mblt, args.calib_data_path, compile_config=args.compile_config,
                      config_preset=args.config_preset, use_random_calib=args.use_random_calib or None,
                      target_device=args.target_device, device=args.device, callback=out.progress)
    elapsed = time.perf_counter() - started
    written = []
    if args.qdq_output:
        written.append(str(save_qdq(args.mblt, result.model, args.qdq_output)))
    if args.analysis_output:
        written.append(str(atomic_write_text(args.analysis_output, json.dumps(result.analysis, indent=2))))
    payload = {"command": "quantize", "seconds": round(elapsed, 3), "summary": result.model.summary(),
               "samples": result.samples, "statistics_from_cache": result.statistics_from_cache,
               "timings": result.timings, "analysis": result.analysis.get("summary", {}),
               "outputs": result.analysis.get("outputs", {}), "written": written}
    out.result(payload, _quantize_text(payload))
    return payload


def cmd_compile(args: argparse.Namespace, out: Output) -> dict[str, Any]:
    return _compile(args, out, model=args.model)


def _compile(args: argparse.Namespace, out: Output, *, model: str) -> dict[str, Any]:
    from compiler_core.api import mxq_compile

    if not args.output:
        raise ArgumentError("No output file given.", hint="Pass --output model.mxq.")
    if str(args.output).endswith(".llm.json"):
        return _compile_llm(args, out, model=model)
    started = time.perf_counter()
    options = {"input_shape_dict": _shape_pairs(getattr(args, "input_shape", None)) or None,
               "constant_inputs": _bind_pairs(getattr(args, "bind_input", None)) or None,
               "output_names": _names(getattr(args, "output_names", None)),
               "backend": getattr(args, "backend", None), **_frontend_options(args)}
    options = {k: v for k, v in options.items() if v is not None}
    with tempfile.TemporaryDirectory(prefix="qbcompiler-text-") as folder:
        calib_data_path = args.calib_data_path
        if getattr(args, "calib_text", None):
            model, calib_data_path = _text_calibration(args, model, options, Path(folder))
            options = {}  # parsed already
        result = mxq_compile(model, target_device=args.target_device, calib_data_path=calib_data_path,
                             save_path=args.output, compile_config=args.compile_config,
                             config_preset=args.config_preset, use_random_calib=args.use_random_calib or None,
                             cpu_offload=args.cpu_offload, cpu_layers=_cpu_layers(args),
                             inference_scheme=args.inference_scheme, device=args.device,
                             config_save_path=args.config_save_path, mixed_precision_config=_mixed_precision_option(args),
                             callback=out.progress, **options)
    payload = {"command": args.command, "seconds": round(time.perf_counter() - started, 3), **result.to_dict(),
               "config_preset": args.config_preset}
    out.result(payload, _compile_text(payload))
    return payload


def _mixed_precision_option(args: argparse.Namespace) -> dict[str, Any] | None:
    """``--mixed-precision KIND=VALUE`` (and its limits) as a mixedPrecision sub-config, or None."""
    section: dict[str, Any] = {}
    if getattr(args, "mixed_precision", None):
        kind, _, value = args.mixed_precision.partition("=")
        if kind not in ("cosine", "sqnrDb", "top1") or not value:
            raise ArgumentError(f"--mixed-precision '{args.mixed_precision}' is not KIND=VALUE.",
                                hint="Use cosine=0.99, sqnrDb=30 or top1=0.95.")
        try:
            section = {"apply": True, "target": {"kind": kind, "value": float(value)}}
        except ValueError as error:
            raise ArgumentError(f"--mixed-precision value '{value}' is not a number.",
                                hint="Use cosine=0.99, sqnrDb=30 or top1=0.95.") from error
    for key, name in (("maxInt16Fraction", "max_int16_fraction"), ("latencyBudget", "latency_budget")):
        if getattr(args, name, None) is not None:
            section[key] = getattr(args, name)
    if getattr(args, "mixed_precision_statistic", None):
        section.setdefault("target", {})["statistic"] = args.mixed_precision_statistic
    return section or None


def cmd_analyze(args: argparse.Namespace, out: Output) -> dict[str, Any]:
    from compiler_core.api import sensitivity
    from compiler_core.fileio import atomic_write_text

    started = time.perf_counter()
    report = sensitivity(args.mblt, args.calib_data_path, compile_config=args.compile_config,
                         config_preset=args.config_preset, use_random_calib=args.use_random_calib or None,
                         target_device=args.target_device, samples=args.samples, split=args.split,
                         callback=out.progress)
    document = report.to_dict()
    written = [str(atomic_write_text(args.output, json.dumps(document, indent=2)))] if args.output else []
    payload = {"command": "analyze", "seconds": round(time.perf_counter() - started, 3), "samples": report.samples,
               "variants": report.variants, "baseline": report.baseline, "layers": report.layers[:args.top],
               "written": written}
    out.result(payload, _analyze_text(payload))
    return payload


def _analyze_text(payload: dict[str, Any]) -> str:
    base = payload["baseline"]
    lines = [f"Sensitivity of {len(payload['layers'])} most sensitive layer(s) ({payload['variants']} proxy runs, "
             f"{payload['seconds']:.1f} s); everything quantized: SQNR {_number(base['sqnr_db'])} dB, "
             f"cosine {_number(base['cosine'], 5)}",
             f"{'rank':>4}  {'layer':32s} {'op':14s} {'alone dB':>9s} {'int16 +dB':>9s} {'clip %':>7s} {'rmse/s':>7s}"]
    for row in payload["layers"]:
        point = row.get("point") or {}
        clip = point.get("clip_ratio")
        lines.append(f"{row['rank']:>4}  {row['layer'][:32]:32s} {row['op'][:14]:14s} "
                     f"{_number(row['alone']['sqnr_db']):>9s} {_number(row['gain_db']):>9s} "
                     f"{_number(None if clip is None else 100 * clip, 3):>7s} "
                     f"{_number(point.get('rmse_over_scale'), 2):>7s}")
    lines.extend(f"Wrote {path}" for path in payload["written"])
    return "\n".join(lines)


def _text_calibration(args: argparse.Namespace, model: str, options: dict[str, Any], folder: Path) -> tuple[str, list[str]]:
    """``--calib-text``: the model parsed into ``folder`` (an MBLT is used as it is) and its calibration manifest of
    the tokenized sentences; returns ``(MBLT, [manifest])``."""
    from compiler_core.api import mblt_compile
    from compiler_core.calibration import input_specs, make_calib_text, tokenizer_folder
    from compiler_core.mblt.io import load_mblt

    if args.calib_data_path or args.use_random_calib:
        raise ArgumentError("--calib-text replaces --calib-data-path and --use-random-calib; give one of them.")
    tokenizer = args.tokenizer or tokenizer_folder(model)
    if tokenizer is None:
        raise ArgumentError("--calib-text needs the model's tokenizer.",
                            hint="Pass --tokenizer FOLDER (a transformers model or tokenizer folder) or "
                                 "--tokenizer tokenizer.json; a transformers model folder given as the model is used "
                                 "by itself.")
    mblt = model if str(model).endswith(".mblt") else str(mblt_compile(model, folder / "model.mblt", **options))
    manifest = make_calib_text(args.calib_text, tokenizer, input_specs(load_mblt(mblt)), folder, "calib_text", -1)
    return mblt, [str(manifest)]


def _number(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _compile_llm(args: argparse.Namespace, out: Output, *, model: str) -> dict[str, Any]:
    """A decoder LLM -> prefill and decode MXQs + the ``.llm.json`` manifest (calibration: text files)."""
    from compiler_core.frontends.llm import DEFAULT_MAX_LEN, DEFAULT_PREFILL_LEN
    from compiler_core.llm import compile_llm

    if not args.calib_data_path:
        raise ArgumentError("An LLM needs calibration text.", hint="Pass --calib-data-path FILE.txt (plain text).")
    text = "\n".join(Path(path).read_text(encoding="utf-8", errors="replace") for path in args.calib_data_path)
    started = time.perf_counter()
    manifest = compile_llm(model, args.output, target_device=args.target_device or "aries-rb",
                           prefill_len=args.prefill_len or DEFAULT_PREFILL_LEN, max_len=args.max_len or DEFAULT_MAX_LEN,
                           calib_text=text, num_samples=args.calib_samples, config_preset=args.config_preset or "llm",
                           inference_scheme=args.inference_scheme, callback=out.progress)
    results = manifest.pop("results")
    payload = {"command": args.command, "seconds": round(time.perf_counter() - started, 3), "output": args.output,
               **manifest, "compiles": {kind: result.to_dict() for kind, result in results.items()}}
    out.result(payload, f"Wrote {args.output} ({manifest['prefill']}, {manifest['decode']}) in {payload['seconds']:.0f} s")
    return payload


def cmd_sweep(args: argparse.Namespace, out: Output) -> dict[str, Any]:
    from compiler_core.sweep import make_executor, run_sweep

    options = {"input_shape_dict": _shape_pairs(args.input_shape) or None,
               "constant_inputs": _bind_pairs(args.bind_input) or None, "backend": args.backend,
               "output_names": _names(args.output_names),
               **_frontend_options(args)}
    result = run_sweep(args.grid, args.output_dir, model=args.model, mblt=args.mblt,
                       calib_data_path=args.calib_data_path, target_device=args.target_device,
                       use_random_calib=args.use_random_calib or None,
                       executor=make_executor(args.executor, args.workers, args.ray_address), callback=out.progress, on_point=out.point,
                       **({k: v for k, v in options.items() if v is not None} if args.model else {}))
    payload = {"command": "sweep", **result.to_dict()}
    if args.report:
        from compiler_core.sweep.report import write_report

        payload["report"] = str(write_report(result.to_dict(), args.report))
    out.result(payload, _sweep_text(payload))
    return payload


def _point_text(record: dict[str, Any]) -> str:
    if record["status"] != "ok":
        return f"{record['name']} {record['status']}: {(record.get('error') or {}).get('message', '')}"
    sqnr = f"{record['worst_sqnr_db']:.1f} dB" if record.get("worst_sqnr_db") is not None else "no analysis"
    latency = f"{_ms(record['latency_ms'])} ms (estimate)" if record.get("latency_ms") is not None else ""
    return f"{record['name']} ok in {record['compile_seconds']:.1f} s: worst SQNR {sqnr}, {latency} [{_axes_text(record)}]"


def _axes_text(record: dict[str, Any]) -> str:
    return ", ".join(f"{axis}={value}" for axis, value in record["axes"].items())


def _sweep_text(payload: dict[str, Any]) -> str:
    seconds = payload["seconds"]
    lines = [f"Swept {payload['points']} points ({payload['ok']} ok) in {seconds['total']:.1f} s; "
             f"{payload['calibrations']} calibration run(s) in {seconds.get('calibrate', 0):.1f} s"]
    for record in payload["records"]:
        marker = "*" if record.get("pareto") else " "
        lines.append(f" {marker} {_point_text(record)}")
    lines.append("  * on the Pareto front (worst output SQNR vs estimated latency)")
    lines.append(f"Wrote {payload['json']} and {payload['csv']}"
                 + (f" and the report {payload['report']}" if payload.get("report") else ""))
    return "\n".join(lines)


def _compile_text(payload: dict[str, Any]) -> str:
    lines = [f"Wrote {payload['output']} ({payload['size_bytes'] / 1e6:.2f} MB) for {payload['device']} "
             f"[{', '.join(payload['core_modes'])}] in {payload['seconds']:.1f} s"]
    samples = payload["samples"]
    lines.append(f"  {payload['program']['operations']} NPU operations, {payload['program']['int16_tensors']} int16 "
                 f"tensors; calibrated on {samples['calibration']} samples"
                 f"{' (cached statistics)' if payload['statistics_from_cache'] else ''}")
    if payload["cpu_offload"]:
        lines.append(f"  CPU offload: head={payload['cpu_offload']['head']} tail={payload['cpu_offload']['tail']}")
    mixed = payload.get("mixed_precision")
    if mixed:
        target = mixed["target"]
        worst = " (worst sample)" if target.get("statistic") == "worst" else ""
        lines.append(f"  mixed precision: {target['kind']}{worst} >= {target['value']} "
                     f"{'met' if mixed['target_met'] else 'NOT met'} ({mixed['metric']:.5f}) with "
                     f"{mixed['int16_layers']} int16 layer(s) ({mixed['int16_fraction']:.0%}), estimated latency "
                     f"{mixed['latency_increase']:+.1%}; {mixed['points_tried']} points tried")
    lines.extend(_metric_lines(payload["outputs"]))
    if samples.get("random"):
        lines.append("  note: calibrated and measured on random data (--use-random-calib): the accuracy figures say "
                     "nothing about real inputs; pass --calib-data-path with real samples")
    elif not mixed and any(metrics.get("verdict") in ("warn", "flag") and not metrics.get("quiet_probability")
                           for metrics in payload["outputs"].values()):
        suited = payload.get("suited_preset") or {}
        loss = payload.get("range_loss")
        if loss:  # the error is born at a Log/Sqrt/Pow: no bit width holds its range, the CPU does
            start = f", from {loss['input_sqnr_db']:.1f} dB at its input" if loss["input_sqnr_db"] is not None else ""
            lines.append(f"  hint: the error starts at {loss['layer']} ({loss['op']}: SQNR {loss['sqnr_db']:.1f} dB"
                         f"{start}): an integer grid loses the small values of its wide input range; run it on the "
                         f"CPU with every layer before it (--cpu-head {loss['layer']}, cpuLayers.head)")
        elif suited and payload.get("config_preset") not in (suited["name"], *suited.get("covers", ())):
            lines.append(f"  hint: the model has {suited['why']}: try --config-preset {suited['name']}; or let the "
                         "compiler choose int16 layers (--mixed-precision cosine=0.99)")
        elif payload.get("config_preset") == "a16w16":  # everything is int16: the rest is a layer's range
            worst = (payload.get("analysis") or {}).get("worst_layers") or []
            where = f" ({worst[0]} is the worst in the analysis)" if worst else ""
            lines.append(f"  hint: activations and weights are int16 already{where}: a layer whose values span more "
                         "than int16 resolves (a Log of a power spectrum, say) is better run on the CPU (--cpu-head "
                         "LAYER runs it and every layer before it there, --cpu-tail LAYER it and every layer after "
                         "it), or calibrate on more data")
        elif payload.get("config_preset") == "a16w8" or _all_int16(payload["program"]):  # the weights next
            lines.append("  hint: with int16 activations everywhere, int16 weights may help (--config-preset a16w16), "
                         "or more calibration data")
        else:
            lines.append("  hint: to gain accuracy, let the compiler choose int16 layers (--mixed-precision "
                         "cosine=0.99), or use --config-preset a16w8 for recurrent, regression and image-to-image "
                         "models (qbcompiler presets)")
    if payload["analysis_file"]:
        lines.append(f"  analysis ({samples['holdout']} held-out samples): {payload['analysis_file']}")
    if payload["config_file"]:
        lines.append(f"  resolved config: {payload['config_file']}")
    return "\n".join(lines)


def _all_int16(program: dict[str, Any]) -> bool:
    """Whether every tensor of the program is int16 already (the ``ocr`` preset's activations, say)."""
    return bool(program.get("tensors")) and program["int16_tensors"] >= program["tensors"]


def _error_text(metrics: dict[str, Any]) -> str:
    """The largest error in the output's own units beside its FP32 peak, for outputs that are not class scores: a
    landmark or box regression reads cosine 0.999 with a 12-pixel error, which only this figure shows."""
    error, peak = metrics.get("max_abs_error"), metrics.get("reference_peak")
    if "top1_agreement" in metrics or error is None or not peak:
        return ""
    return f", largest error {error:.3g} (FP32 peak {peak:.3g})"


def _metric_lines(outputs: dict[str, dict]) -> list[str]:
    lines = []
    for name, metrics in outputs.items():
        topk = (f", top-1 {metrics['top1_agreement']:.1%}, top-5 {metrics['top5_agreement']:.1%}"
                if "top1_agreement" in metrics else "")
        cosine = (f"{metrics['cosine_mean']:.4f}" if metrics.get("cosine_mean") is not None
                  else "n/a (one value per sample)" if metrics.get("single_value")
                  else "n/a (FP32 output near zero on every held-out sample)")
        quiet = len(metrics.get("near_zero_samples", []))
        note = f", {quiet} near-zero sample(s) left out of the cosine" if quiet and metrics.get("cosine_mean") else ""
        if metrics.get("padding_positions"):
            note += f", compared at the tokens ({metrics['padding_positions']} padding positions left out)"
        quiet_note = " (a probability that stays near 0 on the held-out samples)" if metrics.get("quiet_probability") else ""
        lines.append(f"  {name}: SQNR {metrics['sqnr_db']:.1f} dB, cosine {cosine}{note}{topk}{_error_text(metrics)} "
                     f"[{metrics['verdict']}]{quiet_note}")
    return lines


def _quantize_text(payload: dict[str, Any]) -> str:
    summary, samples = payload["summary"], payload["samples"]
    lines = [f"Quantized in {payload['seconds']:.2f} s: {summary['operations']} integer operations, "
             f"{summary['int16_tensors']} int16 tensors; {samples['calibration']} calibration samples"
             f"{' (statistics from cache)' if payload['statistics_from_cache'] else ''}, "
             f"{samples['holdout']} held out for analysis"]
    lines.extend(_metric_lines(payload["outputs"]))
    worst = payload["analysis"].get("worst_layers")
    if worst:
        lines.append(f"  worst layers: {', '.join(worst)}")
    lines.extend(f"Wrote {path}" for path in payload["written"])
    return "\n".join(lines)


def _frontend_options(args: argparse.Namespace) -> dict[str, Any]:
    options = {"submodule": getattr(args, "submodule", None), "allow_pickle": getattr(args, "allow_pickle", False)}
    return {key: value for key, value in options.items() if value}


def _resolve_config(args: argparse.Namespace):
    """The CompileConfig from --compile-config/--config-preset with the explicit flags on top."""
    from compiler_core.config import resolve_config

    return resolve_config(compile_config=args.compile_config, config_preset=getattr(args, "config_preset", None),
                          backend=args.backend, target_device=args.target_device,
                          input_shape_dict=_shape_pairs(args.input_shape) or None,
                          cpu_layers=_cpu_layers(args))


def _cpu_layers(args: argparse.Namespace) -> dict[str, list[str]] | None:
    """``--cpu-head`` / ``--cpu-tail`` as a cpuLayers section (only the lists given), or None."""
    section = {key: getattr(args, f"cpu_{key}", None) for key in ("head", "tail")}
    return {key: value for key, value in section.items() if value} or None


def _support_report(mblt_path: str | Path, device: str, config=None):
    from compiler_core.mblt.io import load_mblt
    from compiler_core.targets import get_device

    get_device(device)  # validate the string before reading the model
    return _checked(load_mblt(mblt_path), device, config)


def _support_report_for_model(args: argparse.Namespace, out: Output):
    from compiler_core.api import parse_model
    from compiler_core.targets import get_device

    get_device(args.target_device)
    config = _resolve_config(args)
    graph, _ = parse_model(args.model, backend=args.backend, input_shape_dict=_shape_pairs(args.input_shape),
                           constant_inputs=_bind_pairs(args.bind_input), output_names=_names(args.output_names),
                           callback=out.progress, **_frontend_options(args))
    return _checked(graph, args.target_device, config)


def _checked(graph, device: str, config):
    """The support report of ``graph`` and, with ``cpuLayers``, the CPU-offload plan (``None`` without) with the report
    marking its CPU nodes; when every node is supported, the fit check too (DOES_NOT_FIT names the first layer whose
    smallest tile exceeds a core's SRAM, with ``config``'s int16 layers)."""
    from compiler_core.backend.fit import check_fit
    from compiler_core.targets import apply_offload, check_support, get_device, plan_cpu_offload

    report = check_support(graph, device)
    if report.all_supported:
        check_fit(graph, get_device(device), config)
    else:
        logger.info("Fit not checked: %d node(s) have no NPU kernel on %s.", len(report.flagged()), device)
    if config is None or not config.cpu_layers.patterns:
        return report, None
    plan = plan_cpu_offload(graph, report, config.cpu_layers)
    return apply_offload(report, plan), plan


def _plan_text(plan) -> str:
    """The CPU-offload split as ``check`` prints it."""
    return (f"\nCPU offload plan: head {len(plan.cpu_head)} node(s), NPU body {len(plan.npu_body)}, tail "
            f"{len(plan.cpu_tail)} ({len(plan.chosen)} chosen by cpuLayers)"
            + (f"; {len(plan.inner_unsupported)} unsupported node(s) stay inside the NPU body"
               if plan.inner_unsupported else ""))


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
                        help="bind an input (torch: a forward() argument) to a constant, e.g. sr=16000")
    parser.add_argument("--output-names", action="append", metavar="NAME[,NAME...]",
                        help="end the graph at these tensors, e.g. the boxes and scores before a NonMaxSuppression "
                             "(repeatable)")
    parser.add_argument("--submodule", help="torchscript/torch: export this child module (e.g. _model)")
    parser.add_argument("--allow-pickle", action="store_true",
                        help="torch: load a pickled full module; Keras: load Lambda layers (both run code from the "
                             "file)")


def _add_cpu_layer_options(parser: argparse.ArgumentParser, suffix: str = "") -> None:
    parser.add_argument("--cpu-head", action="append", metavar="PATTERN",
                        help="run this layer (node or source name, glob) on the CPU with every layer it depends on, "
                             f"before the NPU; repeatable (cpuLayers.head){suffix}")
    parser.add_argument("--cpu-tail", action="append", metavar="PATTERN",
                        help="run this layer on the CPU with every layer after it, after the NPU; repeatable "
                             f"(cpuLayers.tail){suffix}")


def _add_compile_options(parser: argparse.ArgumentParser, output_required: bool = True) -> None:
    parser.add_argument("--output", "-o", required=output_required, metavar="FILE.mxq", help="output MXQ")
    parser.add_argument("--target-device", help="aries-rb, regulus-ra, regulus-rb or regulus-rb-usb")
    parser.add_argument("--calib-data-path", action="append", metavar="PATH",
                        help="images folder, .npy folder, .txt list or JSON manifest (repeatable)")
    parser.add_argument("--calib-text", metavar="FILE.txt",
                        help="token-input models (transformer encoders): calibrate on these sentences, one per line, "
                             "tokenized with --tokenizer")
    parser.add_argument("--tokenizer", metavar="PATH",
                        help="with --calib-text: the model's tokenizer folder or tokenizer.json (default: the model's "
                             "own folder)")
    parser.add_argument("--use-random-calib", action="store_true", help="random data (smoke tests only)")
    parser.add_argument("--device", choices=["cpu", "gpu"],
                        help="compile host for calibration (the config's device; the NPU is --target-device)")
    parser.add_argument("--config-preset", help="preset name (see `qbcompiler presets`)")
    parser.add_argument("--compile-config", metavar="FILE", help="JSON/YAML CompileConfig")
    parser.add_argument("--config-save-path", metavar="FILE", help="write the resolved config here")
    parser.add_argument("--inference-scheme", choices=["single", "multi", "global4", "global8", "all"],
                        help="core modes to compile (REGULUS: single)")
    parser.add_argument("--cpu-offload", action=argparse.BooleanOptionalAction, default=None,
                        help="run unsupported head/tail layers on the CPU")
    _add_cpu_layer_options(parser)
    parser.add_argument("--mixed-precision", metavar="KIND=VALUE",
                        help="automatic mixed precision: promote layers to int16 until the held-out target holds "
                             "(cosine=0.99, sqnrDb=30, top1=0.95)")
    parser.add_argument("--max-int16-fraction", type=float, metavar="F",
                        help="mixed precision: largest share of int16 layers (default 0.25)")
    parser.add_argument("--latency-budget", type=float, metavar="F",
                        help="mixed precision: largest estimated latency increase (0.15 = +15 %%)")
    parser.add_argument("--mixed-precision-statistic", choices=["mean", "worst"],
                        help="mixed precision, cosine target: mean over the held-out samples (default) or the worst "
                             "sample's")


def build_parser() -> argparse.ArgumentParser:
    """The argparse tree of ``qbcompiler``."""
    parser = _Parser(prog="qbcompiler", description="qb Compiler (open implementation): source model -> MBLT -> MXQ.")
    parser.add_argument("--version", action="version", version=f"qbcompiler {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more log output (-vv for debug)")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress output")
    common = _Parser(add_help=False)  # the same flags are accepted after the command too
    common.add_argument("-v", "--verbose", action="count", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    common.add_argument("-q", "--quiet", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    original_add = sub.add_parser
    sub.add_parser = lambda name, **kw: original_add(name, parents=[common], **kw)

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
    check.add_argument("--max-len", type=int, help="decoder LLM (.gguf or folder): KV-cache positions for the memory check")
    check.add_argument("--compile-config", metavar="FILE",
                       help="JSON/YAML CompileConfig: the fit check tiles its int16 layers (bit.layerOverrides)")
    check.add_argument("--config-preset", help="preset name (e.g. a16w8): the fit check tiles its int16 layers")
    _add_cpu_layer_options(check, " (check shows the split)")
    _add_model_options(check)
    check.set_defaults(handler=cmd_check)

    compile_ = sub.add_parser("compile", help="source model or MBLT -> MXQ (parse + quantize + compile)")
    compile_.add_argument("--model", required=True, help="source model (.onnx ...) or .mblt")
    _add_model_options(compile_)
    _add_compile_options(compile_)
    llm = compile_.add_argument_group("decoder LLMs (--output X.llm.json)")
    llm.add_argument("--prefill-len", type=int, help="tokens per prefill call (default 32)")
    llm.add_argument("--max-len", type=int, help="KV-cache positions (default 1024)")
    llm.add_argument("--calib-samples", type=int, default=32, help="calibration windows of prefill-len tokens")
    compile_.set_defaults(handler=cmd_compile)

    sweep = sub.add_parser("sweep", help="compile a grid of settings (one calibration) and rank them (Pareto front)")
    sweep_model = sweep.add_mutually_exclusive_group(required=True)
    sweep_model.add_argument("--model", help="source model, parsed once into OUTPUT_DIR/model.mblt")
    sweep_model.add_argument("--mblt", help="parsed MBLT file")
    sweep.add_argument("--grid", required=True, metavar="FILE", help="sweep grid (YAML/JSON), see docs/sweeps.md")
    sweep.add_argument("--output-dir", required=True, metavar="DIR", help="point configs, MXQs, sweep.json/.csv")
    sweep.add_argument("--target-device", help="overrides the grid's base config")
    sweep.add_argument("--calib-data-path", action="append", metavar="PATH",
                       help="calibration data for every point (repeatable)")
    sweep.add_argument("--use-random-calib", action="store_true", help="random data (smoke tests only)")
    sweep.add_argument("--workers", type=int, default=2, help="points compiled at once (default 2)")
    sweep.add_argument("--executor", choices=["local", "inprocess", "ray"], default="local",
                       help="local: a pool of worker processes (default); inprocess: one point at a time here; "
                            "ray: Ray tasks (optional extra 'ray'), on a local Ray instance or --ray-address")
    sweep.add_argument("--report", metavar="HTML",
                       help="also write a self-contained HTML report (settings diff, metrics, plots, Pareto chart)")
    sweep.add_argument("--ray-address", metavar="ADDRESS",
                       help="Ray cluster for --executor ray (e.g. auto, ray://host:10001); default: start a local one")
    _add_model_options(sweep)
    sweep.set_defaults(handler=cmd_sweep)

    quantize = sub.add_parser("quantize", help="MBLT -> MXQ (with --output), or accuracy report only")
    quantize.add_argument("--mblt", required=True, help="parsed MBLT file")
    _add_compile_options(quantize, output_required=False)
    quantize.add_argument("--qdq-output", metavar="FILE.onnx", help="also write the QDQ ONNX model")
    quantize.add_argument("--analysis-output", metavar="FILE.json", help="write the full accuracy analysis")
    quantize.set_defaults(handler=cmd_quantize)

    analyze = sub.add_parser("analyze", help="per-layer sensitivity: each layer quantized alone, and kept in int16")
    analyze.add_argument("--mblt", required=True, help="parsed MBLT file")
    analyze.add_argument("--target-device", help="aries-rb, regulus-ra, regulus-rb or regulus-rb-usb")
    analyze.add_argument("--calib-data-path", action="append", metavar="PATH",
                         help="images folder, .npy folder, .txt list or JSON manifest (repeatable)")
    analyze.add_argument("--use-random-calib", action="store_true", help="random data (smoke tests only)")
    analyze.add_argument("--config-preset", help="preset name (see `qbcompiler presets`)")
    analyze.add_argument("--compile-config", metavar="FILE", help="JSON/YAML CompileConfig")
    analyze.add_argument("--samples", type=int, default=2, help="held-out samples per variant (default 2)")
    analyze.add_argument("--split", action="store_true", help="also measure activations and weights apart")
    analyze.add_argument("--top", type=int, default=15, help="layers shown (default 15; the JSON has all)")
    analyze.add_argument("--output", "-o", metavar="FILE.json", help="write the full report")
    analyze.set_defaults(handler=cmd_analyze)

    info = sub.add_parser("info", help="show an MBLT's provenance and summary")
    info.add_argument("--mblt", help="MBLT file")
    info.add_argument("--mxq", help="MXQ file")
    info.set_defaults(handler=cmd_info)

    profile = sub.add_parser("profile", help="per-layer performance report of an MXQ, per core mode")
    profile.add_argument("--mxq", required=True, help="compiled model")
    profile.add_argument("--core-mode", choices=["single", "multi", "global4", "global8"], help="only this mode")
    profile.add_argument("--top", type=int, help="only the N slowest layers per mode")
    profile.add_argument("--json", action="store_true", help="print the report as JSON")
    profile.set_defaults(handler=cmd_profile)

    validate = sub.add_parser("validate", help="check the integrity of an MXQ or MBLT file")
    validate.add_argument("file", help=".mxq or .mblt file")
    validate.set_defaults(handler=cmd_validate)

    run = sub.add_parser("run", help="run an MXQ on the simulator (inputs: .npy files or images)")
    run.add_argument("--mxq", required=True, help="compiled model")
    run.add_argument("--input", action="append", metavar="PATH",
                     help=".npy (NCHW/model layout), image or .wav file, or a folder of them (repeatable)")
    run.add_argument("--output-dir", help="save each output as .npy here")
    run.add_argument("--top-k", type=int, default=5, help="top-k for classifier outputs (default 5)")
    run.add_argument("--labels", help="text file with one class name per line")
    run.add_argument("--core-mode", choices=["auto", "single", "multi", "global4", "global8"], default="auto")
    run.add_argument("--prompt", help="text prompt for a compiled LLM (--mxq X.llm.json); tokens are streamed")
    run.add_argument("--max-new-tokens", type=int, default=32, help="with --prompt: tokens to generate (default 32)")
    run.set_defaults(handler=cmd_run)

    body = sub.add_parser("extract-body", help="write an MBLT of only the NPU body (without the CPU head/tail layers)")
    body.add_argument("--mblt", required=True, help="parsed MBLT file")
    body.add_argument("--output", "-o", required=True, help="output .mblt")
    body.add_argument("--target-device", default="aries-rb", help="the device whose support decides (default aries-rb)")
    body.set_defaults(handler=cmd_extract_body)

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
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    libraries = {name: logging.getLogger(name).level for name in _NOISY_LOGGERS}
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
    finally:
        root.handlers[:] = saved[0]  # in-process callers keep their own logging set-up
        root.setLevel(saved[1])
        for name, level in libraries.items():  # the workbench's log showed no onnx_ir warning after an in-process run
            logging.getLogger(name).setLevel(level)


def main() -> None:
    """Console-script entry point."""
    sys.exit(run())


if __name__ == "__main__":
    main()
