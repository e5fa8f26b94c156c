"""Analysis metrics: fused sums equal the plain float64 formulas; near-zero FP32 outputs are not averaged into the cosine."""

from __future__ import annotations

import numpy as np
import pytest

from compiler_core.analysis.compare import _near_zero_warnings
from compiler_core.analysis.metrics import BLOCK, TensorComparison, fused_sums, sqnr_db


def _naive(reference: np.ndarray, quantized: np.ndarray):
    ref, test = reference.astype(np.float64).ravel(), quantized.astype(np.float64).ravel()
    error = ref - test
    return ref @ ref, error @ error, ref @ test, test @ test, np.abs(error).max()


@pytest.mark.parametrize("size", [1, 1000, BLOCK, 3 * BLOCK + 17])
def test_fused_sums_match_the_float64_formulas(size):
    rng = np.random.default_rng(size)
    reference = rng.standard_normal(size).astype(np.float32)
    codes = np.clip(np.round(reference / 0.02) + 3, -128, 127).astype(np.float32)
    quantized = (codes.astype(np.float64) - 3) * 0.02
    got = fused_sums(reference, codes, 3.0, 0.02)
    np.testing.assert_allclose(got, _naive(reference, quantized), rtol=1e-12, atol=1e-300)


def test_codes_and_dequantized_values_give_the_same_metrics():
    rng = np.random.default_rng(1)
    by_codes, by_values = TensorComparison(), TensorComparison()
    for _ in range(3):
        reference = rng.standard_normal((1, 8, 40, 40)).astype(np.float32)
        codes = np.clip(np.round(reference / 0.05), -128, 127).astype(np.float32)
        by_codes.add_codes(reference, codes, 0.05, 0.0)
        by_values.add(reference, codes.astype(np.float64) * 0.05)
    first, second = by_codes.to_dict(), by_values.to_dict()
    for key in ("sqnr_db", "cosine_mean", "cosine_min", "max_abs_error"):
        assert first[key] == pytest.approx(second[key], rel=1e-12)
    reference_energy = sum(e for e in by_codes.energies)
    assert by_codes.signal == pytest.approx(reference_energy * 8 * 40 * 40, rel=1e-12)
    assert first["sqnr_db"] == pytest.approx(sqnr_db(by_values.signal, by_values.noise))


def test_a_near_zero_output_sample_is_left_out_of_the_cosine_and_named():
    rng = np.random.default_rng(2)
    comparison = TensorComparison()
    loud = rng.standard_normal(500).astype(np.float32)
    comparison.add_codes(loud, np.round(loud / 0.01).astype(np.float32), 0.01, 0.0)
    quiet = (rng.standard_normal(500) * 1e-4).astype(np.float32)  # below one quantization step
    comparison.add_codes(quiet, np.round(quiet / 0.01 + rng.integers(0, 2, 500)).astype(np.float32), 0.01, 0.0)
    assert comparison.cosines[1] < 0.5  # the artefact: rounding noise of a near-zero output
    row = comparison.to_dict()
    assert row["near_zero_samples"] == [1]
    assert row["cosine_mean"] == pytest.approx(comparison.cosines[0]) and row["cosine_min"] == row["cosine_mean"]
    assert row["samples"] == 2
    # SQNR still sums both samples' signal and noise
    assert row["sqnr_db"] == pytest.approx(sqnr_db(comparison.signal, comparison.noise))


def test_every_sample_near_zero_gives_no_cosine():
    comparison = TensorComparison()
    comparison.add(np.zeros(10, np.float32), np.zeros(10))
    comparison.add(np.zeros(10, np.float32), np.full(10, 1e-3))
    row = comparison.to_dict()
    assert row["cosine_mean"] is None and row["near_zero_samples"] == [0, 1]


