"""Decoder LLMs: prefill/decode graphs, compile to MXQs + manifest, generation with a runtime KV cache.

A randomly initialised Llama (4 layers, hidden 256, 8 heads / 2 KV heads, linear RoPE scaling) stands
in for the real model (SmolLM2-135M runs in ``bench/llm.py``, too heavy for the suite).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from compiler_core.errors import ArgumentError  # noqa: E402
from compiler_core.frontends import llm as graphs  # noqa: E402

SHAPE = graphs.LlmShape(prefill_len=16, max_len=48)
PREFIX = [1, 7]
"""The compiled fixture's prefix tokens (a random model has no massive activations to choose them by)."""


def small_llama():
    """A random Llama of a shape unlike SmolLM2's."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=8,
        num_key_value_heads=2, max_position_embeddings=256, rope_scaling={"rope_type": "linear", "factor": 2.0},
        tie_word_embeddings=True)
    return transformers.LlamaForCausalLM(config).eval()


def cosine(a, b) -> float:
    a, b = np.ravel(a).astype(np.float64), np.ravel(b).astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


@pytest.fixture(scope="module")
def model():
    return small_llama()


def word_tokenizer():
    """A word-level tokenizer over the 512 ids: ``w0 .. w510`` and ``[UNK]``."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {f"w{i}": i for i in range(511)} | {"[UNK]": 511}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="[UNK]")


@pytest.fixture(scope="module")
def compiled(model, tmp_path_factory):
    from compiler_core.llm import compile_llm

    folder = tmp_path_factory.mktemp("llm")
    tokens = np.random.default_rng(1).integers(0, 511, 16 * 12)
    manifest = compile_llm(model, folder / "small.llm.json", prefill_len=SHAPE.prefill_len, max_len=SHAPE.max_len,
                           calib_token_ids=tokens, num_samples=12, tokenizer=word_tokenizer(),
                           inference_scheme="all", outlier_prefix=PREFIX)
    return folder / "small.llm.json", manifest


def with_prefix(model, ids) -> np.ndarray:
    """FP32 logits of ``ids`` after the fixture's prefix (the sequence the compiled model computes)."""
    sequence = torch.cat([torch.tensor(PREFIX), torch.as_tensor(ids)])[None]
    with torch.no_grad():
        return model(sequence).logits[0, len(PREFIX):].numpy()


def test_graphs_match_the_transformers_model(model):
    ids = torch.randint(0, 512, (1, 20), generator=torch.Generator().manual_seed(2))
    prefill, decode = graphs.prefill_graph(model, SHAPE), graphs.decode_graph(model, SHAPE)
    layers, kv_heads, head_dim = graphs.kv_geometry(model.config)
    with torch.no_grad():
        reference = model(ids).logits[0]
        out = prefill(ids[:, :16], torch.arange(16)[None])
        torch.testing.assert_close(out[0][0], reference[:16], atol=1e-4, rtol=1e-4)
        cache = [torch.zeros(1, kv_heads, SHAPE.max_len, head_dim) for _ in range(2 * layers)]
        for slot, present in zip(cache, out[1:]):
            slot[:, :, :16] = present
        for position in range(16, 20):
            mask = torch.from_numpy(graphs.decode_mask(position, SHAPE))
            step = decode(ids[:, position:position + 1], torch.tensor([[position]]), mask, *cache)
            torch.testing.assert_close(step[0][0, 0], reference[position], atol=1e-4, rtol=1e-4)
            for slot, present in zip(cache, step[1:]):
                slot[:, :, position] = present[:, :, 0]


def test_last_logits_prefill_gives_the_last_row_and_the_same_cache(model):
    ids = torch.randint(0, 512, (1, 16), generator=torch.Generator().manual_seed(3))
    positions = torch.arange(16)[None]
    last = graphs.LlmShape(SHAPE.prefill_len, SHAPE.max_len, last_logits=True)
    with torch.no_grad():
        full = graphs.prefill_graph(model, SHAPE)(ids, positions)
        short = graphs.prefill_graph(model, last)(ids, positions)
    assert tuple(short[0].shape) == (1, 1, 512)
    torch.testing.assert_close(short[0][0, 0], full[0][0, -1])
    for a, b in zip(short[1:], full[1:]):
        torch.testing.assert_close(a, b)


