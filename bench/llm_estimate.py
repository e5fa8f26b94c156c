"""Cost-model estimate for Llama-3.2-1B's architecture on ARIES beside the published figures (out of sample).

Published (vendor, Llama-3.2-1B on ARIES, 240 input / 10 output tokens): TTFT 430.56 ms, 30.73 tokens/s.
Weights do not change latency, so the model is random with Llama-3.2-1B's shapes (16 layers, hidden
2048, 32 heads / 8 KV heads of 64, FFN 8192, vocabulary 128,256, tied embeddings, llama3 RoPE scaling).
The whole model does not fit this machine's memory through the compile pipeline (one layer with the
full vocabulary already passes 10 GB), so the script compiles the same architecture twice with the full
compile pipeline and cost model, 1 and 2 layers, each with a quarter of the vocabulary (32,064 tokens;
prefill N = 240 with the last position's logits only, as TTFT needs; cache L = 250; 2 random
calibration windows; the ``llm`` preset), and extrapolates per core mode:

- layers: every cost-model term is a sum over operations, so latency is ``a + b * layers``
  (``b`` = 2-layer minus 1-layer latency);
- vocabulary: the cost model's cycles of the operations whose constants have a vocabulary-sized axis
  (the LM head; its weight streaming from DRAM and its 64-lane output blocks, 501 at V/4 and 2,004 at V,
  both grow 4x) are added 3 more times. This one step is an extrapolation of the cost model's own
  per-layer figures, not a compile of the full LM head.

The prefill graph (N = 240) compiles since the backend tiles a MatMul of two activations (its
attention scores ``[1, 8, 960, 64] x [1, 8, 64, 240]`` were one 4.3 MB tile, over a core's 4 MB). A
graph that does not compile is recorded with its error; ``--graphs decode`` skips the prefill compiles.

Usage: ``python bench/llm_estimate.py [--graphs decode | --one-layer] [--preset llm_accurate] [--folder build/llm/llama1b]
[--json out.json]``
(``--one-layer``: TTFT and tokens/s from the 1-layer compiles alone, see its help).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

import numpy as np  # noqa: E402

PUBLISHED = {"prompt_tokens": 240, "ttft_ms": 430.56, "tokens_per_s": 30.73}
LAYERS = 16
VOCAB = 128256
PRESET = "llm"
"""The compile preset (``--preset``: ``llm_accurate`` for int16 weights)."""
POINTS = ((1, VOCAB // 4), (2, VOCAB // 4))
"""(layers, vocabulary) of the two compiles."""


def llama_1b_config(layers: int, vocab: int = VOCAB):
    """Llama-3.2-1B's configuration with ``layers`` decoder layers and a ``vocab``-token vocabulary."""
    import transformers

    return transformers.LlamaConfig(
        vocab_size=vocab, hidden_size=2048, intermediate_size=8192, num_hidden_layers=layers,
        num_attention_heads=32, num_key_value_heads=8, head_dim=64, max_position_embeddings=131072,
        rope_theta=500000.0, tie_word_embeddings=True,
        rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 8192})


def schedule(layers: int, vocab: int, folder: Path, kind: str) -> dict[str, float] | str:
    """Per core mode, the latency (ms) of the ``kind`` graph (prefill, decode); or the compile error's message.

    Each graph is compiled on its own (the calibration samples and ONNX exports of
    :mod:`compiler_core.llm`, then :func:`compiler_core.api.mxq_compile`), so a prefill graph that
    does not fit the device still leaves the decode estimate.
    """
    from compiler_core.errors import QBCompilerError
    from compiler_core.runtime.artifact import load_artifact

    stem = f"llama1b_{layers}l_{vocab}v"
    mxq, failure = folder / f"{stem}.{kind}.mxq", folder / f"{stem}.{kind}.error.txt"
    if not mxq.is_file() and not failure.is_file():
        try:
            _compile(layers, vocab, folder, stem, kind)
        except QBCompilerError as error:
            failure.write_text(f"{error.code}: {error}")
    if failure.is_file():
        return failure.read_text()
    return vocabulary_split(load_artifact(mxq), vocab)


def vocabulary_split(artifact, vocab: int) -> dict[str, dict[str, float]]:
    """Per core mode, ``{"latency_ms", "vocabulary_ms"}``: the total and the share of the cost model's
    layers whose operations hold a constant with a ``vocab``-sized axis (the LM head)."""
    from compiler_core.runtime.cost import estimate
    from compiler_core.targets.devices import get_device

    model = artifact.program
    sized = {op.name for op in model.ops if any(vocab in array.shape for array in op.consts.values())}
    device = get_device(artifact.device)
    found = {}
    for mode, row in artifact.schedule.items():
        result = estimate(model, device, mode, artifact.npu)
        cycles = sum(layer["cycles"] for layer in result.layers if layer["layer"] in sized)
        found[mode] = {"latency_ms": row["latency_ms"], "vocabulary_ms": cycles / device.clock_hz * 1e3}
    return found


