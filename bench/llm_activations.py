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

Usage: ``python bench/llm_activations.py [--variants all all-but-resid only-mlp all@10-19 ...] [--weights int16]
[--decode-samples 4] [--scale-margin 1.0] [--rotate] [--free] [--sqnr] [--shared-ranges] [--channel product ...]
[--percentile 99.99] [--bits resid=24]``: teacher-forced only unless ``--free``. A variant's ``@first-last``
quantizes only those layers. Every variant also prints the SQNR of its teacher-forced logits against the same
emulation unquantized (steadier than 320 top-1 choices); ``--sqnr`` the rounding SQNR of each class and its
worst tensor. ``--scale-margin`` is ``calibration.int16Headroom``; ``--shared-ranges`` gives both graphs the hull
of their ranges; ``--channel`` one scale per feature (the per-feature calibration of 1,024 tokens); ``--bits``
a class's code width (a width the numerics contract lacks is a ceiling, not a scheme).
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
    """Records calibration ranges or rounds tensors to integer codes of those ranges.

    Calibration records, per tensor, ``max |x|``, the per-feature (last axis) ``max |x|`` and, with
    ``percentile`` set, the largest per-sample ``percentile`` of ``|x|``. Quantization is symmetric with
    ``bits[class]`` bits (16 unless set), one scale per tensor from ``max |x|`` (or from the percentile),
    or one per feature for the classes in ``per_channel`` (each feature's range at least ``2^-10`` of the
    widest, as the compiler's per-channel feature maps); only tensors of layers ``layers`` (inclusive; the
    embedding is layer -1, the final norm and logits the last layer + 1) when set.
    """

    def __init__(self) -> None:
        self.ranges: dict[str, dict[str, float]] = {"prefill": defaultdict(float), "decode": defaultdict(float)}
        self.channel_ranges: dict[str, dict] = {"prefill": {}, "decode": {}}
        self.quantiles: dict[str, dict[str, float]] = {"prefill": defaultdict(float), "decode": defaultdict(float)}
        self.graph = "prefill"
        self.calibrating = True
        self.quantized: set[str] = set()
        self.margin = 1.0
        self.bits: dict[str, int] = {}
        self.per_channel: set[str] = set()
        self.percentile: float | None = None
        self.layers: tuple[int, int] | None = None
        self.last_layer = 0
        self.noise: dict[str, list[float]] | None = None

    def share(self) -> None:
        """Give both graphs the hull of their ranges of each tensor (the same tensors, calibrated on different tokens)."""
        import torch

        for table in (self.ranges, self.quantiles):
            for name in set(table["prefill"]) | set(table["decode"]):
                table["prefill"][name] = table["decode"][name] = max(table["prefill"][name], table["decode"][name])
        prefill, decode = self.channel_ranges["prefill"], self.channel_ranges["decode"]
        for name in set(prefill) | set(decode):
            a, b = prefill.get(name), decode.get(name)
            hull = torch.maximum(a, b) if a is not None and b is not None and a.shape == b.shape else None
            prefill[name] = decode[name] = hull

    def layer(self, name: str) -> int:
        head = name.split(".")[0]
        return int(head) if head.isdigit() else (-1 if name == "embed" else self.last_layer + 1)

    def __call__(self, kind: str, name: str, x):
        import torch

        ranges = self.ranges[self.graph]
        if self.calibrating:
            magnitude = torch.where(torch.isfinite(x), x.abs(), torch.zeros_like(x))
            ranges[name] = max(ranges[name], float(magnitude.max()) if magnitude.numel() else 0.0)
            if magnitude.numel():
                per_feature = magnitude.reshape(-1, x.shape[-1]).amax(0)
                known = self.channel_ranges[self.graph].get(name, per_feature)
                self.channel_ranges[self.graph][name] = (torch.maximum(known, per_feature)  # None: length varies
                                                         if known is not None and known.shape == per_feature.shape
                                                         else None)
                if self.percentile is not None:
                    flat = magnitude.flatten()
                    k = max(1, min(flat.numel(), int(np.ceil(flat.numel() * self.percentile / 100))))
                    quantile = float(flat.kthvalue(k).values)
                    self.quantiles[self.graph][name] = max(self.quantiles[self.graph][name], quantile)
            return x
        if kind not in self.quantized or not ranges[name]:
            return x
        if self.layers is not None and not self.layers[0] <= self.layer(name) <= self.layers[1]:
            return x
        qmax = 2 ** (self.bits.get(kind, 16) - 1) - 1
        if ((kind in self.per_channel or name.rpartition(".")[2] in self.per_channel)
                and self.channel_ranges[self.graph].get(name) is not None):
            width = self.channel_ranges[self.graph][name]
            width = torch.maximum(width, width.max() * 2 ** -10)
        elif self.percentile is not None:
            width = self.quantiles[self.graph][name] or ranges[name]
        else:
            width = ranges[name]
        scale = width * self.margin / qmax
        codes = torch.clamp(torch.sign(x) * torch.floor(x.abs() / scale + 0.5), -qmax, qmax)
        out = torch.where(torch.isfinite(x), codes * scale, x)
        if self.noise is not None:
            finite = torch.isfinite(x)
            signal, error = float(x[finite].pow(2).sum()), float((out - x)[finite].pow(2).sum())
            for key in (kind, name):
                entry = self.noise.setdefault(key, [0.0, 0.0])
                entry[0] += signal
                entry[1] += error
        return out


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
    """Free-running first divergences (``None`` unless ``free``), teacher-forced agreement with ``references``
    and the teacher-forced logits (one row per reference token, prompts in turn)."""
    import torch

    firsts, forced, rows = [], 0, []
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
        rows.append(logits)
    return (firsts if free else None), forced / (NEW_TOKENS * len(prompts)), torch.cat(rows)