def test_shapes_are_checked():
    with pytest.raises(ArgumentError, match="prefill_len"):
        graphs.LlmShape(prefill_len=32, max_len=16)
    with pytest.raises(ArgumentError, match="prefix_len"):
        graphs.LlmShape(prefill_len=16, max_len=17, prefix_len=2)


def test_prefix_graphs_continue_the_model_after_the_prefix(model, tmp_path):
    prefix = graphs.prefix_cache(model, PREFIX, SHAPE.max_len)
    shape = graphs.LlmShape(SHAPE.prefill_len, SHAPE.max_len, prefix_len=len(PREFIX))
    ids = torch.randint(0, 512, (1, 18), generator=torch.Generator().manual_seed(7))
    reference = torch.from_numpy(with_prefix(model, ids[0]))
    start = len(PREFIX)
    with torch.no_grad():
        out = graphs.prefill_graph(model, shape, prefix)(ids[:, :16], torch.arange(start, start + 16)[None])
        torch.testing.assert_close(out[0][0], reference[:16], atol=1e-4, rtol=1e-4)
        cache = [torch.zeros(1, 2, SHAPE.max_len, 32) for _ in out[1:]]
        for slot, fixed, present in zip(cache, prefix.cache, out[1:]):
            slot[:, :, :start], slot[:, :, start:start + 16] = torch.from_numpy(fixed), present
        position = start + 16
        mask = torch.from_numpy(graphs.decode_mask(position, shape))
        step = graphs.decode_graph(model, shape)(ids[:, 16:17], torch.tensor([[position]]), mask, *cache)
        torch.testing.assert_close(step[0][0, 0], reference[16], atol=1e-4, rtol=1e-4)
    prefix.save(tmp_path / "p.npz")
    loaded = graphs.LlmPrefix.load(tmp_path / "p.npz")
    assert loaded.token_ids == tuple(PREFIX) and len(loaded.cache) == 2 * 4
    np.testing.assert_array_equal(loaded.cache[-1], prefix.cache[-1])
    with pytest.raises(ArgumentError, match="prefix"):
        graphs.prefill_graph(model, SHAPE, prefix)


class SinkModel:
    """A stand-in LM whose residual stream has massive activations where Llama-family models have them.

    The first token of a sequence (the attention sink) reaches 1000 in every layer, and the first
    occurrence of token 9 (a delimiter) 500; every other token 1.
    """

    def __call__(self, ids, output_hidden_states=True):
        tokens = ids[0].tolist()
        peaks = [1000.0 if i == 0 else 500.0 if t == 9 and 9 not in tokens[:i] else 1.0 for i, t in enumerate(tokens)]
        state = torch.tensor(peaks)[None, :, None].repeat(1, 1, 4)
        return type("Out", (), {"hidden_states": (state,) * 5})()


def test_prefix_selection_takes_the_sink_and_the_outlier_delimiter():
    from compiler_core.quantization.llm_prefix import select_prefix

    windows = [[4, 5, 9, 6, 9, 8], [7, 9, 5, 5, 9, 4]]
    chosen = select_prefix(SinkModel(), windows, [2, 3])
    assert chosen["token_ids"] == [2, 9]  # the first candidate (a tie), then the delimiter
    assert chosen["largest_without"] == 1000 and chosen["largest_with"] == 1
    assert chosen["candidates"] == {2: 500, 3: 500}
    # one token only takes 1000 down to 500: not the 4x a prefix must gain
    assert select_prefix(SinkModel(), windows, [2], max_tokens=1)["token_ids"] == []


def test_prefix_selection_skips_a_model_without_massive_activations(model):
    from compiler_core.quantization.llm_prefix import candidate_tokens, select_prefix

    candidates = candidate_tokens(model.config, word_tokenizer())
    assert candidates == [1, 2, 511]  # BOS, EOS, then the tokenizer's [UNK]
    windows = np.random.default_rng(8).integers(0, 511, (3, 16)).tolist()
    assert select_prefix(model, windows, candidates)["token_ids"] == []


def test_not_a_llama_is_refused():
    with pytest.raises(ArgumentError, match="not a Llama-family"):
        graphs.load_causal_lm(torch.nn.Linear(2, 2))


def _tiny(config_class, **extra):
    torch.manual_seed(0)
    config = config_class(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, **extra)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():  # biases and norm weights away from their 0 / 1 initial values, as in a trained model
        for name, parameter in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                parameter.add_(torch.randn_like(parameter) * 0.3)
    return model


