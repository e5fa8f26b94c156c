"""Compile a decoder LLM (Llama family) into a prefill MXQ, a decode MXQ and an ``.llm.json`` manifest.

The two graphs of :mod:`compiler_core.frontends.llm` are exported to ONNX beside the output, calibrated
on tokenized text (prefill: chunks of N tokens; decode: one token at a random position with the FP32
KV cache of the text before it) and compiled with the usual pipeline (``llm`` preset by default).

Today the two graphs are two MXQ files, each holding its own copy of the weights; the manifest ties
them together with the shapes, the tokenizer and the memory estimate. It looks like::

    {"format": "qb-llm", "version": 1, "prefill": "m.prefill.mxq", "decode": "m.decode.mxq",
     "prefill_len": 32, "max_len": 256, "layers": 30, "kv_heads": 3, "head_dim": 64,
     "vocab_size": 49152, "eos_token_id": 2, "tokenizer": "m.tokenizer", "device": "aries-rb", ...}
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from compiler_core.errors import ArgumentError, CalibrationError
from compiler_core.fileio import atomic_write_text
from compiler_core.frontends import llm as graphs
from compiler_core.progress import as_reporter

logger = logging.getLogger(__name__)

DEVICE_MEMORY_BYTES = {"aries-rb": 16 * 1024**3}
"""Device DRAM for LLM weights and KV cache: ARIES MLA100 has 16 GB (docs/reference: qb-compiler-api.md,
"Devices"). REGULUS's memory is not documented, so it is not checked; its cache length is."""
MAX_CACHE_LEN = {"regulus-ra": 1024, "regulus-rb": 1024, "regulus-rb-usb": 1024}
"""Longest sequence/KV cache a device's LLM runtime supports (REGULUS: 1024)."""

PREFIX_WINDOWS = 4
"""Calibration windows the prefix selection measures on (FP32 forward passes)."""
DECODE_SAMPLES_PER_CHUNK = 4
"""Decode calibration samples (tokens at distinct random positions) taken from each calibration chunk."""
GPTQ_WINDOW = 128
"""Tokens per calibration window of the GPTQ Hessians."""
GPTQ_TOKENS = 4096
"""Calibration tokens (at most) the GPTQ Hessians are measured on."""
MANIFEST_FORMAT = "qb-llm"
MANIFEST_VERSION = 1
MANIFEST_SUFFIX = ".llm.json"


# -- text ------------------------------------------------------------------------------------------


def kjv_text(passage: str, *, timeout: float = 120.0) -> str:
    """Public-domain English text: a passage of the King James Bible (Debian ``bible-kjv``), verse numbers removed.

    Args:
        passage: a ``bible`` reference such as ``gen1:1-50:26`` (Genesis) or ``mat1:1-28:20``.

    Raises:
        CalibrationError: the ``bible`` program (``apt-get install bible-kjv``) is missing or failed.
    """
    program = shutil.which("bible")
    if program is None:
        raise CalibrationError("The `bible` program is not installed, so there is no King James text to read.",
                               hint="apt-get install bible-kjv")
    result = subprocess.run([program, "-f", passage], capture_output=True, text=True, timeout=timeout, check=False)
    lines = [re.sub(r"^\S+\d+:\d+\s+", "", line) for line in result.stdout.splitlines() if re.match(r"^\S+\d+:\d+", line)]
    if result.returncode != 0 or not lines:
        raise CalibrationError(f"`bible -f {passage}` gave no text: {result.stderr.strip()[:200]}",
                               hint="Check the passage reference, e.g. gen1:1-50:26.")
    return " ".join(lines)


def token_chunks(token_ids: Sequence[int], length: int, count: int) -> list[np.ndarray]:
    """Up to ``count`` consecutive, non-overlapping chunks of ``length`` tokens."""
    ids = np.asarray(token_ids, dtype=np.int64)
    chunks = [ids[start:start + length] for start in range(0, len(ids) - length + 1, length)]
    return chunks[:count]


# -- calibration -----------------------------------------------------------------------------------


