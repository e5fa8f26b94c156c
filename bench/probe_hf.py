"""Probe: tiny random-weight HuggingFace ``transformers`` families through the user's path (not in ``make test``).

Each family is a seeded tiny config (1-2 layers, hidden 32-64) saved with ``save_pretrained`` into
``build/probe-hf/<name>`` (nothing downloads: ``HF_HUB_OFFLINE=1``). The folder goes to ``mblt_compile`` (parse
and ``check_support`` numbers) and to ``mxq_compile(folder, ...)`` as a user would, calibrated on 16 samples of
the right kind (photos, LibriVox speech, token ids drawn from the config's vocabulary with padded tails); the
MXQ (bit-exact simulator) is compared with the ``transformers`` module itself in FP32 on 3 held-out samples
(cosine and SQNR of its ``logits`` / ``last_hidden_state``, worst sample), and the MBLT (onnxruntime) with the
module too, so a wrong export is told apart from a quantization loss.

Each family runs in its own child process. Usage:
``python bench/probe_hf.py [--families bert,vit] [--cli bert]`` (``--cli`` also runs ``qbcompiler compile``
on those folders). Random weights say nothing about trained accuracy; this probes that parse, check and compile
agree and that the MXQ follows FP32.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT / "tests"))
sys.path.insert(0, str(REPO_ROOT))

import numpy as np  # noqa: E402

FOLDERS = REPO_ROOT / "build" / "probe-hf"
DEVICE = "aries-rb"
N_CALIB, N_HELD_OUT = 16, 3
SEQUENCE = 32
IMAGE = 64
VOCAB = 1000
TEXT = {"input_ids": [1, SEQUENCE], "attention_mask": [1, SEQUENCE]}
_ENC = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
            max_position_embeddings=128)
_VIT = dict(image_size=IMAGE, patch_size=16, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=128)
_DEC = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
            max_position_embeddings=128)


def _pixels(size: int = IMAGE) -> dict:
    return {"pixel_values": [1, 3, size, size]}


_WAVEFORM = {"input_values": [1, 8000]}
"""Half a second of 16 kHz audio."""


def _speech_encoder(**extra) -> dict:
    """The tiny wav2vec2-style config the speech encoders share (feature extractor of seven 32-channel convs)."""
    return dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, conv_dim=(32,) * 7,
                num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4) | extra


def families() -> dict[str, tuple[str, str, dict, dict, str]]:
    """name -> (model class, config class, config kwargs, input shapes, input kind)."""
    return {
        # text encoders and their heads
        "bert": ("BertModel", "BertConfig", _ENC, TEXT, "text"),
        "bert_seqcls": ("BertForSequenceClassification", "BertConfig", {**_ENC, "num_labels": 3}, TEXT, "text"),
        "distilbert": ("DistilBertForSequenceClassification", "DistilBertConfig", dict(
            vocab_size=VOCAB, dim=64, n_layers=2, n_heads=4, hidden_dim=128, max_position_embeddings=128,
            num_labels=3), TEXT, "text"),
        "roberta_tokcls": ("RobertaForTokenClassification", "RobertaConfig", {**_ENC, "num_labels": 5}, TEXT, "text"),
        "albert": ("AlbertModel", "AlbertConfig", {**_ENC, "embedding_size": 32}, TEXT, "text"),
        "electra": ("ElectraForSequenceClassification", "ElectraConfig", {**_ENC, "embedding_size": 32,
                                                                          "num_labels": 3}, TEXT, "text"),
        "deberta_v2": ("DebertaV2Model", "DebertaV2Config", {**_ENC, "relative_attention": True,
                                                              "position_buckets": 16, "max_relative_positions": 32,
                                                              "pos_att_type": ["p2c", "c2p"]}, TEXT, "text"),
        "xlm_roberta": ("XLMRobertaModel", "XLMRobertaConfig", _ENC, TEXT, "text"),
        "mpnet": ("MPNetModel", "MPNetConfig", _ENC, TEXT, "text"),
        "mobilebert": ("MobileBertModel", "MobileBertConfig", {**_ENC, "embedding_size": 32, "intra_bottleneck_size": 32,
                                                               "true_hidden_size": 32, "num_feedforward_networks": 2},
                       TEXT, "text"),
        "squeezebert": ("SqueezeBertModel", "SqueezeBertConfig", {**_ENC, "embedding_size": 64}, TEXT, "text"),
        "convbert": ("ConvBertModel", "ConvBertConfig", {**_ENC, "embedding_size": 64, "conv_kernel_size": 5},
                     TEXT, "text"),
        "roformer": ("RoFormerModel", "RoFormerConfig", {**_ENC, "embedding_size": 64}, TEXT, "text"),
        "modernbert": ("ModernBertModel", "ModernBertConfig", dict(
            vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
            max_position_embeddings=128, global_attn_every_n_layers=2, local_attention=16, pad_token_id=0),
            TEXT, "text"),
        "t5_encoder": ("T5EncoderModel", "T5Config", dict(vocab_size=VOCAB, d_model=64, num_layers=2, num_heads=4,
                                                          d_ff=128, d_kv=16), TEXT, "text"),
        # vision
        "vit": ("ViTForImageClassification", "ViTConfig", {**_VIT, "num_labels": 10}, _pixels(), "image"),
        "deit": ("DeiTForImageClassification", "DeiTConfig", {**_VIT, "num_labels": 10}, _pixels(), "image"),
        "beit": ("BeitForImageClassification", "BeitConfig", {**_VIT, "use_relative_position_bias": True,
                                                              "num_labels": 10}, _pixels(), "image"),
        "dinov2": ("Dinov2Model", "Dinov2Config", {**_VIT, "patch_size": 8, "mlp_ratio": 2}, _pixels(), "image"),
        "clip_vision": ("CLIPVisionModel", "CLIPVisionConfig", {**_VIT, "projection_dim": 32}, _pixels(), "image"),
        "convnext": ("ConvNextForImageClassification", "ConvNextConfig", dict(
            depths=[1, 1, 1, 1], hidden_sizes=[16, 32, 48, 64], num_labels=10), _pixels(), "image"),
        "convnextv2": ("ConvNextV2ForImageClassification", "ConvNextV2Config", dict(
            depths=[1, 1, 1, 1], hidden_sizes=[16, 32, 48, 64], num_labels=10), _pixels(), "image"),
        "resnet": ("ResNetForImageClassification", "ResNetConfig", dict(
            depths=[1, 1, 1, 1], hidden_sizes=[16, 32, 48, 64], embedding_size=16, num_labels=10), _pixels(), "image"),
        "regnet": ("RegNetForImageClassification", "RegNetConfig", dict(
            depths=[1, 1, 1, 1], hidden_sizes=[16, 32, 48, 64], embedding_size=16, groups_width=8, num_labels=10),
            _pixels(), "image"),
        "mobilenet_v2": ("MobileNetV2ForImageClassification", "MobileNetV2Config", dict(
            depth_multiplier=0.35, image_size=IMAGE, num_labels=10), _pixels(), "image"),
        "mobilevit": ("MobileViTForImageClassification", "MobileViTConfig", dict(
            image_size=IMAGE, neck_hidden_sizes=[8, 16, 24, 32, 40, 48, 64], hidden_sizes=[32, 40, 48],
            num_labels=10), _pixels(), "image"),
        "efficientnet": ("EfficientNetForImageClassification", "EfficientNetConfig", dict(
            image_size=IMAGE, width_coefficient=0.25, depth_coefficient=0.25, hidden_dim=320, num_labels=10),
            _pixels(), "image"),
        "segformer": ("SegformerForSemanticSegmentation", "SegformerConfig", dict(
            depths=[1, 1, 1, 1], hidden_sizes=[16, 32, 48, 64], decoder_hidden_size=32, num_labels=5),
            _pixels(), "image"),
        "swinv2": ("Swinv2ForImageClassification", "Swinv2Config", dict(
            image_size=IMAGE, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[2, 4], window_size=4,
            num_labels=10), _pixels(), "image"),
        "yolos": ("YolosForObjectDetection", "YolosConfig", {**_VIT, "image_size": [IMAGE, IMAGE],
                                                              "num_detection_tokens": 10, "num_labels": 5},
                  _pixels(), "image"),
        "swin": ("SwinForImageClassification", "SwinConfig", dict(
            image_size=IMAGE, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[2, 4], window_size=4,
            num_labels=10), _pixels(), "image"),
        "levit": ("LevitForImageClassification", "LevitConfig", dict(
            image_size=IMAGE, hidden_sizes=[32, 48, 64], num_attention_heads=[2, 3, 4], depths=[1, 1, 1],
            key_dim=[8, 8, 8], num_labels=10), _pixels(), "image"),
        "poolformer": ("PoolFormerForImageClassification", "PoolFormerConfig", dict(
            depths=[1, 1, 1, 1], hidden_sizes=[16, 32, 48, 64], num_labels=10), _pixels(), "image"),
        "pvt": ("PvtForImageClassification", "PvtConfig", dict(
            image_size=IMAGE, hidden_sizes=[16, 32, 48, 64], num_attention_heads=[1, 2, 4, 8], depths=[1, 1, 1, 1],
            num_labels=10), _pixels(), "image"),
        "focalnet": ("FocalNetForImageClassification", "FocalNetConfig", dict(
            image_size=IMAGE, embed_dim=16, depths=[1, 1], num_labels=10), _pixels(), "image"),
        "mobilenet_v1": ("MobileNetV1ForImageClassification", "MobileNetV1Config", dict(
            depth_multiplier=0.25, image_size=IMAGE, num_labels=10), _pixels(), "image"),
        "bit": ("BitForImageClassification", "BitConfig", dict(
            embedding_size=32, hidden_sizes=[32, 64, 96, 128], depths=[1, 1, 1, 1], num_groups=8, num_labels=10),
            _pixels(), "image"),
        "dpt": ("DPTForDepthEstimation", "DPTConfig", {**_VIT, "num_hidden_layers": 4, "backbone_out_indices": [0, 1, 2, 3],
                                                        "neck_hidden_sizes": [16, 32, 48, 64], "fusion_hidden_size": 32},
                _pixels(), "image"),
        "glpn": ("GLPNForDepthEstimation", "GLPNConfig", dict(
            depths=[1, 1, 1, 1], hidden_sizes=[16, 32, 48, 64], num_attention_heads=[1, 2, 4, 8], decoder_hidden_size=32),
            _pixels(), "image"),
        "detr": ("DetrForObjectDetection", "DetrConfig", dict(
            use_timm_backbone=False, use_pretrained_backbone=False, backbone=None,
            backbone_config={"model_type": "resnet", "depths": [1, 1, 1, 1], "hidden_sizes": [16, 32, 48, 64],
                             "embedding_size": 16, "out_features": ["stage4"]},
            d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2, decoder_attention_heads=2,
            encoder_ffn_dim=64, decoder_ffn_dim=64, num_queries=10, num_labels=5), _pixels(), "image"),
        # audio
        "wav2vec2": ("Wav2Vec2ForSequenceClassification", "Wav2Vec2Config", _speech_encoder(num_labels=4),
                     _WAVEFORM, "audio"),
        "hubert": ("HubertModel", "HubertConfig", _speech_encoder(), _WAVEFORM, "audio"),
        "wavlm": ("WavLMModel", "WavLMConfig", _speech_encoder(num_buckets=32), _WAVEFORM, "audio"),
        "data2vec_audio": ("Data2VecAudioModel", "Data2VecAudioConfig", _speech_encoder(num_conv_pos_embeddings=5),
                           _WAVEFORM, "audio"),
        "whisper_enc": ("WhisperForAudioClassification", "WhisperConfig", dict(
            vocab_size=VOCAB, num_mel_bins=80, d_model=64, encoder_layers=2, encoder_attention_heads=4,
            decoder_layers=1, decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128,
            max_source_positions=50, num_labels=4), {"input_features": [1, 80, 100]}, "mel"),
        "ast": ("ASTForAudioClassification", "ASTConfig", dict(
            hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, max_length=64,
            num_mel_bins=32, num_labels=4), {"input_values": [1, 64, 32]}, "fbank"),
        # decoders (plain forward, logits)
        "gpt2": ("GPT2LMHeadModel", "GPT2Config", dict(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4,
                                                       n_positions=128), TEXT, "text"),
        "qwen2": ("Qwen2ForCausalLM", "Qwen2Config", {**_DEC, "num_key_value_heads": 2}, TEXT, "text"),
        "mistral": ("MistralForCausalLM", "MistralConfig", {**_DEC, "num_key_value_heads": 2}, TEXT, "text"),
        "phi": ("PhiForCausalLM", "PhiConfig", _DEC, TEXT, "text"),
        "gemma": ("GemmaForCausalLM", "GemmaConfig", {**_DEC, "num_key_value_heads": 1, "head_dim": 16}, TEXT,
                  "text"),
        "opt": ("OPTForCausalLM", "OPTConfig", dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2,
                                                    num_attention_heads=4, ffn_dim=128, max_position_embeddings=128,
                                                    word_embed_proj_dim=64), TEXT, "text"),
        "bloom": ("BloomForCausalLM", "BloomConfig", dict(vocab_size=VOCAB, hidden_size=64, n_layer=2, n_head=4),
                  TEXT, "text"),
        "falcon": ("FalconForCausalLM", "FalconConfig", dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2,
                                                             num_attention_heads=4, new_decoder_architecture=False),
                   TEXT, "text"),
        "gpt_neox": ("GPTNeoXForCausalLM", "GPTNeoXConfig", {**_DEC, "rotary_pct": 0.5}, TEXT, "text"),
        "stablelm": ("StableLmForCausalLM", "StableLmConfig", {**_DEC, "num_key_value_heads": 2}, TEXT, "text"),
        "phi3": ("Phi3ForCausalLM", "Phi3Config", {**_DEC, "num_key_value_heads": 2, "pad_token_id": 0}, TEXT, "text"),
        "qwen2_seqcls": ("Qwen2ForSequenceClassification", "Qwen2Config", {**_DEC, "num_key_value_heads": 2,
                                                                           "num_labels": 3, "pad_token_id": 0},
                         TEXT, "text"),
    }


RESCALED = ("mobilenet_v2", "mobilenet_v1", "mobilevit", "efficientnet", "levit")
"""Convolutional families whose activations vanish with HF's init: He (Kaiming) conv weights, BatchNorm scales 1."""