def _compile(layers: int, vocab: int, folder: Path, stem: str, kind: str) -> None:
    import torch
    import transformers

    from compiler_core.api import mxq_compile
    from compiler_core.frontends.llm import LlmShape
    from compiler_core.llm import export_graphs, token_chunks, write_calibration

    shape = LlmShape(PUBLISHED["prompt_tokens"], PUBLISHED["prompt_tokens"] + 10, last_logits=True)
    onnx = folder / f"{stem}.{kind}.onnx"
    calib = folder / f"{stem}.calib" / f"{kind}.json"
    if not onnx.is_file() or not calib.is_file():
        torch.manual_seed(0)
        model = transformers.LlamaForCausalLM(llama_1b_config(layers, vocab)).eval()
        tokens = np.random.default_rng(0).integers(0, vocab, 2 * shape.prefill_len)
        write_calibration(model, shape, token_chunks(tokens, shape.prefill_len, 2), folder / f"{stem}.calib")
        export_graphs(model, shape, folder, stem)
        del model
    start = time.perf_counter()
    mxq_compile(str(onnx), target_device="aries-rb", calib_data_path=str(calib), save_path=folder / f"{stem}.{kind}.mxq",
                config_preset=PRESET, inference_scheme="all")
    print(f"compiled the {kind} graph of {layers} layer(s), vocabulary {vocab} in {time.perf_counter() - start:.0f} s")


def extrapolate(points: dict[tuple[int, int], dict], kind: str) -> dict[str, float] | str:
    """Per core mode, ``kind``'s latency at 16 layers and the full vocabulary; or why there is none."""
    rows = [points[point].get(kind, "not compiled (--graphs)") for point in POINTS]
    failed = next((row for row in rows if isinstance(row, str)), None)
    if failed is not None:
        return failed
    (layers, vocab), (deeper_layers, _) = POINTS
    base, deeper = rows
    return {mode: base[mode]["latency_ms"]
            + (LAYERS - layers) * (deeper[mode]["latency_ms"] - base[mode]["latency_ms"]) / (deeper_layers - layers)
            + (VOCAB / vocab - 1) * base[mode]["vocabulary_ms"] for mode in base}


def one_layer_latency(artifact, vocab: int) -> dict[str, dict[str, float]]:
    """Per core mode, the 16-layer, full-vocabulary latency (ms) from one 1-layer, ``vocab``-token compile.

    The 1-layer latency minus the vocabulary-sized operations (LM head, token lookup) and the final
    norm is taken as one decoder layer (an upper bound: the RoPE lookups count as layer work), times
    16; the vocabulary-sized operations are added ``VOCAB / vocab - 1`` more times.
    """
    from compiler_core.runtime.cost import estimate
    from compiler_core.targets.devices import get_device

    device = get_device(artifact.device)
    model = artifact.program
    sized = {op.name for op in model.ops if any(vocab in array.shape for array in op.consts.values())}
    found = {}
    for mode in artifact.schedule:
        rows = estimate(model, device, mode, artifact.npu).layers
        total = sum(row["cycles"] for row in rows) / device.clock_hz * 1e3
        vocabulary = sum(row["cycles"] for row in rows if row["layer"] in sized) / device.clock_hz * 1e3
        final_norm = [row for row in rows if row["kind"] == "layernorm"][-1]["cycles"] / device.clock_hz * 1e3
        layer = total - vocabulary - final_norm
        found[mode] = {"ms": total + (LAYERS - 1) * layer + (VOCAB / vocab - 1) * vocabulary,
                       "one_layer_ms": total, "layer_ms": layer, "vocabulary_ms": vocabulary}
    return found


def one_layer_estimate(folder: Path) -> dict[str, dict]:
    """TTFT and tokens/s from the 1-layer prefill and decode compiles alone (see ``--one-layer``)."""
    from compiler_core.runtime.artifact import load_artifact

    layers, vocab = POINTS[0]
    results = {}
    for kind in ("prefill", "decode"):
        path = folder / f"llama1b_{layers}l_{vocab}v.{kind}.mxq"
        results[kind] = one_layer_latency(load_artifact(path), vocab) if path.is_file() else f"no {path.name}"
    print(f"Llama-3.2-1B shapes, ARIES, `{PRESET}` preset, from the 1-layer compiles (vocabulary {vocab}); published TTFT "
          f"{PUBLISHED['ttft_ms']} ms ({PUBLISHED['prompt_tokens']} tokens), {PUBLISHED['tokens_per_s']} tokens/s")
    for kind, found in results.items():
        if isinstance(found, str):
            print(f"  {kind}: {found} (compile it first: python bench/llm_estimate.py)")
            continue
        for mode, row in found.items():
            ms = row["ms"]
            figure = (f"TTFT {ms:8.2f} ms ({ms / PUBLISHED['ttft_ms']:.2f}x)" if kind == "prefill" else
                      f"decode {ms:7.2f} ms  {1e3 / ms:6.2f} tokens/s ({1e3 / ms / PUBLISHED['tokens_per_s']:.2f}x)")
            print(f"  ours {mode:9s} {figure}   [1 layer {row['one_layer_ms']:.2f} ms: layer <= "
                  f"{row['layer_ms']:.2f}, LM head + lookup {row['vocabulary_ms']:.2f} at V/4]")
    return results