def write_calibration(model: Any, shape: graphs.LlmShape, chunks: Sequence[np.ndarray], folder: Path,
                      seed: int = 0, prefix: graphs.LlmPrefix | None = None,
                      decode_per_chunk: int = DECODE_SAMPLES_PER_CHUNK) -> tuple[Path, Path]:
    """Write prefill and decode calibration samples (``.npy`` + JSON manifests) into ``folder``.

    Each chunk gives one prefill sample (its N tokens) and ``decode_per_chunk`` decode samples: the
    token at a random index ``i`` in ``[1, N)`` of the chunk (distinct indices) with the FP32
    keys/values of the tokens before it (and of the ``prefix``, in the first slots) in the cache.

    Returns:
        ``(prefill_manifest, decode_manifest)``.
    """
    import torch

    if not chunks:
        raise CalibrationError("No calibration text: need at least one chunk of prefill_len tokens.",
                               hint="Give a longer text, or a smaller prefill_len.")
    folder.mkdir(parents=True, exist_ok=True)
    _, kv_heads, head_dim = graphs.kv_geometry(model.config)
    prefill = graphs.prefill_graph(model, shape, prefix)
    rng = np.random.default_rng(seed)
    prefill_rows, decode_rows = [], []
    for number, chunk in enumerate(chunks):
        feed = graphs.prefill_feed(chunk, shape)
        prefill_rows.append(_save_row(folder, f"prefill{number}", feed))
        with torch.no_grad():
            present = prefill(*(torch.from_numpy(v) for v in feed.values()))[1:]
        count = min(decode_per_chunk, len(chunk) - 1)
        for index in sorted(rng.choice(np.arange(1, len(chunk)), size=count, replace=False).tolist()):
            decode = _decode_sample(chunk, index, present, prefix, shape, (kv_heads, head_dim))
            decode_rows.append(_save_row(folder, f"decode{len(decode_rows)}", decode))
    return (_write_manifest(folder / "prefill.json", ["input_ids", "position_ids"], prefill_rows),
            _write_manifest(folder / "decode.json", list(decode), decode_rows))