LEARNED_TOKENS = ("cls_token", "distillation_token", "detection_tokens")
"""Token embeddings HF initialises at N(0, 0.02), next to patch embeddings of the image's scale. Trained models learn
them at the patches' scale; left tiny, the final LayerNorm blows up a row one int8 step holds (ViT logits 0.93,
DeiT 0.56 with them tiny): they get N(0, 1)."""


def build_folder(name: str, root: Path = FOLDERS) -> Path:
    """The saved HF folder of ``name`` (seed 0, eval mode; built once)."""
    folder = root / name
    if not (folder / "config.json").exists():
        import torch
        import transformers

        model_class, config_class, kwargs, _, _ = families()[name]
        torch.manual_seed(0)
        model = getattr(transformers, model_class)(getattr(transformers, config_class)(**kwargs)).eval()
        if name in RESCALED:
            for module in model.modules():  # HF's N(0, 0.02) init makes these outputs vanish (1e-25 ... 0)
                if isinstance(module, torch.nn.Conv2d):
                    torch.nn.init.kaiming_normal_(module.weight, nonlinearity="relu")
                elif isinstance(module, (torch.nn.BatchNorm1d, torch.nn.BatchNorm2d)):
                    torch.nn.init.ones_(module.weight)
        for key, parameter in model.named_parameters():
            if key.rsplit(".", 1)[-1] in LEARNED_TOKENS:
                torch.nn.init.normal_(parameter, std=1.0)
        model.save_pretrained(folder)
    return folder


