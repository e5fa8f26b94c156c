"""How far greedy generation drifts when only SmolLM2's weights are rounded: the floor a weight format sets.

Runs SmolLM2-135M-Instruct in torch FP32 with the weights of every Linear and the embedding rounded
(activations stay FP32) and compares its greedy generations with the unrounded model on the 10 prompts
of ``bench/llm.py``, after the same prefix token as the ``llm`` preset's MXQ (``<|endoftext|>``):

- ``int8``: per-output-channel symmetric int8 (the ``llm`` preset's weight format);
- ``int8-body``: the same, the tied embedding / LM head kept in FP32;
- ``int8-g64``: int8 with one scale per 64 input weights (group-wise);
- ``int16``: per-output-channel int16;
- ``fp16``: IEEE half precision (a control: how often a tiny perturbation flips a near-tie);
- ``int8-mse``: what the compiler does to every Linear (the LM head included, untied): per-channel int8
  with the MSE-chosen clip of each row; the embedding table stays float (the MXQ holds it in int16 codes);
- ``gptq``: the same scales, codes chosen by GPTQ (``compiler_core.quantization.gptq``) on
  ``--windows`` windows of 128 Genesis tokens (the calibration text, after the prefix);
- ``gptq-act``: GPTQ rounding the columns with the largest Hessian diagonal first (act-order).

Prints, per format, the free-running first divergences (the issue's measure: mean position and share
of tokens before it), the teacher-forced top-1 agreement along FP32's continuation, and over 1,008
held-out tokens (16 windows of 64 tokens of Matthew, after the prefix) the top-1 agreement with FP32
and the perplexity (a steadier measure than 320 greedy tokens).

Usage: ``python bench/llm_weights.py [int8 int16 fp16 int8-mse gptq ...]``.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(REPO_ROOT / "bench"))

import numpy as np  # noqa: E402

FORMATS = ("fp16", "int8", "int8-body", "int8-g64", "int16", "int8-mse", "gptq", "gptq-act")
GPTQ_WINDOWS = 32
"""Calibration windows of ``GPTQ_WINDOW`` Genesis tokens for the GPTQ Hessians."""
GPTQ_WINDOW = 128
PREFIX = [0]  # <|endoftext|>: the prefix the llm preset chooses for SmolLM2
NEW_TOKENS = 32


def rounded(model, kind: str, windows: list[list[int]]):
    """A copy of ``model`` with its Linear/Embedding weights rounded to ``kind`` (``windows``: GPTQ calibration)."""
    import torch

    from compiler_core.quantization import gptq

    copied = copy.deepcopy(model)
    if kind.startswith("gptq"):
        summary = gptq.gptq_model(copied, windows, prefix=PREFIX, act_order=kind == "gptq-act")
        print(f"{kind:10s} {summary}", flush=True)
        return copied
    if kind == "int8-mse":
        gptq.untie_lm_head(copied)
    with torch.no_grad():
        for name, module in copied.named_modules():
            if not isinstance(module, (torch.nn.Linear, torch.nn.Embedding)):
                continue
            if kind == "int8-body" and (isinstance(module, torch.nn.Embedding) or name == "lm_head"):
                continue
            if kind == "int8-mse" and isinstance(module, torch.nn.Embedding):
                continue
            module.weight.copy_(round_weight(module.weight, kind))
    return copied


def round_weight(weight, kind: str):
    """``weight`` rounded to ``kind`` (per output channel, or per group of 64 inputs for ``int8-g64``)."""
    import torch

    if kind == "fp16":
        return weight.half().float()
    if kind == "int8-mse":
        from compiler_core.quantization.fixedpoint import round_half_away_float
        from compiler_core.quantization.kernels.linear import weight_channel_scales

        rows = weight.double().numpy()
        scale = weight_channel_scales(rows, 8)[:, None]
        return torch.from_numpy(np.clip(round_half_away_float(rows / scale), -127, 127) * scale).float()
    qmax = 32767 if kind == "int16" else 127
    grouped = weight.view(weight.shape[0], -1, 64) if kind == "int8-g64" else weight[:, None]
    scale = grouped.abs().amax(-1, keepdim=True).clamp_min(1e-12) / qmax
    return (torch.round(grouped / scale) * scale).view_as(weight)


def greedy(model, ids: list[int]) -> list[int]:
    """``NEW_TOKENS`` greedy tokens after the prefix and ``ids`` (transformers' KV cache)."""
    import torch

    with torch.no_grad():
        out = model.generate(torch.tensor([PREFIX + ids]), max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                             do_sample=False)
    return out[0, len(PREFIX) + len(ids):].tolist()


def forced(model, ids: list[int], reference: list[int]) -> int:
    """Positions along ``reference`` where ``model``'s argmax is the reference token."""
    import torch

    with torch.no_grad():
        logits = model(torch.tensor([PREFIX + ids + reference])).logits[0, len(PREFIX) + len(ids) - 1:-1]
    return sum(int(a) == b for a, b in zip(logits.argmax(-1).tolist(), reference))


def agreement(model, prompts: list[list[int]], references: list[list[int]]) -> tuple[list[int], int]:
    """Per prompt, the first greedy token that differs from the reference (NEW_TOKENS if none), and the
    teacher-forced top-1 matches over all prompts."""
    firsts, agree = [], 0
    for ids, reference in zip(prompts, references):
        ours = greedy(model, ids)
        firsts.append(next((i for i, (a, b) in enumerate(zip(ours, reference)) if a != b), NEW_TOKENS))
        agree += forced(model, ids, reference)
    return firsts, agree


def heldout(model, reference_logits: list, windows: list[list[int]]) -> tuple[float, float]:
    """Top-1 agreement with ``reference_logits`` and perplexity of ``model`` over ``windows`` (after the prefix)."""
    import torch

    agree, total, loss = 0, 0, 0.0
    with torch.no_grad():
        for window, reference in zip(windows, reference_logits):
            logits = model(torch.tensor([PREFIX + window])).logits[0, len(PREFIX):-1]
            agree += int((logits.argmax(-1) == reference.argmax(-1)).sum())
            loss += float(torch.nn.functional.cross_entropy(logits, torch.tensor(window[1:]), reduction="sum"))
            total += len(window) - 1
    return agree / total, float(np.exp(loss / total))


def main() -> None:
    import torch
    from llm import CALIBRATION_PASSAGE, HELDOUT_PASSAGE, PROMPTS

    from compiler_core.frontends.llm import load_causal_lm, smollm2_gguf_path
    from compiler_core.llm import kjv_text, token_chunks

    kinds = sys.argv[1:] or list(FORMATS)
    unknown = set(kinds) - set(FORMATS)
    if unknown:
        sys.exit(f"unknown format(s) {sorted(unknown)}; choose from {FORMATS}")
    torch.set_num_threads(1)
    model, tokenizer = load_causal_lm(smollm2_gguf_path())
    prompts = [tokenizer(prompt)["input_ids"] for prompt in PROMPTS]
    references = [greedy(model, ids) for ids in prompts]
    calibration = tokenizer(kjv_text(CALIBRATION_PASSAGE))["input_ids"]
    windows = [chunk.tolist() for chunk in token_chunks(calibration, GPTQ_WINDOW, GPTQ_WINDOWS)]
    held = [chunk.tolist() for chunk in token_chunks(tokenizer(kjv_text(HELDOUT_PASSAGE))["input_ids"], 64, 16)]
    with torch.no_grad():
        held_reference = [model(torch.tensor([PREFIX + w])).logits[0, len(PREFIX):-1] for w in held]
    print(f"FP32       held-out perplexity {heldout(model, held_reference, held)[1]:.3f}", flush=True)
    for kind in kinds:
        other = rounded(model, kind, windows)
        firsts, agree = agreement(other, prompts, references)
        total = NEW_TOKENS * len(prompts)
        top1, ppl = heldout(other, held_reference, held)
        print(f"{kind:10s} first divergences {firsts}: mean {np.mean(firsts):.1f}, {sum(firsts) / total:.1%} before "
              f"it; teacher-forced agreement {agree / total:.1%}; held-out top-1 agreement {top1:.1%}, perplexity "
              f"{ppl:.3f}", flush=True)


if __name__ == "__main__":
    main()
