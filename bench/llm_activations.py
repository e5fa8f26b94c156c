"""Which int16 activations flip SmolLM2's greedy near-ties: an activations-only control in torch.

Runs SmolLM2-135M-Instruct with FP32 weights (``--weights int16`` rounds them like ``llm_accurate``)
through the two graphs of :mod:`compiler_core.frontends.llm` written out in torch, with every activation
fake-quantized as the compiler quantizes it: int16, symmetric, one scale per tensor, Max calibration
(``max |x| / 32767``) on the same calibration the compiler gets (16 windows of 64 Genesis tokens after the
prefix for the prefill graph; 4 decode tokens per window with the FP32 cache of the tokens before them
for the decode graph: each graph has its own ranges). Codes saturate outside the calibrated range.
Softmax, SiLU and RMSNorm are computed in float on the quantized input (the MFU's int16 routines and
LUTs are not emulated) and their output quantized.

Then each class of tensors is switched back to FP32 in turn (``all-but-<class>``), and each class is
quantized alone (``only-<class>``). Per variant: the free-running first divergences on the 10 prompts
of ``bench/llm.py`` (32 greedy tokens after the prefix ``<|endoftext|>``; the issue's measure) and the
teacher-forced top-1 agreement along FP32's continuation.

Classes: ``embed`` (token embedding), ``resid`` (residual stream after each Add), ``norm`` (RMSNorm
outputs), ``qkv`` (q/k/v projections), ``rope`` (q/k after RoPE, q scaled), ``cache`` (decode's cache
inputs), ``scores`` (q kᵀ), ``softmax`` (probabilities), ``attn`` (probabilities x v), ``oproj``,
``mlp`` (gate, up, SiLU(gate), their product), ``down``, ``logits`` (LM head output).

Usage: ``python bench/llm_activations.py [--variants all all-but-resid ...] [--weights int16]
[--decode-samples 4] [--scale-margin 1.0] [--rotate] [--free]``: teacher-forced only unless ``--free``.
``--ceiling [float64 float16 bfloat16]`` instead compares FP32 with the whole model computed in other
float types (transformers' own forward): how often another float arithmetic alone flips FP32's near-ties.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(REPO_ROOT / "bench"))

import numpy as np  # noqa: E402

CLASSES = ("embed", "resid", "norm", "qkv", "rope", "cache", "scores", "softmax", "attn", "oproj", "mlp", "down",
           "logits")
PREFIX = [0]  # <|endoftext|>: the prefix the llm preset chooses for SmolLM2
NEW_TOKENS = 32
PREFILL_LEN = 64
WINDOWS = 16
QMAX = 32767


class FakeQuant:
    """Records per-tensor ``max |x|`` (calibration) or rounds tensors to int16 codes of those ranges."""

    def __init__(self) -> None:
        self.ranges: dict[str, dict[str, float]] = {"prefill": defaultdict(float), "decode": defaultdict(float)}
        self.graph = "prefill"
        self.calibrating = True
        self.quantized: set[str] = set()
        self.margin = 1.0

    def __call__(self, kind: str, name: str, x):
        import torch

        ranges = self.ranges[self.graph]
        if self.calibrating:
            finite = x[torch.isfinite(x)]
            ranges[name] = max(ranges[name], float(finite.abs().max()) if finite.numel() else 0.0)
            return x
        if kind not in self.quantized or not ranges[name]:
            return x
        scale = ranges[name] * self.margin / QMAX
        codes = torch.clamp(torch.sign(x) * torch.floor(x.abs() / scale + 0.5), -QMAX, QMAX)
        return torch.where(torch.isfinite(x), codes * scale, x)


class Emulated:
    """SmolLM2's prefill/decode graphs in torch with a :class:`FakeQuant` at every activation."""

    def __init__(self, model, fq: FakeQuant) -> None:
        from compiler_core.frontends.llm import rope_tables

        self.model, self.fq = model, fq
        config = model.config
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = config.hidden_size // self.heads
        self.cos, self.sin = rope_tables(model, 256)
        self.eps = config.rms_norm_eps

    def norm(self, name: str, x, weight):
        import torch

        return self.fq("norm", name, x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * weight)

    def rope(self, x, positions):
        import torch

        cos, sin = self.cos[positions][None, None], self.sin[positions][None, None]
        half = x.shape[-1] // 2
        return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin

    def forward(self, ids: list[int], positions: list[int], cache: list | None):
        """Logits of ``ids`` at ``positions`` and the new keys/values; ``cache``: per layer (keys, values) before."""
        import torch

        fq, tokens = self.fq, len(ids)
        pos = torch.tensor(positions)
        hidden = fq("embed", "embed", self.model.model.embed_tokens(torch.tensor([ids])))
        present = []
        for index, layer in enumerate(self.model.model.layers):
            attn, name = layer.self_attn, f"{index}."
            normed = self.norm(name + "in_norm", hidden, layer.input_layernorm.weight)
            q = fq("qkv", name + "q", attn.q_proj(normed)).view(1, tokens, self.heads, self.head_dim).transpose(1, 2)
            k = fq("qkv", name + "k", attn.k_proj(normed)).view(1, tokens, self.kv_heads, -1).transpose(1, 2)
            v = fq("qkv", name + "v", attn.v_proj(normed)).view(1, tokens, self.kv_heads, -1).transpose(1, 2)
            q = fq("rope", name + "q_rope", self.rope(q, pos) * self.head_dim ** -0.5)
            k = fq("rope", name + "k_rope", self.rope(k, pos))
            present.append((k, v))
            past_k, past_v = cache[index]
            past_k = fq("cache", name + "past_k", past_k)
            past_v = fq("cache", name + "past_v", past_v)
            if fq.graph == "decode" and tokens > 1:  # a batch of decode steps: later tokens read earlier ones
                k, v = fq("cache", name + "past_k", k), fq("cache", name + "past_v", v)  # from the cache
            keys, values = torch.cat([past_k, k], 2), torch.cat([past_v, v], 2)
            group = self.heads // self.kv_heads
            q = q.reshape(1, self.kv_heads, group * tokens, self.head_dim)
            scores = fq("scores", name + "scores", q @ keys.transpose(2, 3))
            past = past_k.shape[2]
            mask = torch.ones(tokens, past + tokens, dtype=torch.bool)
            mask[:, past:] = torch.tril(torch.ones(tokens, tokens, dtype=torch.bool))
            scores = torch.where(mask.repeat(group, 1)[None, None], scores, float("-inf"))
            probs = fq("softmax", name + "probs", torch.softmax(scores, -1))
            out = fq("attn", name + "attn", probs @ values)
            out = out.reshape(1, self.heads, tokens, self.head_dim).transpose(1, 2).reshape(1, tokens, -1)
            hidden = fq("resid", name + "resid_attn", hidden + fq("oproj", name + "o", attn.o_proj(out)))
            normed = self.norm(name + "post_norm", hidden, layer.post_attention_layernorm.weight)
            mlp = layer.mlp
            gate = fq("mlp", name + "gate", mlp.gate_proj(normed))
            up = fq("mlp", name + "up", mlp.up_proj(normed))
            product = fq("mlp", name + "product", fq("mlp", name + "silu", torch.nn.functional.silu(gate)) * up)
            hidden = fq("resid", name + "resid_mlp", hidden + fq("down", name + "down", mlp.down_proj(product)))
        normed = self.norm("final_norm", hidden, self.model.model.norm.weight)
        return fq("logits", "logits", self.model.lm_head(normed))[0], present