# -- inputs ---------------------------------------------------------------------------------------


def text_sample(rng: np.random.Generator, vocabulary: int, pad_id: int, length: int = SEQUENCE) -> dict:
    """Token ids of ordinary tokens (above the specials) with a padded tail of random length."""
    used = int(rng.integers(length // 2, length + 1))
    ids = np.full((1, length), pad_id, np.int64)
    ids[0, :used] = rng.integers(5, vocabulary, used)
    mask = np.zeros((1, length), np.int64)
    mask[0, :used] = 1
    return {"input_ids": ids, "attention_mask": mask}


def samples(name: str, config, split: str, count: int) -> list[dict]:
    import corpus

    _, _, _, shapes, kind = families()[name]
    if kind == "text":
        rng = np.random.default_rng(0 if split == "calib" else 1)
        pad = getattr(config, "pad_token_id", None) or 0
        return [text_sample(rng, config.vocab_size, pad) for _ in range(count)]
    if kind == "image":
        spec = corpus.InputSpec("pixel_values", tuple(shapes["pixel_values"]), np.dtype(np.float32))
        return [{"pixel_values": corpus.image_tensor(photo, spec, "imagenet")}
                for photo in corpus.photos(split, max(count, corpus.N_EVAL))[:count]]
    (input_name, shape), = shapes.items()
    pool = corpus.N_CALIB if split == "calib" else corpus.N_EVAL
    if kind == "audio":
        return [{input_name: corpus.speech_chunk(split, index, shape[1], pool).reshape(shape)}
                for index in range(count)]
    mels = shape[1] if kind == "mel" else shape[2]
    frames = shape[2] if kind == "mel" else shape[1]
    out = []
    for index in range(count):
        audio = corpus.speech_chunk(split, index, 160 * frames, pool)
        spectrum = log_mel(audio, mels, frames)
        out.append({input_name: (spectrum if kind == "mel" else spectrum.T).reshape(shape).astype(np.float32)})
    return out


def log_mel(audio: np.ndarray, mels: int, frames: int) -> np.ndarray:
    """Whisper-style log-mel (400-point FFT, hop 160) of ``audio``: ``mels x frames``."""
    import corpus

    window = np.hanning(400).astype(np.float32)
    power = corpus._power_frames(np.pad(audio, (200, 200 + 400)), 400, window, 160)[:frames]  # frames x 201
    spectrum = np.log10(np.maximum(corpus._mel_filters(400, mels, False) @ power.T, 1e-10))  # mels x frames
    spectrum = np.maximum(spectrum, spectrum.max() - 8.0)
    return ((spectrum + 4.0) / 4.0).astype(np.float32)


# -- measuring one family -------------------------------------------------------------------------


def _primary(outputs) -> np.ndarray:
    for key in ("logits", "last_hidden_state"):
        value = outputs.get(key) if hasattr(outputs, "get") else None
        if value is not None:
            return value.detach().numpy()
    return outputs[0].detach().numpy()


def _compare(reference: list[np.ndarray], other: list[np.ndarray], masks: list | None = None) -> dict:
    """Worst-sample cosine and SQNR; with ``masks``, of the real (unpadded) tokens of ``[1, S, ...]`` outputs only."""
    cosines, sqnrs = [], []
    for index, (ref, out) in enumerate(zip(reference, other)):
        ref, out = np.asarray(ref, np.float64), np.asarray(out, np.float64)
        if ref.size != out.size:
            return {"shape_mismatch": [ref.size, out.size]}
        out = out.reshape(ref.shape)
        if masks is not None and ref.ndim >= 2 and ref.shape[1] == masks[index].shape[-1]:
            keep = masks[index].reshape(-1).astype(bool)
            ref, out = ref[:, keep], out[:, keep]
        ref, out = ref.ravel(), out.ravel()
        cosines.append(float(ref @ out / max(np.linalg.norm(ref) * np.linalg.norm(out), 1e-30)))
        sqnrs.append(float(10 * np.log10(max(ref @ ref, 1e-30) / max((ref - out) @ (ref - out), 1e-30))))
    return {"cosine_min": min(cosines), "cosine_mean": float(np.mean(cosines)), "sqnr_min": min(sqnrs)}


def _error(error: BaseException) -> dict:
    import traceback

    from compiler_core.errors import QBCompilerError

    if isinstance(error, QBCompilerError):
        return {"code": error.code, "message": str(error.message).strip().splitlines()[0][:300],
                "hint": str(getattr(error, "hint", "") or "")[:200]}
    return {"code": "INTERNAL_ERROR", "message": f"{type(error).__name__}: {error}"[:300],
            "traceback": traceback.format_exc(limit=-6)[-2500:]}


def measure_family(name: str, scratch: Path, *, cli: bool = False, preset: str | None = None) -> dict:
    """Every stage of one family; never raises (a failure is the row's ``error`` with its stage)."""
    import corpus
    import torch
    import transformers

    from compiler_core.api import mblt_compile, mxq_compile
    from compiler_core.runtime import Accelerator, Model

    _, _, _, shapes, _ = families()[name]
    row: dict = {"name": name, "stage": "build", "preset": preset or "default"}
    try:
        folder = build_folder(name)
        module = transformers.AutoConfig.from_pretrained(folder)
        calib = samples(name, module, "calib", N_CALIB)
        held_out = samples(name, module, "eval", N_HELD_OUT)
        model_class = getattr(transformers, families()[name][0])
        reference_module = model_class.from_pretrained(folder).eval()
        with torch.no_grad():
            reference = [_primary(reference_module(**{k: torch.from_numpy(v) for k, v in s.items()}))
                         for s in held_out]
        row["stage"] = "parse"
        started = time.perf_counter()
        mblt = mblt_compile(folder, scratch / f"{name}.mblt", input_shape_dict=shapes)
        row["parse_s"] = round(time.perf_counter() - started, 1)
        row["stage"] = "check"
        row["check"] = corpus._verdict(mblt)
        session = corpus.realdata.ort_session(mblt)
        feeds = [{i.name: s[i.name] for i in session.get_inputs()} for s in held_out]
        row["mblt_vs_torch"] = _compare(reference, [session.run(None, f)[0] for f in feeds])
        row["stage"] = "data"
        manifest = corpus.write_manifest(scratch / "calib", [{i.name: s[i.name] for i in session.get_inputs()}
                                                             for s in calib])
        row["stage"] = "compile"
        offload = row["check"]["verdict"] == "cpu_offload"
        started = time.perf_counter()
        result = mxq_compile(folder, target_device=DEVICE, calib_data_path=manifest,
                             save_path=scratch / f"{name}.mxq", input_shape_dict=shapes, cpu_offload=offload,
                             analysis_holdout=0, config_preset=preset)
        row["suited_preset"] = result.suited_preset.get("name")
        row["compile_s"] = round(time.perf_counter() - started, 1)
        row["support"] = dict(result.support)
        row["cpu_offload"] = {key: len(value) for key, value in result.cpu_offload.items()
                              if isinstance(value, (list, tuple))}
        row["stage"] = "run"
        model = Model(result.mxq_path, input_layout="NCHW")
        model.launch(Accelerator(DEVICE))
        quantized = [model.infer(f)[0] for f in feeds]
        row["mxq_vs_torch"] = _compare(reference, quantized)
        masks = [s["attention_mask"] for s in held_out] if "attention_mask" in held_out[0] else None
        if masks is not None and reference[0].ndim == 3:
            row["mxq_vs_torch_tokens"] = _compare(reference, quantized, masks)
        if cli:
            row["stage"] = "cli"
            done = subprocess.run([sys.executable, "-m", "compiler_core", "compile", "--model", str(folder),
                                   *[f"--input-shape={k}={','.join(map(str, v))}" for k, v in shapes.items()],
                                   "--calib-data-path", str(manifest), "--target-device", DEVICE,
                                   "-o", str(scratch / f"{name}_cli.mxq")], capture_output=True, text=True,
                                  cwd=REPO_ROOT, timeout=900)
            row["cli_rc"] = done.returncode
            if done.returncode:
                row["cli_tail"] = (done.stderr or done.stdout)[-300:]
        row["stage"] = "done"
    except Exception as error:  # a failure is a row of the table
        row["error"] = {"stage": row["stage"], **_error(error)}
    return row


def _cell(row: dict) -> str:
    if "error" in row:
        error = row["error"]
        return f"{error['code']} ({error['stage']}): {error['message'][:110]}"
    nan = float("nan")
    mxq, mblt = row.get("mxq_vs_torch", {}), row.get("mblt_vs_torch", {})
    text = (f"ok; MXQ cos min {mxq.get('cosine_min', nan):.4f} mean {mxq.get('cosine_mean', nan):.4f}"
            f" SQNR {mxq.get('sqnr_min', nan):.1f} dB; MBLT cos {mblt.get('cosine_min', nan):.5f}")
    if row.get("suited_preset") and row.get("preset") == "default" and mxq.get("cosine_min", 1.0) < 0.99:
        text += f"; suggests {row['suited_preset']}"
    if "mxq_vs_torch_tokens" in row:
        text += f"; real tokens only: cos min {row['mxq_vs_torch_tokens'].get('cosine_min', nan):.4f}"
    return text


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", help="comma-separated names (default: all)")
    parser.add_argument("--cli", default="", help="comma-separated names also compiled with qbcompiler compile")
    parser.add_argument("--preset", help="compile with this config preset (default: none)")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--json", type=Path, help="write all rows here")
    args = parser.parse_args()
    if args.one:
        with tempfile.TemporaryDirectory(prefix=f"probe-hf-{args.one}-") as scratch:
            row = measure_family(args.one, Path(scratch), cli=args.one in args.cli.split(","), preset=args.preset)
        print("RESULT " + json.dumps(row), flush=True)
        return 0
    names = args.families.split(",") if args.families else list(families())
    rows = []
    import transformers

    print(f"transformers {transformers.__version__}; {N_CALIB} calibration / {N_HELD_OUT} held-out samples; "
          f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs", flush=True)
    print(f"{'family':13s} {'check':11s} {'nodes':>5s} {'flag':>4s} {'npu':>4s} {'cpu':>4s} {'s':>6s}  outcome")
    for name in names:
        started = time.perf_counter()
        try:
            preset = ["--preset", args.preset] if args.preset else []
            done = subprocess.run([sys.executable, __file__, "--one", name, "--cli", args.cli, *preset], capture_output=True,
                                  text=True, timeout=args.timeout, cwd=REPO_ROOT)
            lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
            row = json.loads(lines[-1][7:]) if lines else {"name": name, "error": {
                "code": "CRASH", "stage": "child", "message": (done.stderr or done.stdout)[-300:]}}
        except subprocess.TimeoutExpired:
            row = {"name": name, "error": {"code": "TIMEOUT", "stage": "child",
                                           "message": f"no result in {args.timeout:.0f} s"}}
        row["wall_s"] = round(time.perf_counter() - started, 1)
        rows.append(row)
        check = row.get("check", {})
        counts = check.get("counts", {})
        support = row.get("support", {})
        print(f"{name:13s} {check.get('verdict', '-'):11s} {check.get('nodes', 0):5d} "
              f"{counts.get('unsupported', 0) + counts.get('needs_mfu', 0):4d} {support.get('supported', 0):4d} "
              f"{support.get('cpu_offloaded', 0):4d} {row['wall_s']:6.1f}  {_cell(row)}", flush=True)
        if check.get("flagged"):
            print(f"{'':13s} flagged: {'; '.join(check['flagged'])[:200]}", flush=True)
        if "cli_rc" in row:
            print(f"{'':13s} CLI rc {row['cli_rc']} {row.get('cli_tail', '')[-150:]}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    internal = [r["name"] for r in rows if r.get("error", {}).get("code") in ("INTERNAL_ERROR", "CRASH", "TIMEOUT")]
    low = [r["name"] for r in rows if r.get("mxq_vs_torch", {}).get("cosine_min", 1.0) < 0.99]
    print(f"load average {os.getloadavg()[0]:.2f} at the end", flush=True)
    print(f"\n{len(rows)} families: {sum('error' not in r for r in rows)} compile; internal errors/crashes/timeouts "
          f"{internal}; MXQ cosine < 0.99 {low}")
    return 1 if internal else 0


if __name__ == "__main__":
    sys.exit(main())
