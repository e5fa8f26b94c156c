"""How far greedy generation drifts when only SmolLM2's weights are rounded: the floor a weight format sets.

Runs SmolLM2-135M-Instruct in torch FP32 with the weights of every Linear and the embedding rounded
(activations stay FP32) and compares its greedy generations with the unrounded model on the 10 prompts
of ``bench/llm.py``, after the same prefix token as the ``llm`` preset's MXQ (``<|endoftext|>``):

- ``int8``: per-output-channel symmetric int8 (the ``llm`` preset's weight format);
- ``int8-body``: the same, the tied embedding / LM head kept in FP32;
- ``int8-g64``: int8 with one scale per 64 input weights (group-wise);
- ``g64-head``: the same with the compiler's convention (LM head untied and rounded, embedding table float),
  the peer of ``int8-mse`` for a group-wise format;
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

``--rotate`` rotates the residual stream first, as the compiler's ``llm.rotate`` does
(``compiler_core.quantization.llm_rotation.rotate_residual``: norm gains folded into the readers, LM head
untied), and rounds the rotated weights; the reference stays the unrotated FP32 model (as ``bench/llm.py``
compares a rotated MXQ with it). ``--only PATTERN`` (repeatable) rounds only the Linear/Embedding modules whose
name matches one of the ``fnmatch`` patterns (e.g. ``--only '*.o_proj' --only '*.down_proj'``), ``--keep
PATTERN`` all but those (the others keep their FP32 -- or rotated FP32 -- weights): which layers the loss comes
from.
``--vo-rotate`` also rotates each KV head's values by a random orthogonal ``D x D`` matrix folded into
``v_proj`` (rows) and ``o_proj`` (columns): exact in FP32, it spreads ``o_proj``'s input features.

Usage: ``python bench/llm_weights.py [--rotate] [--only P] [--keep P] [int8 int16 fp16 int8-mse gptq ...]``.
"""

from __future__ import annotations

import argparse
import copy
import fnmatch
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(REPO_ROOT / "bench"))

import numpy as np  # noqa: E402

FORMATS = ("fp16", "int8", "int8-body", "int8-g64", "g64-head", "int16", "int8-mse", "gptq", "gptq-act")
COMPILER_CONVENTION = ("int8-mse", "g64-head")
"""Formats rounded as the compiler does: LM head untied and rounded, the embedding table float."""
GPTQ_WINDOWS = 32
"""Calibration windows of ``GPTQ_WINDOW`` Genesis tokens for the GPTQ Hessians."""
GPTQ_WINDOW = 128
PREFIX = [0]  # <|endoftext|>: the prefix the llm preset chooses for SmolLM2
NEW_TOKENS = 32


def rounded(model, kind: str, windows: list[list[int]], selected=None):
    """A copy of ``model`` with its Linear/Embedding weights rounded to ``kind`` (``windows``: GPTQ calibration);
    ``selected(name)`` says which modules are rounded (default: all), the others keep ``model``'s weights."""
    import torch

    from compiler_core.quantization import gptq

    copied = copy.deepcopy(model)
    if kind.startswith("gptq"):
        summary = gptq.gptq_model(copied, windows, prefix=PREFIX, act_order=kind == "gptq-act")
        print(f"{kind:10s} {summary}", flush=True)
    else:
        if kind in COMPILER_CONVENTION:
            gptq.untie_lm_head(copied)
        with torch.no_grad():
            for name, module in copied.named_modules():
                if not isinstance(module, (torch.nn.Linear, torch.nn.Embedding)):
                    continue
                if kind == "int8-body" and (isinstance(module, torch.nn.Embedding) or name == "lm_head"):
                    continue
                if kind in COMPILER_CONVENTION and isinstance(module, torch.nn.Embedding):
                    continue
                module.weight.copy_(round_weight(module.weight, kind))
    if selected is not None:
        originals = dict(model.named_modules())
        with torch.no_grad():
            for name, module in copied.named_modules():
                if isinstance(module, (torch.nn.Linear, torch.nn.Embedding)) and not selected(name):
                    module.weight.copy_(originals[name].weight)
    return copied