@pytest.mark.parametrize("family", ["Qwen2", "Mistral"])
def test_llama_like_families_are_rebuilt_exactly(family):
    model, _ = graphs.load_causal_lm(_tiny(getattr(transformers, f"{family}Config")))
    ids = torch.randint(0, 256, (1, 12), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        got = graphs.prefill_graph(model, graphs.LlmShape(12, 24))(ids, torch.arange(12)[None])[0]
        np.testing.assert_allclose(got.numpy(), model(ids).logits.numpy(), atol=1e-4)


@pytest.mark.parametrize("family, extra, what", [
    ("Gemma", {"head_dim": 16}, "differ by"),  # scaled embeddings, 1 + w norms, GELU MLP: the names match Llama's
    ("Qwen3", {"head_dim": 16}, "differ by"),  # per-head q/k norms
    ("Phi3", {"pad_token_id": 0}, "cannot rebuild"),  # one fused qkv projection
])
def test_a_causal_lm_the_graphs_would_get_wrong_is_refused(family, extra, what):
    """Before, Gemma and Qwen3 passed the module-name check and compiled to MXQs unrelated to the model."""
    if not hasattr(transformers, f"{family}Config"):
        pytest.skip(f"transformers has no {family}")
    with pytest.raises(ArgumentError, match=what) as refused:
        graphs.load_causal_lm(_tiny(getattr(transformers, f"{family}Config"), **extra))
    assert family.lower() in str(refused.value).lower() and "Mistral, Qwen2" in refused.value.hint


def test_rms_norm_is_one_layer_normalization(compiled):
    import onnx

    graph = onnx.load(compiled[0].parent / "small.prefill.onnx", load_external_data=False).graph
    ops = [node.op_type for node in graph.node]
    assert ops.count("LayerNormalization") == 2 * 4 + 1  # two per layer and the final norm
    assert "Pow" not in ops and "ReduceMean" not in ops


def test_compiled_logits_match_fp32(model, compiled):
    from compiler_core.runtime.llm import LlmModel

    path, manifest = compiled
    assert manifest["layers"] == 4 and manifest["kv_heads"] == 2 and manifest["head_dim"] == 32
    assert manifest["results"]["prefill"].support["unsupported"] == 0
    assert manifest["results"]["decode"].support["unsupported"] == 0
    lm = LlmModel(path)
    assert manifest["prefix"]["token_ids"] == PREFIX and lm.start == len(PREFIX)
    ids = np.random.default_rng(3).integers(0, 512, 24)
    reference = with_prefix(model, ids)
    lm.reset()
    prefill = lm.prefill(ids[:16])
    assert min(cosine(prefill[i], reference[i]) for i in range(16)) >= 0.99
    last = lm.prompt_logits(ids)  # 16 tokens of prefill, then 8 decode steps
    assert cosine(last, reference[-1]) >= 0.99


def test_generate_streams_and_keeps_the_cache(compiled):
    from compiler_core.runtime.llm import LlmModel

    lm = LlmModel(compiled[0])
    prompt = [5, 17, 99, 3, 250]
    seen = []
    result = lm.generate(prompt, 6, stop_at_eos=False, on_token=seen.append)
    assert seen == result.tokens and len(seen) == 6
    assert len(result.decode_seconds) == 5
    assert list(lm.stream(prompt, 6, stop_at_eos=False)) == result.tokens  # deterministic, cache reset
    # the cache holds the prefix, the prompt and the generated tokens fed back (all but the last one)
    filled = np.abs(lm.cache[0][0, 0]).sum(axis=-1) > 0
    end = len(PREFIX) + len(prompt) + 5
    assert filled[:end].all() and not filled[end:].any()
    np.testing.assert_array_equal(lm.cache[0][:, :, :len(PREFIX)], lm.prefix.cache[0])


def test_prompt_longer_than_the_cache_is_refused(compiled):
    from compiler_core.runtime.llm import LlmModel

    lm = LlmModel(compiled[0])
    with pytest.raises(ArgumentError, match="KV cache"):
        lm.prompt_logits(list(range(SHAPE.max_len)))
    with pytest.raises(ArgumentError, match="empty"):
        lm.prompt_logits([])


def test_last_logits_model_refuses_a_short_prompt(compiled):
    from compiler_core.runtime.llm import LlmModel

    data = json.loads(compiled[0].read_text())
    data["last_logits"] = True
    path = compiled[0].parent / "last.llm.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ArgumentError, match="at least 16 tokens"):
        LlmModel(path).prompt_logits([1, 2, 3])


def test_manifest_is_checked(tmp_path, compiled):
    from compiler_core.llm import read_manifest

    other = tmp_path / "x.llm.json"
    other.write_text(json.dumps({"format": "something"}))
    with pytest.raises(ArgumentError, match="not a qb-llm manifest"):
        read_manifest(other)
    data = json.loads(compiled[0].read_text())
    data["decode"] = "missing.mxq"
    moved = compiled[0].parent / "broken.llm.json"
    moved.write_text(json.dumps(data))
    with pytest.raises(ArgumentError, match="missing"):
        read_manifest(moved)


def test_masked_softmax_treats_the_saturated_mask_code_as_minus_infinity():
    from compiler_core.quantization.kernels.softmax import run_softmax
    from compiler_core.quantization.program import IntOp

    scale = 0.01
    table = np.round((1 << 20) * np.exp(-np.arange(20000) * scale)).astype(np.int32)
    table = table[: int(np.nonzero(table)[0].max()) + 1]
    x = np.array([[30, -20, -40, -40], [5, -40, -40, -40]], np.int64)  # -40: the smallest code, masked
    op = IntOp("sm", "softmax", "Softmax", ["x"], ["y"], attrs={"axis": 1, "qmax": 32767, "masked_code": -40},
               consts={"exp_table": table})
    y = run_softmax(op, [x])[0] / 32767
    expected = np.exp(np.array([0.3, -0.2])) / np.exp(np.array([0.3, -0.2])).sum()
    np.testing.assert_allclose(y[0, :2], expected, atol=2e-4)
    assert (y[0, 2:] == 0).all() and y[1, 0] == 1 and (y[1, 1:] == 0).all()
    del op.attrs["masked_code"]  # unmasked, the same codes are just small values with real weight
    assert run_softmax(op, [x])[0][1, 0] < 0.5 * 32767


def test_a_row_with_every_entry_masked_is_uniform_as_in_fp32_in_both_executors():
    """FP32 softmax of a row of equal -3.4e38 entries (a padded query under DeBERTa's query x key mask) is uniform;
    ours gave zeros, and DeBERTa-v2's padded positions went to cosine -0.06."""
    from types import SimpleNamespace

    from compiler_core.quantization.kernels.softmax import run_softmax
    from compiler_core.quantization.program import IntOp
    from compiler_core.runtime.fastpath.normalization import build_softmax

    table = np.round((1 << 20) * np.exp(-np.arange(400) * 0.05)).astype(np.int32)
    x = np.array([[[30, -20, -40, -40], [-40, -40, -40, -40], [5, -40, 7, -40]]], np.int64)
    op = IntOp("sm", "softmax", "Softmax", ["x"], ["y"], attrs={"axis": 2, "qmax": 127, "masked_code": -40},
               consts={"exp_table": table})
    golden = run_softmax(op, [x])[0]
    assert golden[0, 1].tolist() == [32, 32, 32, 32]  # rdiv(127, 4)
    assert golden[0, 0, 2:].tolist() == [0, 0] and golden[0, 2, 1] == 0
    fast = build_softmax(op, SimpleNamespace(shape=lambda name: list(x.shape))).run([x.astype(np.float32)])[0]
    np.testing.assert_array_equal(fast, golden)


def test_cli_run_prompt_streams_the_generation(compiled, capsys):
    from compiler_core.cli import run
    from compiler_core.runtime.llm import LlmModel

    assert run(["run", "--mxq", str(compiled[0]), "--prompt", "w1 w2 w3 w4", "--max-new-tokens", "5"]) == 0
    printed = capsys.readouterr().out
    expected = LlmModel(compiled[0]).generate([1, 2, 3, 4], 5).tokens
    assert printed.split("\n")[0].split() == [f"w{t}" for t in expected]


def test_estimate_gives_ttft_and_tokens_per_second(compiled):
    from compiler_core.llm import manifest_estimate

    path, manifest = compiled
    estimate = manifest_estimate(json.loads(path.read_text()), path.parent, prompt_tokens=20)
    assert set(estimate) == {"single", "multi", "global4", "global8"}
    for mode in estimate.values():  # 20 tokens: one prefill call of 16, then 4 decode steps
        assert mode["ttft_ms"] > 0 and mode["tokens_per_s"] > 0
    assert estimate["global8"]["ttft_ms"] < estimate["single"]["ttft_ms"]
    assert manifest["memory"]["fits"] and manifest["memory"]["kv_cache_bytes"] == 2 * 4 * 2 * 32 * SHAPE.max_len * 2


def test_check_refuses_what_does_not_fit_with_the_numbers(model, tmp_path, capsys):
    from compiler_core.cli import run

    folder = tmp_path / "small"
    model.save_pretrained(folder)
    assert run(["check", "--model", str(folder), "--target-device", "aries-rb", "--max-len", "1024"]) == 0
    assert "fits" in capsys.readouterr().out
    assert run(["check", "--model", str(folder), "--target-device", "regulus-rb", "--max-len", "2048"]) != 0
    assert "exceeds regulus-rb's limit of 1024" in capsys.readouterr().err


def test_reference_runs_the_fp32_exports(model, compiled):
    from compiler_core.runtime.llm import LlmModel, first_divergence

    reference = LlmModel(compiled[0], reference=True)
    ids = np.random.default_rng(4).integers(0, 511, 20)
    np.testing.assert_allclose(reference.prompt_logits(ids), with_prefix(model, ids)[-1], atol=1e-4)
    assert first_divergence([1, 2, 3], [1, 2, 4]) == 2 and first_divergence([1, 2], [1, 2, 3]) == 2


def tiny_llama_config(layers: int):
    """A 64-wide Llama with 4 heads / 1 KV head, vocabulary 512 and tied embeddings (the small tests' model)."""
    return transformers.LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                                    num_attention_heads=4, num_key_value_heads=1, tie_word_embeddings=True)