class Session:
    """A prompt run through the emulated prefill graph, then one emulated decode step per token."""

    def __init__(self, emulated: Emulated, prefix_cache: list) -> None:
        self.emulated, self.prefix_cache = emulated, prefix_cache

    def prompt(self, ids: list[int]):
        """Last-position logits of the prompt (prefill graph); the cache holds the prefix and the prompt."""
        import torch

        start = len(PREFIX)
        self.emulated.fq.graph = "prefill"
        logits, present = self.emulated.forward(ids, list(range(start, start + len(ids))), self.prefix_cache)
        self.cache = [(torch.cat([pk, k], 2), torch.cat([pv, v], 2))
                      for (pk, pv), (k, v) in zip(self.prefix_cache, present)]
        return logits[-1]

    def step(self, token: int):
        """Logits of ``token`` at the next position (decode graph); its key/value appended to the cache."""
        return self.steps([token])[-1]

    def steps(self, tokens: list[int]):
        """Logits of one decode step per token of ``tokens``, computed in one batch (teacher forcing).

        Per-tensor quantization is element-wise, so a batch equals the steps one by one, except that a
        token's own key/value is quantized with the cache input's scale rather than its output's.
        """
        import torch

        self.emulated.fq.graph = "decode"
        position = self.cache[0][0].shape[2]
        logits, present = self.emulated.forward(tokens, list(range(position, position + len(tokens))), self.cache)
        self.cache = [(torch.cat([ck, k], 2), torch.cat([cv, v], 2)) for (ck, cv), (k, v) in zip(self.cache, present)]
        return logits


