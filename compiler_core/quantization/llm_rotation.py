"""Rotate a Llama-family model's residual stream by an orthogonal matrix (QuaRot / SpinQuant style).

The residual stream of a decoder LLM carries a few outlier features tens to hundreds of times larger
than the rest (even after the attention sink is taken by a prefix: SmolLM2-135M still reaches ~700
in a few of its 576 features, against a few units elsewhere). One int16 scale per tensor is set by
those features, so every other feature keeps only a few hundred codes, and the rounding error of the
60 residual Adds of a 30-layer model adds up to flip the model's near-tied greedy choices.

An orthogonal ``Q`` (``d x d``) applied to the residual stream, ``x' = x Q``, changes nothing the
model computes (Ashkboos et al. 2024, "QuaRot"; Liu et al. 2024, "SpinQuant"):

- RMSNorm is invariant once its weight ``g`` is folded into the Linear layers that read it
  (``rms(x Q) = rms(x)``): a reader ``W`` becomes ``(W diag(g)) Q`` and ``g`` becomes 1;
- a writer (attention output and MLP down projections) ``W`` becomes ``Qᵀ W`` (and its bias ``b Q``);
- the token embedding ``E`` becomes ``E Q``; the LM head reads the final norm like any reader (a
  tied head is untied first).

The rotated stream spreads each outlier feature over all features, so its largest value falls to
about ``sqrt(2 ln d / d)`` of its norm and one per-tensor scale fits every feature. ``Q`` is a
random orthogonal matrix from a fixed seed (QR of a Gaussian matrix, signs fixed): any width works,
and the same model always gives the same ``Q``. Keys, values, attention and the MLP's inner
activations are unchanged.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)

SEED = 0
"""Seed of the random orthogonal matrix (a compile is reproducible)."""


def random_orthogonal(width: int, seed: int = SEED) -> np.ndarray:
    """A ``width x width`` orthogonal matrix, Haar-distributed: QR of a Gaussian matrix with ``R``'s signs fixed."""
    gaussian = np.random.default_rng(seed).standard_normal((width, width))
    q, r = np.linalg.qr(gaussian)
    return q * np.sign(np.diag(r))[None, :]


def rotate_residual(model: Any, seed: int = SEED) -> dict[str, Any]:
    """Rotate ``model``'s residual stream in place (norm weights folded, LM head untied); returns a summary.

    Args:
        model: a Llama-family ``*ForCausalLM`` in float32 (``model.model.layers[*]`` with ``self_attn``
            ``q/k/v/o_proj``, ``mlp`` ``gate/up/down_proj``, ``input_layernorm``,
            ``post_attention_layernorm``; ``model.model.norm``, ``model.lm_head``).
        seed: the seed of the orthogonal matrix.

    Returns:
        ``{"method": "random-orthogonal", "seed": seed, "width": d}``.
    """
    import torch

    from compiler_core.quantization.gptq import untie_lm_head

    untie_lm_head(model)
    inner = model.model
    width = inner.embed_tokens.weight.shape[1]
    q = torch.from_numpy(random_orthogonal(width, seed))
    with torch.no_grad():
        _set(inner.embed_tokens.weight, inner.embed_tokens.weight.double() @ q)
        for layer in inner.layers:
            attn, mlp = layer.self_attn, layer.mlp
            _fold_readers(layer.input_layernorm, (attn.q_proj, attn.k_proj, attn.v_proj), q)
            _rotate_writer(attn.o_proj, q)
            _fold_readers(layer.post_attention_layernorm, (mlp.gate_proj, mlp.up_proj), q)
            _rotate_writer(mlp.down_proj, q)
        _fold_readers(inner.norm, (model.lm_head,), q)
    logger.info("Rotated the residual stream (%d features) by a random orthogonal matrix (seed %d)", width, seed)
    return {"method": "random-orthogonal", "seed": seed, "width": width}


def _set(parameter, value) -> None:
    parameter.copy_(value.to(parameter.dtype))


def _fold_readers(norm: Any, linears: tuple, q) -> None:
    """``W -> (W diag(g)) Q`` for each Linear reading the norm, then ``g -> 1``."""
    gain = norm.weight.double()
    for linear in linears:
        _set(linear.weight, (linear.weight.double() * gain[None, :]) @ q)
    norm.weight.fill_(1.0)


def _rotate_writer(linear: Any, q) -> None:
    """``W -> Qᵀ W`` and ``b -> b Q`` for a Linear whose output is added to the residual stream."""
    _set(linear.weight, q.T @ linear.weight.double())
    if linear.bias is not None:
        _set(linear.bias, linear.bias.double() @ q)