def test_a_one_value_output_has_no_cosine_but_its_sqnr_counts():
    """A face mesh's face-flag logit ([1, 1, 1, 1]): its per-sample "cosine" was 1.0 whatever the error (the sign of
    one number) and lifted the compile's mean output cosine."""
    from compiler_core.analysis.compare import _summary
    from compiler_core.cli import _metric_lines

    comparison = TensorComparison()
    for reference, quantized in ((1.5, 0.6), (-3.0, -2.9), (0.8, 1.7)):
        comparison.add(np.full((1, 1, 1, 1), reference, np.float32), np.full((1, 1, 1, 1), quantized))
    row = comparison.to_dict()
    assert row["cosine_mean"] is None and row["single_value"] and row["samples"] == 3
    assert row["sqnr_db"] == pytest.approx(sqnr_db(1.5 ** 2 + 9 + 0.64, 0.81 + 0.01 + 0.81))
    mesh = {"sqnr_db": 36.0, "cosine_mean": 0.9999, "verdict": "ok"}
    assert _summary({"mesh": mesh, "flag": row}, [])["mean_output_cosine"] == pytest.approx(0.9999)
    assert "cosine n/a (one value per sample)" in _metric_lines({"flag": row})[0]


def test_a_loud_and_a_60db_quieter_sample_without_a_known_step():
    comparison = TensorComparison()
    comparison.add(np.ones(100, np.float32), np.ones(100))
    comparison.add(np.full(100, 1e-4, np.float32), np.full(100, -1e-4))
    row = comparison.to_dict()
    assert row["near_zero_samples"] == [1] and row["cosine_mean"] == pytest.approx(1.0)
    warnings = _near_zero_warnings({"mask": row}, ["photos/a.jpg", "photos/empty_street.jpg"])
    assert len(warnings) == 1 and "photos/empty_street.jpg" in warnings[0] and "'mask'" in warnings[0]
    # analyze() logs them (once per compile: tests/test_sensitivity_amp.py)


def test_a_normal_set_of_samples_has_no_near_zero_entry():
    rng = np.random.default_rng(3)
    comparison = TensorComparison()
    for _ in range(4):
        values = rng.standard_normal(64).astype(np.float32)
        comparison.add_codes(values, np.round(values / 0.02).astype(np.float32), 0.02, 0.0)
    assert "near_zero_samples" not in comparison.to_dict()


def test_the_cli_summary_says_when_an_output_has_no_cosine_or_left_samples_out():
    from compiler_core.analysis.compare import _summary
    from compiler_core.cli import _metric_lines

    outputs = {"mask": {"sqnr_db": 31.0, "cosine_mean": None, "verdict": "ok", "near_zero_samples": [0, 1]},
               "boxes": {"sqnr_db": 40.0, "cosine_mean": 0.999, "verdict": "ok", "near_zero_samples": [1]}}
    lines = _metric_lines(outputs)
    assert "cosine n/a (FP32 output near zero on every held-out sample)" in lines[0]
    assert "cosine 0.9990, 1 near-zero sample(s) left out of the cosine" in lines[1]
    assert _summary(outputs, [])["mean_output_cosine"] == pytest.approx(0.999)


def test_the_cli_summary_gives_a_regression_its_largest_error_in_its_own_units():
    """A hand re-crop's box read cosine 0.999 with a 12-pixel error: the summary now says the error beside the peak."""
    from compiler_core.cli import _metric_lines

    outputs = {"box": {"sqnr_db": 30.2, "cosine_mean": 0.999, "verdict": "ok", "max_abs_error": 12.4,
                       "reference_peak": 255.0},
               "logits": {"sqnr_db": 25.0, "cosine_mean": 0.998, "verdict": "ok", "max_abs_error": 0.3,
                          "reference_peak": 9.0, "top1_agreement": 1.0, "top5_agreement": 1.0}}
    box, logits = _metric_lines(outputs)
    assert "cosine 0.9990, largest error 12.4 (FP32 peak 255) [ok]" in box
    assert "largest error" not in logits and "top-1 100.0%" in logits