def prefix_cache(emulated: Emulated) -> list:
    """The prefix's FP32 keys/values (computed once at compile time, as the compiler does)."""
    import torch

    fq = emulated.fq
    calibrating, fq.calibrating = fq.calibrating, False
    quantized, fq.quantized = fq.quantized, set()
    empty = torch.zeros(1, emulated.kv_heads, 0, emulated.head_dim)
    _, present = emulated.forward(PREFIX, list(range(len(PREFIX))), [(empty, empty)] * len(emulated.model.model.layers))
    fq.calibrating, fq.quantized = calibrating, quantized
    return present


def calibrate(emulated: Emulated, windows: list[list[int]], decode_per_window: int, seed: int = 0) -> None:
    """Max ranges of the prefill graph on ``windows`` and of the decode graph on tokens at random positions."""
    rng = np.random.default_rng(seed)
    emulated.fq.calibrating = True
    cache = prefix_cache(emulated)
    for window in windows:
        session = Session(emulated, cache)
        session.prompt(window)
        full = session.cache
        for index in sorted(rng.choice(np.arange(1, len(window)), size=decode_per_window, replace=False).tolist()):
            session.cache = [(k[:, :, :len(PREFIX) + index], v[:, :, :len(PREFIX) + index]) for k, v in full]
            session.step(window[index])
    emulated.fq.calibrating = False


def measure(emulated: Emulated, cache: list, prompts: list[list[int]], references: list[list[int]],
            free: bool = True):
    """Free-running first divergences (``None`` unless ``free``) and teacher-forced agreement with ``references``."""
    import torch

    firsts, forced = [], 0
    for ids, reference in zip(prompts, references):
        if free:
            session = Session(emulated, cache)
            logits, ours = session.prompt(ids), []
            for _ in range(NEW_TOKENS):
                ours.append(int(logits.argmax()))
                logits = session.step(ours[-1])
            firsts.append(next((i for i, (a, b) in enumerate(zip(ours, reference)) if a != b), NEW_TOKENS))
        session = Session(emulated, cache)
        logits = torch.cat([session.prompt(ids)[None], session.steps(reference[:-1])])
        forced += int((logits.argmax(-1) == torch.tensor(reference)).sum())
    return (firsts if free else None), forced / (NEW_TOKENS * len(prompts))


def variants(names: list[str]) -> dict[str, set[str]]:
    """Quantized classes per variant name (``fp32``, ``all``, ``all-but-<class>``, ``only-<class>``)."""
    out = {}
    for name in names:
        if name == "fp32":
            out[name] = set()
        elif name == "all":
            out[name] = set(CLASSES)
        elif name.startswith("all-but-"):
            out[name] = set(CLASSES) - set(name[len("all-but-"):].split("+"))
        elif name.startswith("only-"):
            out[name] = set(name[len("only-"):].split("+"))
        else:
            sys.exit(f"unknown variant {name!r}")
        unknown = out[name] - set(CLASSES)
        if unknown:
            sys.exit(f"unknown class(es) {sorted(unknown)} in {name!r}; classes: {CLASSES}")
    return out


