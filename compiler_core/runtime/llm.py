"""Text generation on the simulator with a compiled LLM (``.llm.json`` + prefill/decode MXQs).

:class:`LlmModel` keeps the KV cache (float32, ``[1, KVH, L, D]`` per layer and kind) between calls:
the prompt's first N tokens go through the prefill graph at once (a shorter prompt is padded on the
right; the causal mask keeps padding out), later prompt tokens and every generated token through the
decode graph, one at a time, each new key/value written into the cache slot of its position.

A model compiled with a prefix (:class:`~compiler_core.frontends.llm.LlmPrefix`) has its FP32 keys/values
in the first P cache slots after every reset; prompts start at position P.

``LlmModel(path, reference=True)`` runs the same loop on the FP32 ONNX exports in onnxruntime: the
float reference that the MXQ generation is compared with (the workbench's "Try it" shows both).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from compiler_core.errors import ArgumentError
from compiler_core.frontends.llm import LlmPrefix, LlmShape, cache_names, decode_mask, prefill_feed
from compiler_core.llm import read_manifest
from compiler_core.runtime.model import Accelerator, Model

logger = logging.getLogger(__name__)


@dataclass
class Generation:
    """Generated tokens and timings.

    Attributes:
        tokens: the new token ids (the prompt excluded).
        prefill_seconds: wall time of the prompt (prefill + any prompt tokens through decode).
        decode_seconds: wall time of each decode step.
    """

    tokens: list[int] = field(default_factory=list)
    prefill_seconds: float = 0.0
    decode_seconds: list[float] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable summary."""
        steps = self.decode_seconds
        return {"tokens": self.tokens, "prefill_seconds": round(self.prefill_seconds, 4),
                "decode_seconds_per_token": round(float(np.mean(steps)), 4) if steps else None}


