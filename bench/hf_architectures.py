"""HuggingFace architectures the corpus has never seen, through the user's path (random weights).

The real-model corpus (``bench/corpus.py``) holds trained models from pip packages; this bench adds breadth:
37 ``transformers`` architectures (vision, text, audio) built from small configs with random weights, saved
as HF folders and given to ``mblt_compile`` as a user would, then checked, compiled for aries-rb on real
inputs (photos, English sentences, LibriVox speech) and compared with FP32 on held-out inputs — the same
``tests/corpus.py`` measurement as the corpus. Random weights say nothing about a trained model's
accuracy; what this bench tests is that a model the graph calls supported compiles, that nothing is an
``INTERNAL_ERROR``, and that the MXQ follows FP32. Models whose FP32 output is all (near) zeros (HF zero-initialises
some classifier heads) are marked instead of given a cosine.

Each model runs in its own child process. Usage: ``python bench/hf_architectures.py [--models a,b]``
(``make hf-architectures``); about 40-80 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT / "tests"))
sys.path.insert(0, str(REPO_ROOT))

import numpy as np  # noqa: E402

FOLDERS = REPO_ROOT / "build" / "hf-architectures"
SEQUENCE = 64
IMAGE = {"pixel_values": [1, 3, 224, 224]}
TEXT = {"input_ids": [1, SEQUENCE], "attention_mask": [1, SEQUENCE]}


_VIT_SMALL = dict(hidden_size=192, num_hidden_layers=3, num_attention_heads=3, intermediate_size=768)
_TEXT_SMALL = dict(hidden_size=256, num_hidden_layers=3, num_attention_heads=4, intermediate_size=1024)


def _configs() -> dict[str, tuple]:
    """name -> (model class name, config class name, config kwargs, input shapes, feed kind)."""
    return {
        "vit": ("ViTForImageClassification", "ViTConfig", dict(
            hidden_size=192, num_hidden_layers=4, num_attention_heads=3, intermediate_size=768, num_labels=10),
            IMAGE, "image"),
        "convnext": ("ConvNextForImageClassification", "ConvNextConfig", dict(
            depths=[1, 1, 2, 1], hidden_sizes=[32, 64, 128, 256], num_labels=10), IMAGE, "image"),
        "swin": ("SwinForImageClassification", "SwinConfig", dict(
            embed_dim=48, depths=[1, 1, 2, 1], num_heads=[2, 4, 8, 16], num_labels=10), IMAGE, "image"),
        "segformer": ("SegformerForSemanticSegmentation", "SegformerConfig", dict(
            depths=[1, 1, 1, 1], hidden_sizes=[16, 32, 80, 128], decoder_hidden_size=64, num_labels=5),
            {"pixel_values": [1, 3, 256, 256]}, "image"),
        "mobilevit": ("MobileViTForImageClassification", "MobileViTConfig", dict(
            neck_hidden_sizes=[16, 16, 24, 48, 64, 80, 320], hidden_sizes=[64, 80, 96], num_labels=10),
            {"pixel_values": [1, 3, 256, 256]}, "image"),
        "resnet": ("ResNetForImageClassification", "ResNetConfig", dict(
            depths=[1, 1, 1, 1], hidden_sizes=[32, 64, 128, 256], embedding_size=32, num_labels=10), IMAGE, "image"),
        "efficientnet": ("EfficientNetForImageClassification", "EfficientNetConfig", dict(
            width_coefficient=1.0, depth_coefficient=1.0, hidden_dim=1280, image_size=224, num_labels=10),
            IMAGE, "image"),
        "levit": ("LevitForImageClassification", "LevitConfig", dict(num_labels=10), IMAGE, "image"),
        "poolformer": ("PoolFormerForImageClassification", "PoolFormerConfig", dict(
            depths=[1, 1, 2, 1], hidden_sizes=[32, 64, 128, 256], num_labels=10), IMAGE, "image"),
        "beit": ("BeitForImageClassification", "BeitConfig", dict(
            hidden_size=192, num_hidden_layers=3, num_attention_heads=3, intermediate_size=768,
            use_relative_position_bias=True, num_labels=10), IMAGE, "image"),
        "distilbert": ("DistilBertModel", "DistilBertConfig", dict(dim=256, n_layers=3, n_heads=4, hidden_dim=1024),
                       TEXT, "text"),
        "roberta": ("RobertaModel", "RobertaConfig", dict(
            hidden_size=256, num_hidden_layers=3, num_attention_heads=4, intermediate_size=1024), TEXT, "text"),
        "albert": ("AlbertModel", "AlbertConfig", dict(
            hidden_size=256, num_hidden_layers=3, num_attention_heads=4, intermediate_size=1024, embedding_size=128),
            TEXT, "text"),
        "t5_encoder": ("T5EncoderModel", "T5Config", dict(d_model=256, num_layers=3, num_heads=4, d_ff=1024, d_kv=64),
                       TEXT, "text"),
        "wav2vec2": ("Wav2Vec2Model", "Wav2Vec2Config", dict(
            hidden_size=192, num_hidden_layers=2, num_attention_heads=3, intermediate_size=768, conv_dim=(64,) * 7),
            {"input_values": [1, 16000]}, "audio"),
        # session 16: 22 more
        "deit": ("DeiTForImageClassification", "DeiTConfig", dict(_VIT_SMALL, num_labels=10), IMAGE, "image"),
        "dinov2": ("Dinov2Model", "Dinov2Config", dict(_VIT_SMALL, image_size=224, patch_size=14), IMAGE, "image"),
        "clip_vision": ("CLIPVisionModel", "CLIPVisionConfig", dict(_VIT_SMALL, image_size=224, patch_size=32),
                        IMAGE, "image"),
        "siglip_vision": ("SiglipVisionModel", "SiglipVisionConfig", dict(_VIT_SMALL, image_size=224, patch_size=16),
                          IMAGE, "image"),
        "data2vec_vision": ("Data2VecVisionForImageClassification", "Data2VecVisionConfig",
                            dict(_VIT_SMALL, num_labels=10), IMAGE, "image"),
        "yolos": ("YolosForObjectDetection", "YolosConfig", dict(
            _VIT_SMALL, image_size=[224, 224], num_detection_tokens=20, num_labels=10), IMAGE, "image"),
        "dpt": ("DPTForDepthEstimation", "DPTConfig", dict(
            _VIT_SMALL, num_hidden_layers=4, image_size=224, backbone_out_indices=[0, 1, 2, 3],
            neck_hidden_sizes=[24, 48, 96, 192], fusion_hidden_size=64), IMAGE, "image"),
        "glpn": ("GLPNForDepthEstimation", "GLPNConfig", dict(
            depths=[1, 1, 1, 1], hidden_sizes=[32, 64, 160, 256], decoder_hidden_size=32),
            {"pixel_values": [1, 3, 256, 256]}, "image"),
        "mobilenet_v2_hf": ("MobileNetV2ForImageClassification", "MobileNetV2Config", dict(
            depth_multiplier=0.5, num_labels=10), IMAGE, "image"),
        "regnet": ("RegNetForImageClassification", "RegNetConfig", dict(
            depths=[1, 1, 2, 1], hidden_sizes=[32, 64, 128, 256], num_labels=10), IMAGE, "image"),
        "convnextv2": ("ConvNextV2ForImageClassification", "ConvNextV2Config", dict(
            depths=[1, 1, 2, 1], hidden_sizes=[32, 64, 128, 256], num_labels=10), IMAGE, "image"),
        "focalnet": ("FocalNetForImageClassification", "FocalNetConfig", dict(
            embed_dim=32, depths=[1, 1, 2, 1], num_labels=10), IMAGE, "image"),
        "cvt": ("CvtForImageClassification", "CvtConfig", dict(
            embed_dim=[32, 64, 128], num_heads=[1, 2, 4], depth=[1, 2, 3], drop_path_rate=[0.0, 0.0, 0.0],
            num_labels=10), IMAGE, "image"),
        "pvt": ("PvtForImageClassification", "PvtConfig", dict(
            hidden_sizes=[32, 64, 160, 256], depths=[1, 1, 1, 1], num_labels=10), IMAGE, "image"),
        "bert_cls": ("BertForSequenceClassification", "BertConfig", dict(_TEXT_SMALL, num_labels=3), TEXT, "text"),
        "gpt2": ("GPT2Model", "GPT2Config", dict(n_embd=256, n_layer=3, n_head=4), TEXT, "text"),
        "electra_tokens": ("ElectraForTokenClassification", "ElectraConfig", dict(
            _TEXT_SMALL, embedding_size=128, num_labels=9), TEXT, "text"),
        "mpnet": ("MPNetModel", "MPNetConfig", dict(_TEXT_SMALL), TEXT, "text"),
        "deberta_v2": ("DebertaV2Model", "DebertaV2Config", dict(_TEXT_SMALL), TEXT, "text"),
        "squeezebert": ("SqueezeBertModel", "SqueezeBertConfig", dict(_TEXT_SMALL, embedding_size=256), TEXT, "text"),
        "modernbert": ("ModernBertModel", "ModernBertConfig", dict(_TEXT_SMALL, intermediate_size=512), TEXT, "text"),
        "hubert": ("HubertModel", "HubertConfig", dict(
            hidden_size=192, num_hidden_layers=2, num_attention_heads=3, intermediate_size=768, conv_dim=(64,) * 7),
            {"input_values": [1, 16000]}, "audio"),
    }


def _folder(name: str) -> Path:
    """The saved HF folder of ``name`` (built once: seed 0, eval mode)."""
    folder = FOLDERS / name
    if not (folder / "config.json").exists():
        import torch
        import transformers

        model_class, config_class, kwargs, _, _ = _configs()[name]
        torch.manual_seed(0)
        model = getattr(transformers, model_class)(getattr(transformers, config_class)(**kwargs)).eval()
        model.save_pretrained(folder)
    return folder


def _text_feed(vocabulary: int):
    import corpus

    def feed(specs, split, index):
        count = corpus.N_CALIB if split == "calib" else corpus.N_EVAL
        tokens = corpus.realmodels.tokenize([corpus.sentences(split, count)[index]], SEQUENCE)
        arrays = {"input_ids": tokens["input_ids"] % vocabulary, "attention_mask": tokens["attention_mask"]}
        return {spec.name: arrays[spec.name].astype(spec.dtype) for spec in specs}
    return feed


def _audio_feed(specs, split, index):
    import corpus

    spec = specs[0]
    count = corpus.N_CALIB if split == "calib" else corpus.N_EVAL
    chunk = corpus.speech_chunk(split, index, int(np.prod(spec.shape)), count)
    return {spec.name: np.asarray(chunk, np.float32).reshape(spec.shape)}


def _register() -> None:
    """Add the architectures to the corpus registry (``tests/corpus.py``) under ``hf_<name>``."""
    import corpus
    import transformers

    def entry(name, spec):
        _, config_class, kwargs, shapes, kind = spec
        if kind == "image":
            feed = corpus.image_feed(corpus.photos, "imagenet")
        elif kind == "text":
            feed = _text_feed(getattr(transformers, config_class)(**kwargs).vocab_size)
        else:
            feed = _audio_feed
        return corpus.CorpusEntry(f"hf_{name}", f"{spec[0]} (random weights)", f"transformers=={transformers.__version__}",
                                  "-", lambda: _folder(name), feed, kind, input_shape_dict=shapes)

    extra = [entry(name, spec) for name, spec in _configs().items()]
    original = corpus.corpus
    corpus.corpus = lambda: original() + extra


def _fp32_all_zero(mblt: Path, feed: dict) -> bool:
    import onnxruntime as ort

    outputs = ort.InferenceSession(str(mblt), providers=["CPUExecutionProvider"]).run(None, feed)
    return all(float(np.max(np.abs(output))) < 1e-12 for output in outputs)  # MobileViT's are ~1e-42


def measure_one(name: str) -> dict:
    """The corpus measurement of ``hf_<name>``, plus whether its FP32 output is all zeros."""
    import corpus

    _register()
    with tempfile.TemporaryDirectory(prefix=f"hf-{name}-") as folder:
        row = corpus.measure(f"hf_{name}", Path(folder))
        mblt = Path(folder) / f"hf_{name}.mblt"
        if row.get("stage") == "done" and mblt.exists():
            entry = corpus.corpus_by_name()[f"hf_{name}"]
            specs = corpus._mblt_inputs(mblt)
            row["fp32_all_zero"] = _fp32_all_zero(mblt, entry.feed(specs, "eval", 0))
    return row


def _cell(row: dict) -> str:
    if "error" in row:
        return f"{row['error']['code']} ({row['error']['stage']}): {row['error']['message'][:90]}"
    if row.get("fp32_all_zero"):
        return "ok; FP32 output all zeros (no cosine)"
    cosine = row.get("cosine") or {}
    return "ok; cosine " + ", ".join(f"{key} {value['mean']:.4f}" for key, value in cosine.items())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", help="comma-separated names (default: all)")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--timeout", type=float, default=900)
    args = parser.parse_args()
    if args.one:
        print("RESULT " + json.dumps(measure_one(args.one)), flush=True)
        return 0
    names = args.models.split(",") if args.models else list(_configs())
    rows = []
    for name in names:
        started = time.perf_counter()
        try:
            done = subprocess.run([sys.executable, __file__, "--one", name], capture_output=True, text=True,
                                  timeout=args.timeout, cwd=REPO_ROOT)
            lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
            row = json.loads(lines[-1][7:]) if lines else {"error": {
                "code": "CRASH", "stage": "child", "message": (done.stderr or done.stdout)[-300:]}}
        except subprocess.TimeoutExpired:
            row = {"error": {"code": "TIMEOUT", "stage": "child", "message": f"no result in {args.timeout:.0f} s"}}
        row["wall"] = round(time.perf_counter() - started, 1)
        rows.append((name, row))
        verdict = row.get("check", {}).get("verdict", "-")
        print(f"[hf] {name:12s} check {verdict:12s} {_cell(row)}  ({row['wall']} s)", flush=True)
    internal = [name for name, row in rows if row.get("error", {}).get("code") in ("INTERNAL_ERROR", "CRASH")]
    broken = [name for name, row in rows if row.get("check", {}).get("verdict") in ("supported", "cpu_offload")
              and "error" in row]
    print(f"\n{len(rows)} architectures: {sum('error' not in row for _, row in rows)} compile, "
          f"{len(internal)} internal errors or crashes {internal}, {len(broken)} shown supported but refused {broken}")
    return 1 if internal or broken else 0


if __name__ == "__main__":
    sys.exit(main())