def test_cli_compiles_a_transformers_folder_to_a_manifest(tmp_path, capsys):
    from compiler_core.cli import run

    torch.manual_seed(1)
    config = tiny_llama_config(1)
    folder = tmp_path / "tiny"
    transformers.LlamaForCausalLM(config).save_pretrained(folder)
    word_tokenizer().save_pretrained(folder)
    text = tmp_path / "calib.txt"
    text.write_text(" ".join(f"w{i}" for i in np.random.default_rng(5).integers(0, 511, 80)))
    output = tmp_path / "out" / "tiny.llm.json"
    assert run(["compile", "--model", str(folder), "--output", str(output), "--calib-data-path", str(text),
                "--prefill-len", "8", "--max-len", "16", "--calib-samples", "8"]) == 0, capsys.readouterr().err
    manifest = json.loads(output.read_text())
    assert manifest["prefill_len"] == 8 and manifest["max_len"] == 16 and manifest["tokenizer"] == "tiny.tokenizer"
    assert (output.parent / "tiny.prefill.mxq").is_file() and (output.parent / "tiny.decode.mxq").is_file()
    assert run(["compile", "--model", str(folder), "--output", str(output)]) != 0  # no calibration text
    assert "calibration text" in capsys.readouterr().err


def test_fast_simulator_matches_the_golden_kernels(compiled):
    from compiler_core.frontends.llm import decode_mask
    from compiler_core.runtime.artifact import load_artifact

    folder = compiled[0].parent
    for kind in ("prefill", "decode"):
        artifact = load_artifact(folder / f"small.{kind}.mxq")
        rng = np.random.default_rng(6)
        feeds = {}
        for spec in artifact.input_specs:
            if spec.name == "input_ids":
                feeds[spec.name] = rng.integers(0, 511, spec.shape).astype(np.int64)
            elif spec.name == "position_ids":
                feeds[spec.name] = (np.arange(spec.shape[1]) if kind == "prefill" else np.array([9]))[None]
            elif spec.name == "cache_mask":
                feeds[spec.name] = decode_mask(9, SHAPE)
            else:
                feeds[spec.name] = (rng.standard_normal(spec.shape) * 0.5).astype(np.float32)
        fast = artifact.run(feeds, raw=True)
        golden = artifact.run(feeds, raw=True, golden=True)
        for a, b in zip(fast, golden):
            np.testing.assert_array_equal(np.asarray(a, np.int64), np.asarray(b, np.int64))