def ceiling(model, prompts: list[list[int]], references: list[list[int]], dtypes: list[str]) -> None:
    """Free-running and teacher-forced agreement of the whole model computed in other float types (transformers)."""
    import copy

    import torch
    from llm_weights import agreement

    for name in dtypes:
        other = copy.deepcopy(model).to(getattr(torch, name))
        firsts, agree = agreement(other, prompts, references)
        total = NEW_TOKENS * len(prompts)
        print(f"model in {name:8s} first divergences {firsts}: mean {np.mean(firsts):4.1f}, "
              f"{sum(firsts) / total:6.1%} before it; teacher-forced {agree / total:6.1%}", flush=True)


def main() -> None:
    import torch
    from llm import CALIBRATION_PASSAGE, PROMPTS
    from llm_weights import greedy, round_weight

    from compiler_core.frontends.llm import load_causal_lm, smollm2_gguf_path
    from compiler_core.llm import kjv_text, token_chunks

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", nargs="+", default=["fp32", "all", *(f"all-but-{c}" for c in CLASSES)])
    parser.add_argument("--weights", choices=("fp32", "int16"), default="fp32")
    parser.add_argument("--decode-samples", type=int, default=4, help="decode calibration tokens per window")
    parser.add_argument("--scale-margin", type=float, default=1.0, help="multiply every calibrated range")
    parser.add_argument("--prompts", type=int, default=len(PROMPTS))
    parser.add_argument("--rotate", action="store_true", help="rotate the residual stream first "
                        "(compiler_core.quantization.llm_rotation)")
    parser.add_argument("--ceiling", nargs="*", metavar="DTYPE", help="only compare FP32 with the whole model in "
                        "these torch dtypes (float64 float16 bfloat16): how often another float arithmetic flips "
                        "FP32's near-ties")
    parser.add_argument("--free", action="store_true", help="also free-running generation (32 decode steps a prompt)")
    args = parser.parse_args()
    chosen = variants(args.variants)
    torch.set_num_threads(1)
    model, tokenizer = load_causal_lm(smollm2_gguf_path())
    prompts = [tokenizer(prompt)["input_ids"] for prompt in PROMPTS[:args.prompts]]
    references = [greedy(model, ids) for ids in prompts]  # FP32 weights and activations, transformers' own loop
    if args.ceiling is not None:
        ceiling(model, prompts, references, args.ceiling or ["float64", "float16", "bfloat16"])
        return
    if args.rotate:
        from compiler_core.quantization.llm_rotation import rotate_residual

        probe = torch.tensor([PREFIX + prompts[0]])
        with torch.no_grad():
            before = model(probe).logits
            rotate_residual(model)
            after = model(probe).logits
        print(f"rotated residual stream: FP32 logits change by at most {float((after - before).abs().max()):.2e}")
    if args.weights == "int16":
        with torch.no_grad():
            for module in model.modules():
                if isinstance(module, torch.nn.Linear):
                    module.weight.copy_(round_weight(module.weight, "int16"))
    calibration = tokenizer(kjv_text(CALIBRATION_PASSAGE))["input_ids"]
    windows = [chunk.tolist() for chunk in token_chunks(calibration, PREFILL_LEN, WINDOWS)]
    fq = FakeQuant()
    fq.margin = args.scale_margin
    emulated = Emulated(model, fq)
    with torch.no_grad():
        calibrate(emulated, windows, args.decode_samples)
        cache = prefix_cache(emulated)
        print(f"weights {args.weights}, {args.decode_samples} decode calibration tokens per window, range x "
              f"{args.scale_margin}, rotation {args.rotate}", flush=True)
        for name, quantized in chosen.items():
            fq.quantized = quantized
            firsts, forced = measure(emulated, cache, prompts, references, args.free)
            total = NEW_TOKENS * len(prompts)
            free = (f"first divergences {firsts}: mean {np.mean(firsts):4.1f}, {sum(firsts) / total:6.1%} before it; "
                    if firsts is not None else "")
            print(f"{name:22s} {free}teacher-forced {forced:6.1%}", flush=True)


if __name__ == "__main__":
    main()