def kinds_of(graphs: str) -> tuple[str, ...]:
    """The graphs ``--graphs`` asks for, decode first (the quicker compile)."""
    return ("decode", "prefill") if graphs == "both" else ("decode",)


def main() -> None:
    global PRESET
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folder", default=str(REPO_ROOT / "build" / "llm" / "llama1b"))
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--one-layer", action="store_true",
                        help="TTFT and tokens/s from the 1-layer prefill and decode compiles alone (compiled when "
                             "missing): each one's latency minus the vocabulary-sized operations and the final norm "
                             "is taken as one decoder layer (an upper bound: the RoPE lookups count as layer work)")
    parser.add_argument("--preset", default=PRESET, help="compile preset (llm_accurate: int16 weights); use its own "
                        "--folder, the MXQs there are reused")
    parser.add_argument("--graphs", choices=("both", "decode"), default="both",
                        help="decode: tokens/s only (skips the prefill compiles, the longer ones)")
    args = parser.parse_args()
    PRESET = args.preset
    folder = Path(args.folder)
    folder.mkdir(parents=True, exist_ok=True)

    from compiler_core.llm import generation_estimate, llama_parameters, memory_fit

    if args.one_layer:
        for kind in kinds_of(args.graphs):
            schedule(*POINTS[0], folder, kind)  # compiles the 1-layer graph if it is not there yet
        results = one_layer_estimate(folder)
        if args.json:
            Path(args.json).write_text(json.dumps({"published": PUBLISHED, "one_layer": results}, indent=2))
        return
    points = {point: {} for point in POINTS}
    for kind in kinds_of(args.graphs):  # decode first: it is the quicker compile and fits
        for point in POINTS:
            points[point][kind] = schedule(*point, folder, kind)
    full = {kind: extrapolate(points, kind) for kind in ("prefill", "decode")}
    results = {"published": PUBLISHED, "points": {f"{n}l_{v}v": found for (n, v), found in points.items()},
               "extrapolated_ms": full, "modes": {},
               "memory": memory_fit(llama_1b_config(LAYERS), "aries-rb", PUBLISHED["prompt_tokens"] + 10),
               "parameters": llama_parameters(llama_1b_config(LAYERS))}
    print(f"Llama-3.2-1B shapes ({results['parameters'] / 1e9:.2f} B parameters), ARIES, "
          f"{PUBLISHED['prompt_tokens']}-token prompt, `{PRESET}` preset:")
    for (layers, vocab), found in points.items():
        print(f"  compiled {layers} layer(s), vocabulary {vocab:6d}: " + "; ".join(
            f"{kind} " + (value if isinstance(value, str) else ", ".join(
                f"{m} {ms['latency_ms']:.2f} ms (LM head {ms['vocabulary_ms']:.2f})" for m, ms in value.items()))
            for kind, value in found.items()))
    print(f"  published      TTFT {PUBLISHED['ttft_ms']:8.2f} ms   {PUBLISHED['tokens_per_s']:6.2f} tokens/s")
    if isinstance(full["decode"], str):
        print(f"  ours: no estimate: {full['decode']}")
    for mode in full["decode"] if isinstance(full["decode"], dict) else ():
        decode_ms = full["decode"][mode]
        row = {"tokens_per_s": 1e3 / decode_ms, "tokens_per_s_ratio": 1e3 / decode_ms / PUBLISHED["tokens_per_s"]}
        if isinstance(full["prefill"], dict):
            row.update(generation_estimate(full["prefill"][mode], decode_ms, PUBLISHED["prompt_tokens"],
                                           PUBLISHED["prompt_tokens"]))
            row["ttft_ratio"] = row["ttft_ms"] / PUBLISHED["ttft_ms"]
            ttft = f"TTFT {row['ttft_ms']:8.2f} ms ({row['ttft_ratio']:.2f}x)"
        else:
            ttft = "TTFT   (none)"
        results["modes"][mode] = row
        print(f"  ours {mode:9s} {ttft}   {row['tokens_per_s']:6.2f} tokens/s ({row['tokens_per_s_ratio']:.2f}x)")
    if isinstance(full["prefill"], str):
        print(f"  no TTFT: the prefill graph did not compile: {full['prefill']}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