def _compiled_tiny(manifest_path, *, layers: int, seed: int, **options):
    """A random ``tiny_llama_config(layers)`` Llama and its compile (prefill 8, cache 16, 8 windows, no prefix)."""
    from compiler_core.llm import compile_llm

    torch.manual_seed(seed)
    tiny = transformers.LlamaForCausalLM(tiny_llama_config(layers)).eval()
    tokens = np.random.default_rng(seed + 4).integers(0, 511, 8 * 8)
    return tiny, tokens, compile_llm(tiny, manifest_path, prefill_len=8, max_len=16, calib_token_ids=tokens,
                                     num_samples=8, outlier_prefix=False, **options)


def test_compiled_weights_are_the_gptq_codes(tmp_path):
    import copy

    from compiler_core.quantization.gptq import gptq_model
    from compiler_core.quantization.kernels.linear import _quantize_weight
    from compiler_core.runtime.artifact import load_artifact

    tiny, tokens, manifest = _compiled_tiny(tmp_path / "g.llm.json", layers=1, seed=1, gptq=True, rotate=False)
    rounding = manifest["gptq"]
    assert rounding["off_grid_rows"] == 0 and rounding["layers"] == 7 + 1
    assert rounding["output_error"]["gptq"] < rounding["output_error"]["nearest"]
    assert tiny.lm_head.weight is tiny.model.embed_tokens.weight  # the caller's module is left as it was
    rounded = copy.deepcopy(tiny)
    gptq_model(rounded, [tokens.tolist()])  # fewer tokens than a window: one window of all of them
    expected = [m.weight.detach().numpy() for m in rounded.modules() if isinstance(m, torch.nn.Linear)]
    original = [m.weight.detach().numpy() for m in tiny.modules() if isinstance(m, torch.nn.Linear)]
    program = load_artifact(tmp_path / manifest["prefill"]).program
    linear = [op for op in program.ops if op.kind == "linear"]
    assert len(linear) == len(expected)
    moved = 0
    for op in linear:
        stored = op.consts["weight"].astype(np.float64) * np.asarray(op.attrs["weight_scale"])[:, None]
        matches = [i for i, w in enumerate(expected) if w.shape == stored.shape and np.allclose(w, stored, atol=1e-7)]
        assert matches, f"{op.name}: weights are not a GPTQ-rounded layer"
        nearest = _quantize_weight(original[matches[0]].astype(np.float64), 8)[0]
        moved += int(np.count_nonzero(nearest != op.consts["weight"]))
    assert moved > 0  # GPTQ chose other codes than round-to-nearest