def test_token_outputs_are_compared_at_the_tokens_not_at_padding():
    """DeBERTa-v2 writes arbitrary values at padding (layer norms of near-zero rows): cosine 0.50 over all 64
    positions, 0.999 over the 17-20 tokens. [1, S, ...] outputs are compared where attention_mask is 1."""
    from compiler_core.analysis.metrics import at_tokens, token_positions

    mask = np.array([[1, 1, 1, 0, 0]], np.int64)
    keep = token_positions({"input_ids": np.array([[5, 9, 2, 0, 0]]), "attention_mask": mask})
    assert keep.tolist() == [True, True, True, False, False]
    hidden = np.arange(20, dtype=np.float32).reshape(1, 5, 4)
    assert at_tokens(hidden, keep).shape == (1, 3, 4)
    assert at_tokens(np.zeros((1, 5)), keep).shape == (1, 5)  # [1, S] may be a pooled vector: left whole
    assert at_tokens(np.zeros((1, 6, 4)), keep).shape == (1, 6, 4)  # another length: not per token
    assert token_positions({"attention_mask": np.ones((1, 5), np.int64)}) is None  # no padding
    assert token_positions({"mask": np.array([[0.5, 1.0]])}) is None  # not 0/1 values: not a padding mask
    assert token_positions({"mask_scale": np.array([[0, 1]])}) is None  # not named as a mask
    assert token_positions({"mask": np.array([[True, False]])}).tolist() == [True, False]  # khmersm's bool mask
    assert token_positions({"input_mask": np.array([[1, 0]])}).tolist() == [True, False]  # TF BERT's name


def test_the_cli_summary_says_padding_was_left_out():
    from compiler_core.cli import _metric_lines

    line = _metric_lines({"last_hidden_state": {"sqnr_db": 27.5, "cosine_mean": 0.9991, "verdict": "ok",
                                                "padding_positions": 180}})[0]
    assert "compared at the tokens (180 padding positions left out)" in line


def test_mixed_precision_progress_shows_its_metric_for_people():
    """Found under Xvfb: the run panel showed "21 unit(s): cosine 0.7264826095456009, ..." cut off by the panel."""
    from compiler_core.quantization.mixed_precision import format_metric

    assert format_metric("cosine", 0.7264826095456009) == "cosine 0.7265"
    assert format_metric("sqnrDb", 24.349) == "SQNR 24.3 dB"
    assert format_metric("top1", 0.975) == "top-1 97.5 %"
    assert format_metric("cosine", None) == "cosine -"
    # near 1, enough digits to tell a value from 1 (a target of 0.99999 "not met" at "1.0000" reads as a bug)
    assert format_metric("cosine", 0.99996) == "cosine 0.99996" and format_metric("cosine", 1.0) == "cosine 1.0000"
    assert format_metric("cosine", 0.999994) == "cosine 0.99999" and format_metric("cosine", 0.9999996) == "cosine 1.000000"


def test_a_probability_that_never_fires_on_the_held_out_samples_is_named():
    """openWakeWord's score stays near 0.0004 on speech without the wake word: SQNR 0.4 dB [flag] measured noise
    around zero, and the user was sent to mixed precision; now the analysis says so and marks the output."""
    from compiler_core.analysis.compare import _quiet_probability_warnings

    def row(peak: float, verdict: str = "flag") -> dict:
        return {"reference_peak": peak, "verdict": verdict, "max_abs_error": 3.9e-4}

    outputs = {"score": row(4.1e-4), "fired": row(0.93), "logits": row(4.1e-4), "fine": row(1e-3, "ok")}
    heads = {"score": "Sigmoid", "fired": "Sigmoid", "logits": "Gemm", "fine": "Softmax"}
    warnings = _quiet_probability_warnings(outputs, heads)
    assert len(warnings) == 1 and "'score'" in warnings[0] and "never fires" in warnings[0]
    assert [name for name, metrics in outputs.items() if metrics.get("quiet_probability")] == ["score"]
    comparison = TensorComparison(peak=0.0)
    comparison.add(np.array([[-0.002, 0.0004]]), np.array([[0.0, 0.0]]))
    assert comparison.to_dict()["reference_peak"] == 0.002
