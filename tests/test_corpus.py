"""The fast subset of the real-model corpus (``tests/corpus.py``): check, compile and accuracy on aries-rb.

For each small model of the subset (``CorpusEntry.fast``), through the public API as ``bench/corpus.py``
measures it: the support check's verdict agrees with the compile (a model ``check`` calls supported,
or offloadable, compiles), no stage ends in ``INTERNAL_ERROR``, and the MXQ's outputs keep a cosine to
FP32 on the held-out real inputs at least the floor below. The floors are what the current compiler
measurably meets (``make corpus`` prints every model; docs/models.md marks those under the 0.99 target).
"""

from __future__ import annotations

import re

import corpus
import numpy as np
import pytest
from corpus import InputSpec
from realmodels import REPO_ROOT

pytestmark = pytest.mark.slow

MIN_COSINE = {
    "mobilenet_v2": 0.99,
    "ppocr_cls": 0.98,
    "blazeface_short": 0.99,  # a16w8 (int16 range headroom): 0.9968
    "mtcnn_pnet": 0.99,
    "oww_embedding": 0.99,  # 0.9933
    "digits_forest": 0.99,  # hummingbird-ml's Equal of leaf-path counts: 0.4975 before they compared on the grid
}
"""Floor of the worst output's mean cosine over the held-out samples, per fast model."""

FAST = [entry.name for entry in corpus.corpus() if entry.fast]


def test_fast_subset_has_a_floor_for_every_model():
    assert sorted(FAST) == sorted(MIN_COSINE)


def test_corpus_has_at_least_twenty_models_with_source_and_licence():
    entries = corpus.corpus()
    assert len(entries) >= 20
    assert len({entry.name for entry in entries}) == len(entries)
    assert all(entry.licence and entry.task and entry.data for entry in entries)


def test_every_corpus_package_is_pinned_in_requirements_testdata():
    pinned = {line.split("#")[0].strip().lower() for line in (REPO_ROOT / "requirements-testdata.txt").read_text().splitlines()}
    packages = {entry.package.lower() for entry in corpus.corpus() if re.fullmatch(r"[\w.-]+==[\w.]+", entry.package)}
    assert packages <= pinned, sorted(packages - pinned)


FEED_CASES = {
    "mobilenet_v2": [InputSpec("input", (1, 3, 224, 224), np.dtype("float32"))],
    "blazeface_short": [InputSpec("input", (1, 128, 128, 3), np.dtype("float32"))],
    "ppocr_rec": [InputSpec("x", (1, 3, 48, 320), np.dtype("float32"))],
    "ppocr_det": [InputSpec("x", (1, 3, 320, 320), np.dtype("float32"))],
    "captcha_crnn": [InputSpec("image", (1, 3, 60, 160), np.dtype("float32"))],
    "crepe_tiny": [InputSpec("frames", (1, 1024), np.dtype("float32"))],
    "basic_pitch": [InputSpec("serving_default_input_2:0", (1, 43844, 1), np.dtype("float32"))],
    "oww_hey_jarvis": [InputSpec("x.1", (1, 16, 96), np.dtype("float32"))],
    "malviz_resnet18": [InputSpec("input", (1, 3, 224, 224), np.dtype("float32"))],
    "voicefilter_embedder": [InputSpec("mel_window", (1, 80, 40), np.dtype("float32"))],
    "tashkeel_rawi": [InputSpec("input", (1, 64), np.dtype("int64"))],
    "digits_mlp": [InputSpec("X", (1, 64), np.dtype("float32"))],
    "fashion_keras": [InputSpec("image", (1, 28, 28, 1), np.dtype("float32"))],
    "khmer_segmenter": [InputSpec("x", (1, 24), np.dtype("int64")), InputSpec("mask", (1, 24), np.dtype("bool"))],
    "slovorez_morphemes": [InputSpec("input_layer", (1, 20), np.dtype("int32"))],
    "capspot_siamese": [InputSpec("input_1", (1, 60, 60, 3), np.dtype("float32")),
                        InputSpec("input_2", (1, 60, 60, 3), np.dtype("float32"))],
    "price_gru": [InputSpec("days", (1, 32, 5), np.dtype("float32"))],
}


@pytest.mark.parametrize("name", FEED_CASES)
def test_calibration_and_evaluation_inputs_are_real_and_disjoint(name):
    entry, specs = corpus.corpus_by_name()[name], FEED_CASES[name]
    try:
        calib = [entry.feed(specs, "calib", index)[specs[0].name] for index in range(corpus.N_CALIB)]
        held_out = [entry.feed(specs, "eval", index)[specs[0].name] for index in range(corpus.N_EVAL)]
    except corpus.RealModelUnavailable as error:
        pytest.skip(str(error))
    for array in calib + held_out:
        assert array.shape == specs[0].shape and np.isfinite(array).all() and array.std() > 0
    distinct = {array.tobytes() for array in calib}
    assert len(distinct) == len(calib), "calibration samples repeat"
    assert not distinct & {array.tobytes() for array in held_out}, "a held-out sample is also a calibration sample"


@pytest.fixture(scope="module", params=FAST)
def measured(request, tmp_path_factory) -> dict:
    row = corpus.measure(request.param, tmp_path_factory.mktemp(request.param))
    if "unavailable" in row:
        pytest.skip(f"{request.param}: {row['unavailable']}")
    return row


def test_no_internal_error(measured):
    error = measured.get("error", {})
    assert error.get("code") != "INTERNAL_ERROR", f"{measured['name']} at {error.get('stage')}: {error.get('message')}"


def test_check_verdict_agrees_with_compile(measured):
    assert "check" in measured, f"stopped before the check: {measured.get('error')}"
    verdict = measured["check"]["verdict"]
    compiled = measured.get("compile", {}).get("code") == "OK"
    if verdict in ("supported", "cpu_offload"):
        assert compiled, f"check said {verdict}, compile failed: {measured.get('error')}"
    else:
        assert not compiled, "check said unsupported, yet the compile succeeded"


def test_cosine_to_fp32_on_held_out_real_inputs(measured):
    cosine = measured.get("cosine")
    assert cosine, f"no accuracy measured: {measured.get('error')}"
    worst = min(value["mean"] for value in cosine.values())
    print(f"\n{measured['name']}: cosine per output {cosine}; compile {measured['compile_seconds']} s")
    assert worst >= MIN_COSINE[measured["name"]]