def test_decode_calibration_takes_several_tokens_per_window(compiled):
    from compiler_core.llm import DECODE_SAMPLES_PER_CHUNK

    folder = compiled[0].parent / "small.calib"
    rows = json.loads((folder / "decode.json").read_text())["calib paths"]
    assert len(rows) == 12 * DECODE_SAMPLES_PER_CHUNK
    positions = [int(np.load(folder / row[1])[0, 0]) for row in rows]
    for chunk in range(12):
        window = positions[chunk * DECODE_SAMPLES_PER_CHUNK:(chunk + 1) * DECODE_SAMPLES_PER_CHUNK]
        assert len(set(window)) == len(window) and min(window) > len(PREFIX)
        filled = np.abs(np.load(folder / rows[chunk * DECODE_SAMPLES_PER_CHUNK][3])).sum(axis=(0, 1, 3)) > 0
        assert filled[:window[0]].all() and not filled[window[0]:].any()  # the cache holds what came before


def test_residual_rotation_keeps_the_model_and_flattens_outlier_features():
    import copy

    from compiler_core.quantization.llm_rotation import random_orthogonal, rotate_residual

    q = random_orthogonal(48)
    assert np.allclose(q @ q.T, np.eye(48), atol=1e-12)
    original = small_llama()
    with torch.no_grad():  # an outlier feature in the residual stream, as trained LLMs have
        original.model.embed_tokens.weight[:, 5] *= 200.0
    rotated = copy.deepcopy(original)
    summary = rotate_residual(rotated)
    assert summary == {"method": "random-orthogonal", "seed": 0, "width": 256}
    assert rotated.lm_head.weight is not rotated.model.embed_tokens.weight  # untied, then rotated apart
    assert all(float(layer.input_layernorm.weight.detach().min()) == 1.0 for layer in rotated.model.layers)
    ids = torch.randint(0, 512, (1, 12), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        before, after = original(ids, output_hidden_states=True), rotated(ids, output_hidden_states=True)
    assert torch.allclose(before.logits, after.logits, atol=1e-4)
    peak = lambda hidden: float(hidden.abs().amax() / hidden.pow(2).mean().sqrt())  # noqa: E731
    assert peak(after.hidden_states[1]) < peak(before.hidden_states[1]) / 4  # one scale now fits every feature


def test_rotated_compile_matches_fp32_and_leaves_the_module(tmp_path):
    from compiler_core.runtime.llm import LlmModel

    tiny, _, manifest = _compiled_tiny(tmp_path / "r.llm.json", layers=2, seed=2, rotate=True)
    assert manifest["rotation"] == {"method": "random-orthogonal", "seed": 0, "width": 64}
    assert json.loads((tmp_path / "r.llm.json").read_text())["rotation"]["width"] == 64
    from compiler_core.llm import llama_parameters

    untied = transformers.LlamaConfig(**{**tiny.config.to_dict(), "tie_word_embeddings": False})
    assert manifest["memory"]["weights_bytes"] == 2 * llama_parameters(untied)  # the untied head is counted
    assert tiny.lm_head.weight is tiny.model.embed_tokens.weight  # the caller's module is left as it was
    ids = np.random.default_rng(7).integers(0, 512, 12)
    with torch.no_grad():
        reference = tiny(torch.as_tensor(ids)[None]).logits[0].numpy()
    lm = LlmModel(tmp_path / "r.llm.json")
    prefill = lm.prefill(ids[:8])
    assert min(cosine(prefill[i], reference[i]) for i in range(8)) >= 0.99
    assert cosine(lm.prompt_logits(ids), reference[-1]) >= 0.99  # 8 tokens of prefill, then 4 decode steps


def test_a_causal_lm_is_told_from_its_files_and_parses_to_both_graphs(model, tmp_path):
    """What the workbench shows for a decoder LLM: the prefill and decode graphs compile_llm compiles."""
    from compiler_core.api import load_mblt
    from compiler_core.formats import model_file_patterns
    from compiler_core.frontends import detect_backend
    from compiler_core.llm import parse_llm
    from compiler_core.targets import check_support

    folder = tmp_path / "small"
    model.save_pretrained(folder)
    encoder = tmp_path / "encoder"
    encoder.mkdir()
    (encoder / "config.json").write_text(json.dumps({"architectures": ["BertModel"]}))
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text("{not json")
    assert graphs.is_causal_lm_source(folder) and graphs.is_causal_lm_source(tmp_path / "x.GGUF")
    assert not any(graphs.is_causal_lm_source(path) for path in (encoder, tmp_path / "broken", tmp_path / "m.onnx"))
    assert "*.gguf" in model_file_patterns()
    with pytest.raises(Exception, match="decoder LLM") as error:
        detect_backend(tmp_path / "x.gguf")
    assert "--output x.llm.json" in error.value.hint

    prefill, decode = parse_llm(folder, tmp_path / "m.mblt", tmp_path / "m.decode.mblt", prefill_len=8, max_len=16)
    prefill_model, decode_model = load_mblt(prefill), load_mblt(decode)
    assert [v.name for v in prefill_model.graph.inputs] == ["input_ids", "position_ids"]
    assert [v.name for v in decode_model.graph.inputs][:4] == ["input_ids", "position_ids", "cache_mask", "past_key_0"]
    assert list(prefill_model.graph.inputs[0].shape) == [1, 8]
    assert list(decode_model.graph.inputs[3].shape) == [1, 2, 16, 32]  # 2 KV heads, 16 positions, head dim 256/8
    for parsed in (prefill_model, decode_model):  # what the graph view colours is what compile_llm compiles
        assert check_support(parsed, "aries-rb").compilable


def test_cli_parse_writes_both_graphs_of_a_causal_lm(tmp_path, capsys):
    from compiler_core.api import load_mblt
    from compiler_core.cli import run

    torch.manual_seed(1)
    folder = tmp_path / "tiny"
    transformers.LlamaForCausalLM(tiny_llama_config(1)).save_pretrained(folder)
    output = tmp_path / "tiny.mblt"
    assert run(["parse", "--model", str(folder), "--output", str(output), "--target-device", "regulus-ra"]) == 0, \
        capsys.readouterr().err
    text = capsys.readouterr().out
    decode = tmp_path / "tiny.decode.mblt"
    assert f"prefill: {output}" in text and f"decode: {decode}" in text and "--output NAME.llm.json" in text
    assert [v.name for v in load_mblt(decode).graph.inputs][:3] == ["input_ids", "position_ids", "cache_mask"]