def rotate_values(model, seed: int = 1) -> None:
    """Rotate every KV head's values by one random orthogonal ``D x D`` matrix ``R``, folded exactly: each head's
    rows of ``v_proj`` become ``Rᵀ W_v`` and each query head's columns of ``o_proj`` ``W_o R`` (attention mixes
    value rows, so ``softmax(s) (V R) Rᵀ = softmax(s) V``; with one ``R`` for all heads GQA needs no bookkeeping)."""
    import torch

    from compiler_core.quantization.llm_rotation import random_orthogonal

    config = model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    r = torch.from_numpy(random_orthogonal(head_dim, seed))
    with torch.no_grad():
        for layer in model.model.layers:
            v, o = layer.self_attn.v_proj, layer.self_attn.o_proj
            wv = v.weight.double().view(config.num_key_value_heads, head_dim, -1)
            v.weight.copy_(torch.einsum("de,hdi->hei", r, wv).reshape(v.weight.shape).float())
            if v.bias is not None:
                v.bias.copy_((v.bias.double().view(-1, head_dim) @ r).reshape(-1).float())
            wo = o.weight.double().view(o.weight.shape[0], config.num_attention_heads, head_dim)
            o.weight.copy_((wo @ r).reshape(o.weight.shape).float())


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
    grouped = weight.view(weight.shape[0], -1, 64) if kind in ("int8-g64", "g64-head") else weight[:, None]
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

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("formats", nargs="*", help=f"weight formats among {FORMATS} (default: all)")
    parser.add_argument("--rotate", action="store_true", help="rotate the residual stream first (llm.rotate)")
    parser.add_argument("--vo-rotate", action="store_true", help="rotate each KV head's values (v_proj/o_proj)")
    parser.add_argument("--only", action="append", metavar="PATTERN", help="round only the modules matching "
                        "this fnmatch pattern (repeat for more)")
    parser.add_argument("--keep", action="append", metavar="PATTERN", help="keep the modules matching this "
                        "pattern unrounded (repeat for more)")
    args = parser.parse_args()
    kinds = args.formats or list(FORMATS)
    unknown = set(kinds) - set(FORMATS)
    if unknown:
        sys.exit(f"unknown format(s) {sorted(unknown)}; choose from {FORMATS}")
    selected = None
    if args.only or args.keep:
        def selected(name: str) -> bool:
            if args.only and not any(fnmatch.fnmatch(name, p) for p in args.only):
                return False
            return not (args.keep and any(fnmatch.fnmatch(name, p) for p in args.keep))
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
    if args.rotate or args.vo_rotate:
        from compiler_core.quantization.llm_rotation import rotate_residual

        probe = torch.tensor([PREFIX + prompts[0]])
        with torch.no_grad():
            before = model(probe).logits
            if args.rotate:
                rotate_residual(model)
            if args.vo_rotate:
                rotate_values(model)
            after = model(probe).logits
        print(f"rotated (residual {args.rotate}, values {args.vo_rotate}): FP32 logits change by at most "
              f"{float((after - before).abs().max()):.2e}", flush=True)
    if selected is not None:
        print(f"rounding only {args.only or 'all'}, keeping {args.keep or 'none'}", flush=True)
    for kind in kinds:
        other = rounded(model, kind, windows, selected)
        firsts, agree = agreement(other, prompts, references)
        total = NEW_TOKENS * len(prompts)
        top1, ppl = heldout(other, held_reference, held)
        print(f"{kind:10s} first divergences {firsts}: mean {np.mean(firsts):.1f}, {sum(firsts) / total:.1%} before "
              f"it; teacher-forced agreement {agree / total:.1%}; held-out top-1 agreement {top1:.1%}, perplexity "
              f"{ppl:.3f}", flush=True)


if __name__ == "__main__":
    main()