def variants(names: list[str]) -> dict[str, tuple[set[str], tuple[int, int] | None]]:
    """Quantized classes and layer range per variant name (``fp32``, ``all``, ``all-but-<class>``,
    ``only-<class>``; ``<class>`` may be ``a+b``; a suffix ``@first-last`` quantizes only those layers)."""
    out, layers = {}, {}
    for full in names:
        name, _, span = full.partition("@")
        if span:
            first, _, last = span.partition("-")
            layers[full] = (int(first), int(last or first))
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
    return {full: (out[full.partition("@")[0]], layers.get(full)) for full in names}


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


def sqnr(exact, approximate) -> float:
    """Signal-to-noise ratio (dB) of ``approximate`` against ``exact``."""
    return 10 * np.log10(float(exact.pow(2).sum()) / max(float((approximate - exact).pow(2).sum()), 1e-30))


def sqnr_of(entry: list[float]) -> float:
    """SQNR (dB) of a ``[signal, error]`` energy pair."""
    return 10 * np.log10(entry[0] / max(entry[1], 1e-30))


def worst(noise: dict[str, list[float]], kind: str) -> str:
    """The tensor of class ``kind`` with the lowest rounding SQNR, as ``name dB``."""
    names = [name for name in noise if name not in CLASSES and classify(name) == kind]
    if not names:
        return "-"
    name = min(names, key=lambda n: sqnr_of(noise[n]))
    return f"{name} {sqnr_of(noise[name]):.1f}"


TENSOR_CLASSES = {"embed": "embed", "resid_attn": "resid", "resid_mlp": "resid", "in_norm": "norm", "post_norm": "norm",
                  "final_norm": "norm", "q": "qkv", "k": "qkv", "v": "qkv", "q_rope": "rope", "k_rope": "rope",
                  "past_k": "cache", "past_v": "cache", "scores": "scores", "probs": "softmax", "attn": "attn",
                  "o": "oproj", "gate": "mlp", "up": "mlp", "silu": "mlp", "product": "mlp", "down": "down",
                  "logits": "logits"}


def classify(name: str) -> str:
    """The class of tensor ``name`` (``12.q_rope`` -> ``rope``)."""
    return TENSOR_CLASSES[name.rpartition(".")[2]]


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
    parser.add_argument("--bits", nargs="+", default=[], metavar="CLASS=N", help="code width of a class (default 16)")
    parser.add_argument("--channel", nargs="+", default=[], metavar="CLASS",
                        help="classes (or tensor kinds: product, down, ...) quantized with one scale per feature "
                        "(last axis)")
    parser.add_argument("--percentile", type=float, help="ranges from the largest per-sample percentile of |x| "
                        "(e.g. 99.99) instead of the maximum; values beyond saturate")
    parser.add_argument("--shared-ranges", action="store_true", help="both graphs take the hull of their "
                        "calibrated ranges of each tensor (the decode graph's few calibration tokens miss rare outliers)")
    parser.add_argument("--sqnr", action="store_true", help="print each class's rounding SQNR (teacher-forced pass)")
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
    fq.bits = {kind: int(bits) for kind, _, bits in (item.partition("=") for item in args.bits)}
    fq.per_channel = set(args.channel)
    fq.percentile = args.percentile
    fq.last_layer = len(model.model.layers) - 1
    emulated = Emulated(model, fq)
    with torch.no_grad():
        calibrate(emulated, windows, args.decode_samples)
        if args.shared_ranges:
            fq.share()
        cache = prefix_cache(emulated)
        print(f"weights {args.weights}, {args.decode_samples} decode calibration tokens per window, range x "
              f"{args.scale_margin}, rotation {args.rotate}, bits {fq.bits or 16}, per-feature scales "
              f"{sorted(fq.per_channel) or 'none'}, percentile {args.percentile or 'max'}, shared ranges {args.shared_ranges}", flush=True)
        fq.quantized = set()
        _, _, exact = measure(emulated, cache, prompts, references, free=False)
        for name, (quantized, layers) in chosen.items():
            fq.quantized, fq.layers = quantized, layers
            fq.noise = {} if args.sqnr else None
            firsts, forced, logits = measure(emulated, cache, prompts, references, args.free)
            total = NEW_TOKENS * len(prompts)
            free = (f"first divergences {firsts}: mean {np.mean(firsts):4.1f}, {sum(firsts) / total:6.1%} before it; "
                    if firsts is not None else "")
            print(f"{name:22s} {free}teacher-forced {forced:6.1%}, logits SQNR {sqnr(exact, logits):5.1f} dB",
                  flush=True)
            if fq.noise:
                print("  rounding SQNR per class (dB, teacher-forced pass; worst tensor): " + ", ".join(
                    f"{kind} {sqnr_of(fq.noise[kind]):.1f} ({worst(fq.noise, kind)})"
                    for kind in CLASSES if kind in fq.noise), flush=True)


if __name__ == "__main__":
    main()
