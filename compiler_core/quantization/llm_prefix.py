"""The prefix tokens that take a decoder LLM's massive activations away from quantization (PrefixQuant).

Llama-family models put activations a hundred to a thousand times larger than the rest into the
residual stream of a few tokens -- the first token of a sequence (the attention sink), sometimes a
delimiter -- from an early layer on (Sun et al. 2024, "Massive activations in large language
models"). A per-tensor activation scale is then set by those tokens, and every other token keeps
only a few of its bits: SmolLM2-135M reaches ~2.5e4 on its first token from layer 12 on, against a
few hundred for every other token.

PrefixQuant (Chen et al. 2024, "PrefixQuant: eliminating outliers by prefixed tokens for large
language models quantization") puts the outlier tokens in front of every sequence and computes their
KV cache once, in full precision: the quantized graphs never see those activations. This module
chooses the prefix by measurement on the calibration text in FP32:

1. a start token: among the candidates (the tokenizer's special tokens), the one after which the
   largest residual-stream value of the other tokens is smallest;
2. then, while some later token still exceeds ``ratio`` times the median token peak, the most frequent
   such token is appended, if that halves the largest value again (up to ``max_tokens``).

A prefix that does not shrink the largest value at least ``min_gain`` times is not worth its cost
(a model without massive activations): the result is then empty.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)

OUTLIER_RATIO = 64.0
"""A token is an outlier when its residual-stream peak exceeds this many times the median token's."""
MIN_GAIN = 4.0
"""A prefix must shrink the largest residual value of the other tokens at least this many times."""


def token_peaks(model: Any, windows: Sequence[Sequence[int]], prefix: Sequence[int]) -> list[np.ndarray]:
    """Per window, each token's largest absolute residual-stream value over the decoder layers (FP32).

    The values of the ``prefix`` tokens are left out: ``[len(window)]`` per window.
    """
    import torch

    peaks = []
    with torch.no_grad():
        for window in windows:
            ids = torch.tensor([[*prefix, *window]], dtype=torch.int64)
            states = model(ids, output_hidden_states=True).hidden_states
            hidden = states[1:-1] or states[1:]  # after each layer (the last one is after the final norm)
            peak = torch.stack([state[0].abs().amax(-1) for state in hidden]).amax(0)
            peaks.append(peak[len(prefix):].numpy())
    return peaks


def largest_value(peaks: Sequence[np.ndarray]) -> float:
    """The largest of :func:`token_peaks`: the value that sets a per-tensor scale."""
    return float(max(peak.max() for peak in peaks))


def outlier_tokens(windows: Sequence[Sequence[int]], peaks: Sequence[np.ndarray], with_prefix: bool,
                   ratio: float = OUTLIER_RATIO) -> Counter:
    """How often each token id is an outlier (peak > ``ratio`` x the median peak), from :func:`token_peaks`.

    Without a prefix the first token of a window is left out: any token there is the attention sink.
    """
    median = float(np.median(np.concatenate(peaks)))
    counts: Counter = Counter()
    skip = 0 if with_prefix else 1
    for window, peak in zip(windows, peaks):
        counts.update(int(window[i]) for i in np.nonzero(peak > ratio * median)[0] if i >= skip)
    return counts


def select_prefix(model: Any, windows: Sequence[Sequence[int]], candidates: Sequence[int], *,
                  max_tokens: int = 3, ratio: float = OUTLIER_RATIO, min_gain: float = MIN_GAIN) -> dict[str, Any]:
    """Choose the prefix tokens by measurement (see the module docstring).

    Args:
        model: a transformers causal LM in FP32.
        windows: calibration token windows (a few of the prefill length are enough).
        candidates: start-token candidates, e.g. the tokenizer's special tokens.
        max_tokens: the longest prefix.
        ratio: the outlier threshold over the median token peak.
        min_gain: the smallest shrink of the largest value that makes a prefix worth it.

    Returns:
        ``{"token_ids": [...] (empty: no prefix), "largest_without": float, "largest_with": float,
        "candidates": {token_id: largest value after it}}``.
    """
    peaks = {(): token_peaks(model, windows, [])}
    without = largest_value(peaks[()])
    for token in dict.fromkeys(int(t) for t in candidates):
        peaks[(token,)] = token_peaks(model, windows, [token])
    scores = {key[0]: largest_value(value) for key, value in peaks.items() if key}
    report = {"token_ids": [], "largest_without": without, "largest_with": without, "candidates": scores}
    if not scores:
        return report
    prefix = (min(scores, key=scores.get),)
    largest = scores[prefix[0]]
    while len(prefix) < max_tokens:
        counts = outlier_tokens(windows, peaks[prefix], True, ratio)
        if not counts:
            break
        longer = (*prefix, counts.most_common(1)[0][0])
        peaks[longer] = token_peaks(model, windows, longer)
        if largest_value(peaks[longer]) > largest / 2:
            break
        prefix, largest = longer, largest_value(peaks[longer])
    if largest * min_gain > without:
        logger.info("No LLM prefix: the best (%s) leaves the largest value at %.3g of %.3g", prefix, largest, without)
        return report
    logger.info("LLM prefix %s: largest residual value %.3g -> %.3g", prefix, without, largest)
    return {**report, "token_ids": list(prefix), "largest_with": largest}


def candidate_tokens(config: Any, tokenizer: Any = None, limit: int = 8) -> list[int]:
    """Start-token candidates: the config's BOS/EOS/PAD and the tokenizer's special tokens, in that order."""
    ids = [getattr(config, name, None) for name in ("bos_token_id", "eos_token_id", "pad_token_id")]
    if tokenizer is not None:
        ids += list(getattr(tokenizer, "all_special_ids", []))
    flat = []
    for value in ids:
        flat += value if isinstance(value, list) else [value]
    vocab = int(config.vocab_size)
    return [int(t) for t in dict.fromkeys(flat) if t is not None and 0 <= int(t) < vocab][:limit]