class LlmModel:
    """A compiled decoder LLM on the simulator.

    Args:
        manifest_path: the ``.llm.json`` written by :func:`compiler_core.llm.compile_llm`.
        device: the simulated device (default: the one compiled for).
        reference: run the FP32 ONNX exports in onnxruntime instead of the MXQs.
    """

    def __init__(self, manifest_path: str | Path, device: str | None = None, *, reference: bool = False) -> None:
        self.path = Path(manifest_path)
        self.manifest = read_manifest(self.path)
        self.prefix = self._read_prefix()
        self.shape = LlmShape(self.manifest["prefill_len"], self.manifest["max_len"],
                              bool(self.manifest.get("last_logits", False)), len(self.prefix) if self.prefix else 0)
        self.reference = reference
        self._runners = self._reference_runners() if reference else self._npu_runners(device)
        self.layers = int(self.manifest["layers"])
        self._names = cache_names(self.layers)
        self._past = cache_names(self.layers, "past_")
        self.cache: list[np.ndarray] = []
        self.reset()

    @property
    def start(self) -> int:
        """The position of a prompt's first token (the prefix length)."""
        return self.shape.prefix_len

    @property
    def eos_token_id(self) -> int | None:
        """The end-of-sequence token, when the model has one."""
        return self.manifest.get("eos_token_id")

    def tokenizer(self):
        """The tokenizer saved beside the manifest (transformers), or ``None``."""
        name = self.manifest.get("tokenizer")
        if not name:
            return None
        import transformers

        return transformers.AutoTokenizer.from_pretrained(str(self.path.parent / name), local_files_only=True)

    def reset(self) -> None:
        """Empty the KV cache."""
        kv_heads, head_dim = int(self.manifest["kv_heads"]), int(self.manifest["head_dim"])
        self.cache = [np.zeros((1, kv_heads, self.shape.max_len, head_dim), np.float32) for _ in self._names]
        for slot, fixed in zip(self.cache, self.prefix.cache if self.prefix else ()):
            slot[:, :, :self.start] = fixed

    def _read_prefix(self) -> LlmPrefix | None:
        entry = self.manifest.get("prefix")
        if not entry:
            return None
        path = self.path.parent / entry["cache"]
        if not path.is_file():
            raise ArgumentError(f"The prefix cache {path.name} named by {self.path.name} is missing.",
                                hint="Keep the files compile_llm writes beside the manifest, or compile again.")
        return LlmPrefix.load(path)

    # -- single steps --------------------------------------------------------------------------------

    def prefill(self, token_ids: Sequence[int]) -> np.ndarray:
        """Run up to N tokens from :attr:`start` through the prefill graph; fill the cache; logits ``[T, V]``.

        A ``last_logits`` model takes exactly N tokens and gives the last position's logits, ``[1, V]``.
        """
        count = len(token_ids)
        if not 1 <= count <= self.shape.prefill_len:
            raise ArgumentError(f"prefill takes 1 to {self.shape.prefill_len} tokens, got {count}.")
        if self.shape.last_logits and count < self.shape.prefill_len:
            raise ArgumentError(f"This model's prefill graph gives the logits of position {self.shape.prefill_len - 1} "
                                f"only, so it needs prompts of at least {self.shape.prefill_len} tokens, got {count}.",
                                hint="Compile without last_logits to generate from shorter prompts.")
        outputs = self._run("prefill", prefill_feed(np.asarray(token_ids), self.shape))
        for slot, value in zip(self.cache, (outputs[name] for name in self._names)):
            slot[:, :, self.start:self.start + count] = value[:, :, :count]
        return outputs["logits"][0, :count]

    def decode(self, token_id: int, position: int) -> np.ndarray:
        """One token at ``position`` (cache slots below it are filled); writes its key/value; logits ``[V]``.

        ``position`` counts the prefix: a prompt's first token is at :attr:`start`.
        """
        if not self.start <= position < self.shape.max_len:
            raise ArgumentError(f"Position {position} is past the KV cache ({self.shape.max_len} positions).",
                                hint="Compile with a larger max_len, or generate fewer tokens.")
        feed = {"input_ids": np.array([[token_id]], np.int64), "position_ids": np.array([[position]], np.int64),
                "cache_mask": decode_mask(position, self.shape)}
        feed.update(zip(self._past, self.cache))
        outputs = self._run("decode", feed)
        for slot, name in zip(self.cache, self._names):
            slot[:, :, position] = outputs[name][:, :, 0]
        return outputs["logits"][0, 0]

    def _npu_runners(self, device: str | None) -> dict[str, Callable]:
        accelerator = Accelerator(device or self.manifest["device"])
        runners = {}
        for kind in ("prefill", "decode"):
            model = Model(self.path.parent / self.manifest[kind], input_layout="NCHW")
            model.launch(accelerator)
            names = [spec.name for spec in model.artifact.output_specs]
            runners[kind] = lambda feed, model=model, names=names: dict(zip(names, model.infer(feed)))
        return runners

    def _reference_runners(self) -> dict[str, Callable]:
        import onnxruntime

        runners = {}
        for kind in ("prefill", "decode"):
            path = self.path.parent / f"{self.path.name[: -len('.llm.json')]}.{kind}.onnx"
            if not path.is_file():
                raise ArgumentError(f"The FP32 export {path.name} is missing, so there is no reference to run.",
                                    hint="Keep the .onnx files compile_llm writes beside the manifest.")
            session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
            names = [output.name for output in session.get_outputs()]
            runners[kind] = lambda feed, session=session, names=names: dict(zip(names, session.run(None, feed)))
        return runners

    def _run(self, kind: str, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self._runners[kind](feed)

    # -- generation ----------------------------------------------------------------------------------

    def prompt_logits(self, prompt_ids: Sequence[int]) -> np.ndarray:
        """Reset, run the whole prompt (prefill, then decode steps past N); the last token's logits."""
        ids = [int(t) for t in prompt_ids]
        if not ids:
            raise ArgumentError("The prompt is empty.", hint="Give at least one token.")
        room = self.shape.max_len - self.start
        if len(ids) >= room:
            raise ArgumentError(f"The prompt has {len(ids)} tokens; the KV cache holds {room} after the prefix.")
        self.reset()
        head = ids[: self.shape.prefill_len]
        logits = self.prefill(head)[-1]
        for index in range(len(head), len(ids)):
            logits = self.decode(ids[index], self.start + index)
        return logits

    def stream(self, prompt_ids: Sequence[int], max_new_tokens: int, *, stop_at_eos: bool = True,
               timings: Generation | None = None) -> Iterator[int]:
        """Greedy generation, yielding each new token as soon as it is chosen."""
        timings = timings if timings is not None else Generation()
        start = time.perf_counter()
        logits = self.prompt_logits(prompt_ids)
        timings.prefill_seconds = time.perf_counter() - start
        position = self.start + len(prompt_ids)
        for step in range(max_new_tokens):
            token = int(np.argmax(logits))
            timings.tokens.append(token)
            yield token
            if (stop_at_eos and token == self.eos_token_id) or step == max_new_tokens - 1:
                return
            if position >= self.shape.max_len:
                logger.info("The KV cache is full (%d positions): generation stops.", self.shape.max_len)
                return
            start = time.perf_counter()
            logits = self.decode(token, position)
            timings.decode_seconds.append(time.perf_counter() - start)
            position += 1

    def generate(self, prompt_ids: Sequence[int], max_new_tokens: int, *, stop_at_eos: bool = True,
                 on_token: Callable[[int], None] | None = None) -> Generation:
        """Greedy generation of up to ``max_new_tokens``; ``on_token`` is called with each new token."""
        result = Generation()
        for token in self.stream(prompt_ids, max_new_tokens, stop_at_eos=stop_at_eos, timings=result):
            if on_token is not None:
                on_token(token)
        return result


def first_divergence(tokens: Sequence[int], reference: Sequence[int]) -> int:
    """Index of the first token that differs from ``reference`` (the shorter length when none does)."""
    return next((i for i, (a, b) in enumerate(zip(tokens, reference)) if a != b), min(len(tokens), len(reference)))
