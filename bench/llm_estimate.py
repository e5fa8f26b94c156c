"""Cost-model estimate for Llama-3.2-1B's architecture on ARIES beside the published figures (out of sample).

Published (vendor, Llama-3.2-1B on ARIES, 240 input / 10 output tokens): TTFT 430.56 ms, 30.73 tokens/s.
Weights do not change latency, so the model is random with Llama-3.2-1B's shapes (16 layers, hidden
2048, 32 heads / 8 KV heads of 64, FFN 8192, vocabulary 128,256, tied embeddings, llama3 RoPE scaling).
The whole model does not fit this machine's memory through the compile pipeline (one layer with the
full vocabulary already passes 10 GB), so the script compiles the same architecture three times, each
with the full compile pipeline and cost model (prefill N = 240 with the last position's logits only, as
TTFT needs; cache L = 250; 2 random calibration windows):

- 1 layer, vocabulary V/4 (32,064); 2 layers, V/4; 1 layer, V/2 (64,128)

and extrapolates per core mode to 16 layers and the full vocabulary: every cost-model term (MACs,
vector work, per-operation overhead, weight streaming) is a sum over operations; a decoder layer's
operations do not depend on the vocabulary and the embedding lookup and LM head do not depend on the
layer count, so latency is ``a + b * layers + c * vocabulary`` (the LM head's output channels split
into whole 64-lane blocks over the cores at each of these vocabulary sizes: 501, 1,002, 2,004 blocks).

Usage: ``python bench/llm_estimate.py [--folder build/llm/llama1b] [--json out.json]``.
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
POINTS = ((1, VOCAB // 4), (2, VOCAB // 4), (1, VOCAB // 2))
"""(layers, vocabulary) of the three compiles."""


def llama_1b_config(layers: int, vocab: int = VOCAB):
    """Llama-3.2-1B's configuration with ``layers`` decoder layers and a ``vocab``-token vocabulary."""
    import transformers

    return transformers.LlamaConfig(
        vocab_size=vocab, hidden_size=2048, intermediate_size=8192, num_hidden_layers=layers,
        num_attention_heads=32, num_key_value_heads=8, head_dim=64, max_position_embeddings=131072,
        rope_theta=500000.0, tie_word_embeddings=True,
        rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 8192})


def schedules(layers: int, vocab: int, folder: Path) -> dict[str, dict[str, float]]:
    """Per core mode, the prefill and decode latency (ms) of the ``layers``-layer, ``vocab``-token model."""
    import torch
    import transformers

    from compiler_core.llm import compile_llm
    from compiler_core.runtime.artifact import load_artifact

    manifest = folder / f"llama1b_{layers}l_{vocab}v.llm.json"
    if not manifest.is_file():
        torch.manual_seed(0)
        model = transformers.LlamaForCausalLM(llama_1b_config(layers, vocab)).eval()
        tokens = np.random.default_rng(0).integers(0, vocab, 2 * PUBLISHED["prompt_tokens"])
        start = time.perf_counter()
        compile_llm(model, manifest, prefill_len=PUBLISHED["prompt_tokens"], max_len=PUBLISHED["prompt_tokens"] + 10,
                    calib_token_ids=tokens, num_samples=2, inference_scheme="all", last_logits=True)
        print(f"compiled {layers} layer(s), vocabulary {vocab} in {time.perf_counter() - start:.0f} s")
        del model
    data = json.loads(manifest.read_text())
    prefill = load_artifact(folder / data["prefill"]).schedule
    decode = load_artifact(folder / data["decode"]).schedule
    return {mode: {"prefill_ms": prefill[mode]["latency_ms"], "decode_ms": decode[mode]["latency_ms"]}
            for mode in prefill}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folder", default=str(REPO_ROOT / "build" / "llm" / "llama1b"))
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    folder = Path(args.folder)
    folder.mkdir(parents=True, exist_ok=True)

    from compiler_core.llm import generation_estimate, llama_parameters, memory_fit

    points = {point: schedules(*point, folder) for point in POINTS}
    base, deeper, wider = (points[point] for point in POINTS)
    layer_step, vocab_step = POINTS[1][0] - POINTS[0][0], POINTS[2][1] - POINTS[0][1]
    results = {"published": PUBLISHED, "modes": {}, "points": {f"{n}l_{v}v": s for (n, v), s in points.items()},
               "memory": memory_fit(llama_1b_config(LAYERS), "aries-rb", PUBLISHED["prompt_tokens"] + 10),
               "parameters": llama_parameters(llama_1b_config(LAYERS))}
    print(f"Llama-3.2-1B shapes ({results['parameters'] / 1e9:.2f} B parameters), ARIES, "
          f"{PUBLISHED['prompt_tokens']}-token prompt:")
    for (layers, vocab), schedule in points.items():
        print(f"  compiled {layers} layer(s), vocabulary {vocab:6d}: " + ", ".join(
            f"{mode} prefill {s['prefill_ms']:.2f} / decode {s['decode_ms']:.2f} ms" for mode, s in schedule.items()))
    print(f"  published      TTFT {PUBLISHED['ttft_ms']:8.2f} ms   {PUBLISHED['tokens_per_s']:6.2f} tokens/s")
    for mode in base:
        per_layer = {key: (deeper[mode][key] - base[mode][key]) / layer_step for key in base[mode]}
        per_token = {key: (wider[mode][key] - base[mode][key]) / vocab_step for key in base[mode]}
        full = {key: base[mode][key] + (LAYERS - POINTS[0][0]) * per_layer[key]
                + (VOCAB - POINTS[0][1]) * per_token[key] for key in base[mode]}
        estimate = generation_estimate(full["prefill_ms"], full["decode_ms"], PUBLISHED["prompt_tokens"],
                                       PUBLISHED["prompt_tokens"])
        estimate.update(ttft_ratio=estimate["ttft_ms"] / PUBLISHED["ttft_ms"],
                        tokens_per_s_ratio=estimate["tokens_per_s"] / PUBLISHED["tokens_per_s"])
        results["modes"][mode] = {**estimate, "per_layer_ms": per_layer,
                                  "per_1k_vocabulary_ms": {k: v * 1000 for k, v in per_token.items()}}
        print(f"  ours {mode:9s} TTFT {estimate['ttft_ms']:8.2f} ms ({estimate['ttft_ratio']:.2f}x)   "
              f"{estimate['tokens_per_s']:6.2f} tokens/s ({estimate['tokens_per_s_ratio']:.2f}x)")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