def _decode_sample(chunk: np.ndarray, index: int, present, prefix, shape: graphs.LlmShape,
                   geometry: tuple[int, int]) -> dict[str, np.ndarray]:
    """The decode feed of ``chunk[index]``: the FP32 cache of the prefix and of the tokens before it."""
    start = shape.prefix_len
    position = start + index
    kv_heads, head_dim = geometry
    decode = {"input_ids": chunk[None, index:index + 1].astype(np.int64),
              "position_ids": np.array([[position]], np.int64), "cache_mask": graphs.decode_mask(position, shape)}
    prefix_cache = prefix.cache if prefix else [None] * len(present)
    for name, tensor, fixed in zip(graphs.cache_names(len(present) // 2, "past_"), present, prefix_cache):
        cache = np.zeros((1, kv_heads, shape.max_len, head_dim), np.float32)
        if fixed is not None:
            cache[:, :, :start] = fixed
        cache[:, :, start:position] = tensor[:, :, :index].numpy()
        decode[name] = cache
    return decode


def _save_row(folder: Path, stem: str, feed: dict[str, np.ndarray]) -> list[str]:
    paths = []
    for name, value in feed.items():
        path = folder / f"{stem}.{name}.npy"
        np.save(path, value)
        paths.append(path.name)
    return paths


def _write_manifest(path: Path, names: list[str], rows: list[list[str]]) -> Path:
    atomic_write_text(path, json.dumps({"info": {"input names": names}, "calib paths": rows}))
    return path


# -- export ----------------------------------------------------------------------------------------


def export_graphs(model: Any, shape: graphs.LlmShape, folder: Path, stem: str,
                  prefix: graphs.LlmPrefix | None = None) -> tuple[Path, Path]:
    """Export the prefill and decode graphs to ``folder/stem.{prefill,decode}.onnx`` (``prefix``: constants)."""
    import onnx_ir as ir
    import torch

    from compiler_core.frontends.torch import export_graph

    layers, kv_heads, head_dim = graphs.kv_geometry(model.config)
    n = shape.prefill_len
    prefill_args = (torch.zeros(1, n, dtype=torch.int64), torch.arange(shape.prefix_len, shape.prefix_len + n)[None])
    cache = [torch.zeros(1, kv_heads, shape.max_len, head_dim) for _ in range(2 * layers)]
    position = min(shape.prefix_len + n, shape.max_len - 1)
    mask = torch.from_numpy(graphs.decode_mask(position, shape))
    decode_args = (torch.zeros(1, 1, dtype=torch.int64), torch.tensor([[position]]), mask, *cache)
    outputs = ["logits", *graphs.cache_names(layers)]
    paths = []
    for kind, module, args, inputs in (
            ("prefill", graphs.prefill_graph(model, shape, prefix), prefill_args, ["input_ids", "position_ids"]),
            ("decode", graphs.decode_graph(model, shape), decode_args,
             ["input_ids", "position_ids", "cache_mask", *graphs.cache_names(layers, "past_")])):
        exported = export_graph(module, args, inputs, outputs, name=f"{type(model).__name__} {kind}")
        path = folder / f"{stem}.{kind}.onnx"
        ir.save(exported, path, external_data=f"{path.name}.data" if _large(model) else None)
        paths.append(path)
    return paths[0], paths[1]


def decode_mblt_path(prefill_path: str | Path) -> Path:
    """Where a decoder LLM's decode MBLT goes beside its prefill MBLT: ``m.mblt`` -> ``m.decode.mblt``."""
    path = Path(prefill_path)
    return path.with_name(f"{path.stem}.decode{path.suffix}")


def parse_llm(source: Any, prefill_path: str | Path, decode_path: str | Path, *,
              prefill_len: int = graphs.DEFAULT_PREFILL_LEN, max_len: int = graphs.DEFAULT_MAX_LEN,
              callback: Any = None, cancel_token: Any = None) -> tuple[Path, Path]:
    """Parse a decoder LLM to its two MBLTs, to look at and check before compiling (no calibration).

    The graphs are those :func:`compile_llm` compiles, without an outlier prefix, rotation or GPTQ rounding
    (which change the weights, not the graphs' layers): ``prefill_path`` takes ``prefill_len`` tokens,
    ``decode_path`` one token and a KV cache of ``max_len`` positions. Each MBLT is written atomically;
    on cancel or error nothing new is left but a prefill MBLT written before the decode one failed.

    Args:
        source: A ``*ForCausalLM`` module, a transformers folder or a ``.gguf`` file.
        prefill_path: The prefill graph's MBLT.
        decode_path: The decode graph's MBLT.
        prefill_len: N, tokens per prefill call.
        max_len: L, KV-cache positions.
        callback: Receives :class:`~compiler_core.progress.ProgressEvent` objects.
        cancel_token: Cancels between steps.

    Returns:
        ``(prefill_path, decode_path)``.
    """
    import tempfile

    from compiler_core.api import mblt_compile

    reporter = as_reporter(callback, cancel_token)
    prefill_path, decode_path = Path(prefill_path), Path(decode_path)
    name = Path(source).name if isinstance(source, (str, Path)) else type(source).__name__
    with reporter.stage("load", total=1, message=f"loading {name} with transformers"):
        model, _ = graphs.load_causal_lm(source)
        reporter.advance()
    shape = graphs.LlmShape(prefill_len, max_len)
    prefill_path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="qb-llm-", dir=prefill_path.parent) as scratch:
        with reporter.stage("export", total=1, message="exporting the prefill and decode graphs to ONNX"):
            exported = export_graphs(model, shape, Path(scratch), "llm")
            reporter.advance()
        del model  # its weights are in the exports now: half the memory for the parses
        for onnx_path, mblt_path in zip(exported, (prefill_path, decode_path), strict=True):
            reporter.check()
            mblt_compile(str(onnx_path), mblt_path, backend="onnx", callback=reporter)
    return prefill_path, decode_path


def _large(model: Any) -> bool:
    return sum(p.numel() for p in model.parameters()) * 4 > 1_500_000_000  # protobuf's 2 GB limit, with room


# -- memory and cost -------------------------------------------------------------------------------


def memory_fit(config: Any, device: str, max_len: int, *, weight_bits: int = 8, kv_bits: int = 16,
               shared_weights: bool = False) -> dict[str, Any]:
    """Device memory the LLM needs: weights (both graphs) + KV cache, against the device's memory.

    Args:
        config: a Llama config (``num_hidden_layers``, ``hidden_size`` ... ``vocab_size``).
        device: the target device.
        max_len: KV-cache positions.
        weight_bits: bits per weight (8; 4 for ``llm_fast`` FFN weights is not modelled per layer).
        kv_bits: bits per cached key/value element (16: the `llm` preset keeps activations in int16).
        shared_weights: one copy of the weights for prefill and decode (today's MXQs hold one each).

    Returns:
        ``{"weights_bytes", "kv_cache_bytes", "total_bytes", "device_bytes" (None if unknown), "fits",
        "max_len", "max_cache_len", "reason"}``.
    """
    layers, kv_heads, head_dim = graphs.kv_geometry(config)
    parameters = llama_parameters(config)
    copies = 1 if shared_weights else 2
    weights = parameters * weight_bits // 8 * copies
    kv_cache = 2 * layers * kv_heads * head_dim * max_len * kv_bits // 8
    total = weights + kv_cache
    capacity = DEVICE_MEMORY_BYTES.get(device)
    limit = MAX_CACHE_LEN.get(device)
    reasons = []
    if capacity is not None and total > capacity:
        reasons.append(f"weights {weights / 1e9:.2f} GB + KV cache {kv_cache / 1e9:.2f} GB = {total / 1e9:.2f} GB "
                       f"exceed the {capacity / 1e9:.2f} GB of {device}")
    if limit is not None and max_len > limit:
        reasons.append(f"a KV cache of {max_len} positions exceeds {device}'s limit of {limit}")
    return {"weights_bytes": weights, "kv_cache_bytes": kv_cache, "total_bytes": total, "device_bytes": capacity,
            "fits": not reasons, "max_len": max_len, "max_cache_len": limit, "reason": "; ".join(reasons)}


def check_memory_fit(config: Any, device: str, max_len: int, **kwargs: Any) -> dict[str, Any]:
    """:func:`memory_fit`, raising :class:`ArgumentError` with the numbers when the model does not fit."""
    fit = memory_fit(config, device, max_len, **kwargs)
    if not fit["fits"]:
        raise ArgumentError(f"The LLM does not fit {device}: {fit['reason']}.",
                            hint="Use a smaller max_len, 4-bit weights (llm_fast), or a device with more memory.")
    return fit


def llama_parameters(config: Any) -> int:
    """Parameter count of a Llama config (embeddings counted once when tied)."""
    layers, kv_heads, head_dim = graphs.kv_geometry(config)
    hidden, heads, ffn = config.hidden_size, config.num_attention_heads, config.intermediate_size
    attention = hidden * heads * head_dim * 2 + hidden * kv_heads * head_dim * 2
    per_layer = attention + 3 * hidden * ffn + 2 * hidden
    embeddings = config.vocab_size * hidden * (1 if getattr(config, "tie_word_embeddings", False) else 2)
    return layers * per_layer + embeddings + hidden


def generation_estimate(prefill_ms: float, decode_ms: float, prefill_len: int, prompt_tokens: int) -> dict:
    """TTFT and tokens/s from the cost-model latencies of one prefill and one decode call.

    A prompt up to N tokens takes one prefill call; the runtime feeds tokens past N through decode
    steps, so they add one decode latency each.
    """
    extra = max(0, prompt_tokens - prefill_len)
    return {"prompt_tokens": prompt_tokens, "ttft_ms": prefill_ms + extra * decode_ms,
            "tokens_per_s": 1e3 / decode_ms if decode_ms > 0 else None}


def manifest_estimate(manifest: dict[str, Any], folder: Path, prompt_tokens: int | None = None) -> dict[str, Any]:
    """Per core mode: TTFT for ``prompt_tokens`` (default N) and tokens/s, from the two MXQs' schedules."""
    from compiler_core.runtime.artifact import load_artifact

    schedules = {kind: load_artifact(folder / manifest[kind]).schedule for kind in ("prefill", "decode")}
    prompt = prompt_tokens or manifest["prefill_len"]
    return {mode: generation_estimate(schedules["prefill"][mode]["latency_ms"], schedules["decode"][mode]["latency_ms"],
                                      manifest["prefill_len"], prompt)
            for mode in schedules["prefill"] if mode in schedules["decode"]}


# -- compile ---------------------------------------------------------------------------------------


def compile_llm(source: Any, save_path: str | Path, *, target_device: str = "aries-rb",
                prefill_len: int = graphs.DEFAULT_PREFILL_LEN, max_len: int = graphs.DEFAULT_MAX_LEN,
                calib_token_ids: Sequence[int] | None = None, calib_text: str | None = None,
                num_samples: int = 32, config_preset: str = "llm", tokenizer: Any = None,
                last_logits: bool = False, outlier_prefix: bool | Sequence[int] | None = None,
                gptq: bool | None = None, rotate: bool | None = None, **compile_kwargs: Any) -> dict[str, Any]:
    """Compile a Llama-family causal LM to ``<stem>.prefill.mxq``, ``<stem>.decode.mxq`` and ``save_path``.

    Args:
        source: a ``*ForCausalLM`` module, a transformers folder or a ``.gguf`` file.
        save_path: the manifest to write, ``<stem>.llm.json``; the MXQs, ONNX exports, calibration
            samples and tokenizer are written beside it.
        target_device: the device.
        prefill_len: N, tokens per prefill call.
        max_len: L, KV-cache positions.
        calib_token_ids: calibration tokens; or ``calib_text`` with a tokenizer (from the source or given).
        num_samples: calibration chunks of N tokens (each gives one prefill and one decode sample).
        config_preset: the compile preset (``llm`` or ``llm_fast``).
        tokenizer: a tokenizer to use instead of the source's.
        last_logits: the prefill graph computes the logits of position N-1 only
            (:class:`~compiler_core.frontends.llm.LlmShape`); the runtime then takes prompts of N tokens
            or more.
        outlier_prefix: fixed tokens in front of every sequence, their KV cache computed once in FP32
            (PrefixQuant: the attention sink's massive activations stay out of the quantized graphs);
            ``True`` chooses them on the calibration text
            (:func:`compiler_core.quantization.llm_prefix.select_prefix`), a list of token ids gives
            them, ``False`` uses none; ``None`` follows the config's ``llm.outlierPrefix`` (on in the
            ``llm`` presets).
        gptq: round the Linear weights with GPTQ (:mod:`compiler_core.quantization.gptq`) on up to
            :data:`GPTQ_TOKENS` calibration tokens before export; ``None`` follows the config's
            ``llm.gptq``. A live module is copied first, never changed.
        rotate: rotate the residual stream by an orthogonal matrix folded into the weights
            (:func:`compiler_core.quantization.llm_rotation.rotate_residual`) after the prefix is chosen
            and before GPTQ and calibration; ``None`` follows the config's ``llm.rotate``. A live module
            is copied first, never changed.
        **compile_kwargs: passed to :func:`compiler_core.api.mxq_compile` (``compile_config`` ...).

    Returns:
        The manifest (also written to ``save_path``), with the two compile results under ``results``.
    """
    from compiler_core.api import mxq_compile

    save_path = Path(save_path)
    if not save_path.name.endswith(MANIFEST_SUFFIX):
        raise ArgumentError(f"The LLM manifest must end with {MANIFEST_SUFFIX}, got '{save_path.name}'.",
                            hint=f"e.g. smollm2{MANIFEST_SUFFIX}; the MXQs are written beside it.")
    folder, stem = save_path.parent, save_path.name[: -len(MANIFEST_SUFFIX)]
    folder.mkdir(parents=True, exist_ok=True)
    reporter = as_reporter(compile_kwargs.get("callback"), compile_kwargs.get("cancel_token"))
    with reporter.stage("load", total=1, message="loading the model with transformers"):
        model, loaded_tokenizer = graphs.load_causal_lm(source)
        reporter.advance()
    tokenizer = tokenizer or loaded_tokenizer
    config = _config(config_preset, compile_kwargs)
    rotate = config.llm.rotate if rotate is None else rotate
    gptq = config.llm.gptq if gptq is None else gptq
    fit = check_memory_fit(_untied(model.config) if rotate or gptq else model.config, target_device, max_len,
                           weight_bits=_weight_bits(config))
    tokens = _calibration_tokens(calib_token_ids, calib_text, tokenizer)
    chunks = token_chunks(tokens, prefill_len, num_samples)
    reporter.check()
    with reporter.stage("prefix", total=1, message="choosing the outlier prefix tokens"):
        selection = _prefix_tokens(outlier_prefix, model, tokenizer, chunks, config_preset, compile_kwargs)
        reporter.advance()
    prefix = graphs.prefix_cache(model, selection["token_ids"], max_len) if selection["token_ids"] else None
    shape = graphs.LlmShape(prefill_len, max_len, last_logits, len(prefix) if prefix else 0)
    rotation = None
    if rotate:
        with reporter.stage("rotate", total=1, message="rotating the residual stream"):
            model, rotation = _rotate(model, source)
            reporter.advance()
    rounding = None
    if gptq:
        with reporter.stage("gptq", total=1, message="rounding the weights with GPTQ"):
            model, rounding = _gptq(model, source, tokens, selection["token_ids"], config_preset, compile_kwargs)
            reporter.advance()
    reporter.check()
    with reporter.stage("calibration", total=1, message=f"FP32 calibration samples from {len(chunks)} windows"):
        prefill_calib, decode_calib = write_calibration(model, shape, chunks, folder / f"{stem}.calib", prefix=prefix)
        reporter.advance()
    with reporter.stage("export", total=1, message="exporting the prefill and decode graphs to ONNX"):
        prefill_onnx, decode_onnx = export_graphs(model, shape, folder, stem, prefix)
        reporter.advance()
    results = {}
    for kind, onnx_path, calib in (("prefill", prefill_onnx, prefill_calib), ("decode", decode_onnx, decode_calib)):
        logger.info("Compiling the %s graph of %s", kind, stem)
        results[kind] = mxq_compile(str(onnx_path), target_device=target_device, calib_data_path=str(calib),
                                    save_path=folder / f"{stem}.{kind}.mxq", config_preset=config_preset,
                                    **compile_kwargs)
    manifest = _manifest(model, shape, stem, results, target_device, config_preset)
    manifest["memory"] = fit
    if prefix is not None:
        prefix.save(folder / f"{stem}.prefix.npz")
        manifest["prefix"] = {**selection, "cache": f"{stem}.prefix.npz"}
    if rotation is not None:
        manifest["rotation"] = rotation
    if rounding is not None:
        manifest["gptq"] = rounding
    if tokenizer is not None:
        tokenizer.save_pretrained(str(folder / f"{stem}.tokenizer"))
        manifest["tokenizer"] = f"{stem}.tokenizer"
    atomic_write_text(save_path, json.dumps(manifest, indent=2))
    manifest["results"] = results
    return manifest


def _weight_bits(config) -> int:
    """16 when every layer's weights are int16 (``llm_accurate``), else 8 (the memory check's weight width)."""
    return 16 if "*" in config.bit.layer_overrides.weight16_bits else 8


def _config(preset: str, compile_kwargs: dict):
    from compiler_core.config.resolve import resolve_config

    return resolve_config(compile_kwargs.get("compile_config"), preset, llm_config=compile_kwargs.get("llm_config"))


def _untied(model_config: Any) -> Any:
    """A copy of a model config whose LM head has its own table (rotation and GPTQ untie a tied head)."""
    import copy

    untied = copy.copy(model_config)
    untied.tie_word_embeddings = False
    return untied


def _rotate(model, source) -> tuple[Any, dict[str, Any]]:
    """``model`` (a copy when the caller gave a live module) with its residual stream rotated, and the summary."""
    import copy

    import torch

    from compiler_core.quantization.llm_rotation import rotate_residual

    if isinstance(source, torch.nn.Module):
        model = copy.deepcopy(model)
    return model, rotate_residual(model)


def _gptq(model, source, tokens: Sequence[int], prefix: Sequence[int], preset: str,
          compile_kwargs: dict) -> tuple[Any, dict[str, Any]]:
    """``model`` (a copy when the caller gave a live module) with GPTQ-rounded Linear weights, and the summary."""
    import copy

    import torch

    from compiler_core.quantization import gptq

    if isinstance(source, torch.nn.Module):
        model = copy.deepcopy(model)
    windows = [chunk.tolist() for chunk in token_chunks(tokens, GPTQ_WINDOW, GPTQ_TOKENS // GPTQ_WINDOW)]
    if not windows:
        windows = [list(tokens)]
    if _config(preset, compile_kwargs).bit.transformer.ffn_bits == 4:
        raise ArgumentError("GPTQ rounding is implemented for 8-bit per-channel weights only, not 4-bit FFN weights.",
                            hint="Turn llm.gptq off with bit.transformer.ffnBits 4 (llm_fast).")
    return model, gptq.gptq_model(model, windows, prefix=prefix)


def _prefix_tokens(choice, model, tokenizer, chunks, preset: str, compile_kwargs: dict) -> dict[str, Any]:
    """The prefix: given, chosen on the calibration chunks, or none (``{"token_ids": [...], ...}``)."""
    from compiler_core.quantization import llm_prefix

    if choice is None:
        choice = _config(preset, compile_kwargs).llm.outlier_prefix
    if choice is False:
        return {"token_ids": []}
    if choice is not True:
        ids = [int(t) for t in choice]
        if any(not 0 <= t < model.config.vocab_size for t in ids):
            raise ArgumentError(f"Prefix tokens {ids} are outside the vocabulary of {model.config.vocab_size}.")
        return {"token_ids": ids}
    windows = [chunk.tolist() for chunk in chunks[:PREFIX_WINDOWS]]
    return llm_prefix.select_prefix(model, windows, llm_prefix.candidate_tokens(model.config, tokenizer))


def _calibration_tokens(token_ids, text, tokenizer) -> list[int]:
    if token_ids is not None:
        return [int(t) for t in token_ids]
    if text is None:
        raise CalibrationError("An LLM needs calibration text: give calib_text or calib_token_ids.",
                               hint="Any few thousand words of ordinary text in the model's language.")
    if tokenizer is None:
        raise ArgumentError("calib_text needs a tokenizer; a live module has none.",
                            hint="Pass tokenizer=..., or calib_token_ids.")
    return list(tokenizer(text)["input_ids"])


def _manifest(model: Any, shape: graphs.LlmShape, stem: str, results: dict, device: str, preset: str) -> dict:
    config = model.config
    layers, kv_heads, head_dim = graphs.kv_geometry(config)
    eos = config.eos_token_id
    return {"format": MANIFEST_FORMAT, "version": MANIFEST_VERSION, "device": device, "preset": preset,
            "architecture": type(model).__name__, "prefill": f"{stem}.prefill.mxq", "decode": f"{stem}.decode.mxq",
            "prefill_len": shape.prefill_len, "max_len": shape.max_len, "prefix_len": shape.prefix_len,
            "last_logits": shape.last_logits, "layers": layers, "kv_heads": kv_heads,
            "head_dim": head_dim, "hidden_size": config.hidden_size, "vocab_size": config.vocab_size,
            "eos_token_id": eos[0] if isinstance(eos, list) else eos, "bos_token_id": config.bos_token_id,
            "parameters": int(sum(p.numel() for p in model.parameters())),
            "weights_shared": False,
            "analysis": {kind: result.quantize.analysis.get("summary", {}) for kind, result in results.items()}}


def read_manifest(path: str | Path) -> dict[str, Any]:
    """Read and check an ``.llm.json`` manifest.

    Raises:
        ArgumentError: not a qb-llm manifest, or the MXQs it names are missing.
    """
    path = Path(path)
    try:
        manifest = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise ArgumentError(f"'{path}' cannot be read as an LLM manifest: {error}",
                            hint=f"Pass the {MANIFEST_SUFFIX} file written by compile_llm.") from error
    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
        raise ArgumentError(f"'{path.name}' is not a {MANIFEST_FORMAT} manifest.",
                            hint=f"Pass the {MANIFEST_SUFFIX} file written by compile_llm.")
    missing = [manifest[kind] for kind in ("prefill", "decode") if not (path.parent / manifest[kind]).is_file()]
    if missing:
        raise ArgumentError(f"'{path.name}' names MXQ file(s) that are missing: {', '.join(missing)}.",
                            hint="Keep the MXQs beside the manifest, or compile again.")
    return manifest
