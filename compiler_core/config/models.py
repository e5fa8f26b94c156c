"""Pydantic models of the CompileConfig schema: camelCase keys, unknown keys rejected."""

from __future__ import annotations

import enum
import fnmatch
import logging
import os
import re
from collections.abc import Iterable
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic.alias_generators import to_camel

from compiler_core.config import files
from compiler_core.config.messages import config_error_from_validation

logger = logging.getLogger(__name__)

CONFIG_VERSION = "1.0.0"
"""Schema version written into every config; files with another major version are rejected."""

InferenceScheme = Literal["single", "multi", "global4", "global8", "all"]
Backend = Literal["onnx", "torch", "torchscript", "tf", "tflite"]
PositiveInt = Annotated[int, Field(ge=1)]
WeightBits = Literal[8, 4]


class CalibrationMethod(enum.IntEnum):
    """How weights and activations are grouped for quantization (``calibration.method``)."""

    WChALayer = 0
    WChAMulti = 1
    WChALayerZeropoint = 2
    WChAMultiZeropoint = 3


class CalibrationOutput(enum.IntEnum):
    """How the model's output layers are quantized (``calibration.output``)."""

    Layer = 0
    Ch = 1
    Sigmoid = 2


class CalibrationMode(enum.IntEnum):
    """How an activation range is chosen from the statistics (``calibration.mode``)."""

    Max = 0
    MaxPercentile = 1
    Histogram = 2
    Mse = 3


class ConfigSection(BaseModel):
    """Base of every config model: camelCase aliases, snake_case accepted, unknown keys rejected."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        validate_assignment=True,
        use_enum_values=False,
        protected_namespaces=(),
    )


# ---------------------------------------------------------------- preprocessing


class ResizeOp(ConfigSection):
    """Resize to ``height`` x ``width``, or by ``size`` (square, or short side with ``keepAspect``)."""

    op: Literal["resize"] = Field(description="Operation tag.")
    height: PositiveInt | None = Field(None, description="Output height in pixels (with width).")
    width: PositiveInt | None = Field(None, description="Output width in pixels (with height).")
    size: PositiveInt | None = Field(
        None, description="Square output size, or the short side's length when keepAspect is true.")
    mode: Literal["bilinear", "nearest"] = Field("bilinear", description="Interpolation.")
    keep_aspect: bool = Field(
        False, description="With size: resize the short side to size and keep the aspect ratio.")

    @model_validator(mode="after")
    def _one_size_spelling(self) -> ResizeOp:
        has_box = self.height is not None or self.width is not None
        if has_box == (self.size is not None):
            raise ValueError("give either height and width, or size")
        if has_box and (self.height is None or self.width is None):
            raise ValueError("height and width must be given together")
        if has_box and self.keep_aspect:
            raise ValueError("keepAspect needs size (the short side), not height and width")
        return self


class CenterCropOp(ConfigSection):
    """Crop the central ``height`` x ``width`` window."""

    op: Literal["centerCrop"] = Field(description="Operation tag.")
    height: PositiveInt = Field(description="Crop height in pixels.")
    width: PositiveInt = Field(description="Crop width in pixels.")


class NormalizeOp(ConfigSection):
    """Per-channel ``(x * scale - mean) / std`` on pixel values ``x`` in 0..255."""

    op: Literal["normalize"] = Field(description="Operation tag.")
    mean: list[float] = Field(min_length=1, description="Per-channel mean, after scaling.")
    std: list[Annotated[float, Field(gt=0)]] = Field(min_length=1, description="Per-channel std (> 0).")
    scale: float = Field(1 / 255, gt=0, description="Factor applied to the pixels before mean and std.")
    scale_to_uint8: bool = Field(
        False, description="Vendor spelling: mean/std are on the 0-1 scale and the input is uint8 pixels; "
                           "the same as scale 1/255 (the default), so any other scale is an error.")
    fuse_into_first_layer: bool = Field(
        False, description="Fold the normalization into the first layer, so the MXQ takes raw pixels.")

    @field_validator("mean", "std", mode="before")
    @classmethod
    def _one_value(cls, value: Any) -> Any:
        # ``"mean": 0.5`` is the one-value form the docs offer ("1 value broadcasts"): the same as [0.5].
        return [value] if isinstance(value, (int, float)) and not isinstance(value, bool) else value

    @model_validator(mode="after")
    def _consistent(self) -> NormalizeOp:
        if len(self.mean) != len(self.std):
            raise ValueError(f"mean has {len(self.mean)} values but std has {len(self.std)}")
        if self.scale_to_uint8 and abs(self.scale - 1 / 255) > 1e-12:
            raise ValueError("scaleToUint8 means scale 1/255; remove one of them")
        return self


class LetterboxOp(ConfigSection):
    """Resize keeping the aspect ratio and pad to ``height`` x ``width`` (YOLO style)."""

    op: Literal["letterbox"] = Field(description="Operation tag.")
    height: PositiveInt = Field(description="Output height in pixels.")
    width: PositiveInt = Field(description="Output width in pixels.")
    pad_value: int = Field(114, ge=0, le=255, description="Pixel value of the padding (0-255).")


class ColorConvertOp(ConfigSection):
    """Reorder colour channels to ``order`` (images are read as RGB)."""

    op: Literal["colorConvert"] = Field(description="Operation tag.")
    order: Literal["RGB", "BGR"] = Field("RGB", description="Target channel order.")


class LayoutOp(ConfigSection):
    """Transpose samples to ``order`` (images are read as HWC)."""

    op: Literal["layout"] = Field(description="Operation tag.")
    order: Literal["HWC", "CHW"] = Field(description="Target layout.")


PreprocessOp = Annotated[
    Union[ResizeOp, CenterCropOp, NormalizeOp, LetterboxOp, ColorConvertOp, LayoutOp],  # noqa: UP007
    Field(discriminator="op"),
]


class AudioConfig(ConfigSection):
    """How ``.wav`` recordings become waveform samples (``preprocessing.audio``)."""

    sample_rate: int = Field(
        16000, ge=1, description="Sample rate the model takes, in Hz; .wav files at another rate are refused unless "
                                 "resample is true.")
    resample: bool = Field(
        False, description="Resample .wav files at another rate to sampleRate (band-limited, through the FFT of "
                           "the whole file) instead of refusing them.")
    full_scale: float = Field(
        1.0, gt=0, description="Value of a full-scale sample: 1.0 reads audio in [-1, 1) (soundfile, librosa, "
                               "torchaudio); 32768 reads int16 sample values (openWakeWord).")


class PreprocessingConfig(ConfigSection):
    """Preprocessing of raw calibration images and recordings (``preprocessing``)."""

    apply: bool = Field(False, description="Run the pipeline on raw calibration images.")
    auto_convert_format: bool = Field(
        True, description="Convert samples between HWC/CHW and gray/RGB to match the model input.")
    pipeline: list[PreprocessOp] = Field(
        default_factory=list, description="Ops in order; spatial ops must be repeated at run time.")
    audio: AudioConfig = Field(
        default_factory=AudioConfig, description="Reading .wav recordings into windows of the input's length.")

    @field_validator("pipeline")
    @classmethod
    def _one_fused_normalize(cls, pipeline: list[Any]) -> list[Any]:
        fused = [op for op in pipeline if isinstance(op, NormalizeOp) and op.fuse_into_first_layer]
        if len(fused) > 1:
            raise ValueError("only one normalize op can set fuseIntoFirstLayer")
        return pipeline


# ---------------------------------------------------------------- calibration


class MaxPercentileConfig(ConfigSection):
    """Parameters of the MaxPercentile calibration mode (``calibration.maxPercentile``)."""

    percentile: float = Field(
        0.9999, gt=0, le=1, description="Quantile of |x| kept in range, in (0, 1]; used by mode 1 (MaxPercentile).")
    topk_ratio: float = Field(
        0.01, ge=0, le=1,
        description="Share of the largest values averaged, in [0, 1]; used by mode 1 (MaxPercentile).")


class LayerCalibrationOverride(ConfigSection):
    """Calibration settings for the layers matching one name pattern."""

    mode: CalibrationMode | None = Field(None, description="Mode for these layers (0-3).")
    output: CalibrationOutput | None = Field(None, description="Output quantization for these layers (0-2).")
    max_percentile: MaxPercentileConfig | None = Field(None, description="MaxPercentile parameters.")


class CalibrationConfig(ConfigSection):
    """Activation calibration (``calibration``)."""

    method: CalibrationMethod = Field(
        CalibrationMethod.WChALayer,
        description="How ranges are grouped (weights always per output channel). "
                    "0 WChALayer: one symmetric range per activation tensor; "
                    "1 WChAMulti: as 0, and Concat inputs share their output's range; "
                    "2 WChALayerZeropoint: as 0 with asymmetric activations (a zero point); "
                    "3 WChAMultiZeropoint: as 1 with asymmetric activations.")
    output: CalibrationOutput = Field(
        CalibrationOutput.Layer,
        description="How the model's output layers are quantized. 0 Layer: one range per output tensor; "
                    "1 Ch: per channel (accepted, not implemented yet: quantized per layer); "
                    "2 Sigmoid: sigmoid-aware (accepted, not implemented yet: quantized per layer).")
    mode: CalibrationMode = Field(
        CalibrationMode.Max,
        description="How an activation range is chosen from the statistics. 0 Max: the observed minimum and "
                    "maximum; 1 MaxPercentile: clip at a percentile of |x| (uses maxPercentile); "
                    "2 Histogram: the range whose histogram has the least KL divergence from the data's; "
                    "3 Mse: the range with the least mean squared quantization error.")
    max_percentile: MaxPercentileConfig = Field(
        default_factory=MaxPercentileConfig, description="Parameters of mode 1.")
    num_samples: PositiveInt = Field(128, description="Calibration samples used for statistics.")
    output_headroom: float = Field(
        2.0, ge=1, le=16,
        description="Factor on the calibrated range of the model's outputs (and of the tensors that reach them "
                    "only through data movement or Concat): inputs unlike the calibration set push final logits "
                    "and regressions past the calibrated maximum, and nothing reads an output again, so resolution "
                    "is traded for headroom there. 1 keeps the calibrated range.")
    int16_headroom: float = Field(
        1.0, ge=1, le=16,
        description="Factor on the calibrated range of every int16 activation: 16 bits have resolution to spare, "
                    "so held-out inputs past the calibration set's range (a larger, sharper face) are not "
                    "clipped. 1 keeps the calibrated range.")
    layer_overrides: dict[str, LayerCalibrationOverride] = Field(
        default_factory=dict, description="Glob pattern of layer names -> settings for those layers.")


# ---------------------------------------------------------------- bit widths


class TransformerBitConfig(ConfigSection):
    """Weight bits per transformer projection (``bit.transformer``)."""

    qkv_bits: WeightBits = Field(8, description="Query/key/value projection weights (8 or 4).")
    out_bits: WeightBits = Field(8, description="Attention output projection weights (8 or 4).")
    ffn_bits: WeightBits = Field(8, description="Feed-forward (MLP) weights (8 or 4).")
    lm_head_bits: WeightBits = Field(8, description="Language-model head weights (8 or 4).")


class BitLayerOverrides(ConfigSection):
    """Per-layer precision overrides; entries are glob patterns (see ``layer_matches``)."""

    activation16_bits: list[str] = Field(default_factory=list, description="Layers with int16 outputs.")
    weight16_bits: list[str] = Field(default_factory=list, description="Layers with int16 weights.")
    weight8_bits: list[str] = Field(default_factory=list, description="Layers forced to int8 weights.")
    weight4_bits: list[str] = Field(default_factory=list, description="Layers with int4 weights.")

    @model_validator(mode="after")
    def _disjoint_weight_lists(self) -> BitLayerOverrides:
        lists = {"weight16Bits": self.weight16_bits, "weight8Bits": self.weight8_bits,
                 "weight4Bits": self.weight4_bits}
        seen: dict[str, str] = {}
        for key, patterns in lists.items():
            for pattern in patterns:
                if pattern in seen:
                    raise ValueError(f"'{pattern}' is in both {seen[pattern]} and {key}")
                seen[pattern] = key
        return self


class BitConfig(ConfigSection):
    """Bit widths (``bit``)."""

    transformer: TransformerBitConfig = Field(
        default_factory=TransformerBitConfig, description="Weight bits per transformer projection.")
    layer_overrides: BitLayerOverrides = Field(
        default_factory=BitLayerOverrides, description="Per-layer precision overrides.")
    output_bits: Literal[8, 16] = Field(
        8, description="Activation width of the model's outputs (and of the tensors that reach them only through "
                       "data movement or Concat); 16 keeps the output range's headroom from costing resolution.")
    residual_bits: Literal[8, 16] = Field(
        8, description="Activation width of the linear-layer outputs (MatMul/Gemm/Conv) that a residual Add sums "
                       "into a stream read by a normalization: the attention output and FFN down-projection outputs "
                       "of transformers, which carry the residual stream's outlier channels (MiniLM: 100-240x the "
                       "median channel); 16 keeps those channels from costing the others their resolution.")
    residual_scales: Literal["tensor", "channel"] = Field(
        "tensor", description="Scale granularity of the 8-bit residual-branch outputs of MatMul/Gemm layers: "
                              "'channel' gives each output feature its own scale (its per-feature calibrated max), "
                              "applied by the layer's per-channel requantization and by the residual Add's "
                              "per-channel operand multipliers, so the outlier features cost the others nothing "
                              "at int8. Ignored where residualBits is 16.")
    activation_scales: Literal["tensor", "channel"] = Field(
        "tensor", description="Scale granularity of the 8-bit feature maps between convolutions and look-up "
                              "tables (a Conv or unary-function output read only by Convs and unary functions): "
                              "'channel' gives each channel its own scale (its calibrated per-channel range), "
                              "applied by the producer's per-channel requantization or per-channel table and "
                              "folded into the reading convolution's weights or tables, so a few wide channels "
                              "cost the others nothing at int8 (PP-OCR det's HardSwish outputs: 16x the median "
                              "channel); with calibration methods 2/3 each channel gets a zero point too.")
    channel_ranges: Literal["max", "crossValidated"] = Field(
        "max", description="How the per-channel ranges of activationScales 'channel' are set: 'max', the calibrated "
                           "per-channel minimum and maximum; 'crossValidated', each tensor's per-channel ranges "
                           "widened by the factor (1, 1.25, 1.5, 2 or 3) that minimizes, summed over the calibration "
                           "samples, the clipped plus rounding error of each sample under the ranges of the OTHER "
                           "samples: a range that one sample alone sets is one an unseen input goes past (two more "
                           "passes over the calibration samples; PP-OCR rec held out 0.962 -> 0.983).")
    weight_rounding: Literal["nearest", "gptq", "sequential"] = Field(
        "nearest", description="How convolution weights are rounded to their codes: 'nearest' code, or 'gptq' "
                               "(GPTQ on the im2col Hessian of each Conv's FP32 input over weightRoundingSamples "
                               "calibration samples: each weight's rounding error is pushed onto the weights not yet "
                               "rounded, to keep the layer's output rather than its weights), or 'sequential' "
                               "(each Conv's weights and bias refitted, layer by layer, so that on its quantized "
                               "input from the program it gives the FP32 layer's output, then GPTQ-rounded on the "
                               "quantized input's Hessian). Same scales, format and cost.")
    weight_rounding_samples: PositiveInt = Field(
        8, description="Calibration samples whose activations give the Hessians of weightRounding 'gptq' and the fit "
                       "of 'sequential'.")


# ---------------------------------------------------------------- other sections


class Uint8InputConfig(ConfigSection):
    """uint8 model inputs (``uint8Input``)."""

    apply: bool = Field(False, description="The MXQ takes uint8 input (raw pixels).")
    inputs: list[str] = Field(default_factory=list, description="Input names; empty means every input.")


class LayerBiasCorrectionConfig(ConfigSection):
    """Iterative bias correction of quantized layers (``layerBiasCorrection``)."""

    apply: bool = Field(False, description="Correct layer biases for the quantization error.")
    num_samples: PositiveInt = Field(256, description="Samples used to measure the error.")
    iterations: PositiveInt = Field(5, description="Correction rounds.")
    correction_rate: float = Field(0.05, gt=0, le=1, description="Share of the error removed per round.")
    empirical: bool = Field(
        False, description="Also measure every linear layer's mean output shift per channel (integer program "
                           "against the float graph, layer by layer in graph order, on calibration samples) and "
                           "move its bias by it: corrects the shift a layer inherits from the layers before it, "
                           "which the analytic correction (its own weight rounding) cannot see.")
    empirical_samples: PositiveInt = Field(16, description="Calibration samples the empirical correction runs "
                                                           "(one batch; memory grows with it).")


class EquivalentTransformationConfig(ConfigSection):
    """Scale migration between adjacent layers, SmoothQuant style (``equivalentTransformation``)."""

    apply: bool = Field(
        False, description="SmoothQuant before quantizing: divide the input features of MatMul/Gemm layers by "
                           "s_j = max|X_j|^alpha / max|W_j|^(1-alpha) and multiply their weight rows by s_j, folded "
                           "into the producing LayerNorm/RMSNorm (exact in float; skipped where the norm's output has "
                           "other readers, e.g. the residual stream of post-norm encoders).")
    alpha: float = Field(0.5, ge=0, le=1, description="Migration strength: 0 keeps the activation ranges, 1 moves "
                                                       "them entirely into the weights.")
    duplicate_norms: bool = Field(
        False, description="Where a norm's output is also read by other ops (the residual stream of post-norm "
                           "encoders such as BERT/MiniLM), give its MatMul readers a smoothed copy of the norm (one "
                           "more norm per block, int8 output) instead of skipping them.")


class CrossLayerEqualizationConfig(ConfigSection):
    """Cross-layer equalization of depthwise -> convolution pairs (``crossLayerEqualization``)."""

    apply: bool = Field(
        True, description="Balance the channel ranges of a depthwise convolution's output that feeds another "
                          "convolution directly, from the calibrated per-channel ranges (exact in float).")


class MixedPrecisionTarget(ConfigSection):
    """The accuracy automatic mixed precision must reach on the held-out samples (``mixedPrecision.target``)."""

    kind: Literal["cosine", "sqnrDb", "top1"] = Field(
        "cosine", description="cosine: worst output's mean cosine to FP32; sqnrDb: worst output SQNR (dB); "
                              "top1: worst classifier output's top-1 agreement with FP32 (0..1).")
    value: float = Field(0.99, description="The value to reach (at least).")
    statistic: Literal["mean", "worst"] = Field(
        "mean", description="cosine only: mean over the held-out samples, or the worst sample's cosine (every "
                            "sample must reach the value: one input unlike the others cannot hide in the mean).")

    @model_validator(mode="after")
    def _worst_needs_cosine(self) -> MixedPrecisionTarget:
        if self.statistic == "worst" and self.kind != "cosine":
            raise ValueError(f"statistic 'worst' needs kind 'cosine' (per-sample values), got '{self.kind}'")
        return self


class MixedPrecisionConfig(ConfigSection):
    """Automatic mixed precision: promote the most sensitive layers to int16 until a target holds (``mixedPrecision``)."""

    apply: bool = Field(False, description="Choose int16 layers automatically before quantizing.")
    target: MixedPrecisionTarget = Field(default_factory=MixedPrecisionTarget, description="Accuracy target.")
    max_int16_fraction: float = Field(
        0.25, ge=0, le=1, description="Largest share of the layers that may become int16 (activations or weights).")
    latency_budget: float | None = Field(
        None, ge=0, description="Largest estimated latency increase over the int8 program, as a fraction "
                                "(0.15 = +15 %, first core mode, cost model estimate); none: unbounded.")
    sensitivity_samples: PositiveInt = Field(
        2, description="Calibration samples the sensitivity analysis that ranks the layers runs on.")
    zero_points: bool = Field(
        True, description="Before promoting layers, also measure zero-point activation ranges (calibration "
                          "method 2/3 for 0/1; no latency cost) and search from them when they measure better.")
    channel_scales: bool = Field(
        True, description="Before promoting layers, also measure per-channel 8-bit feature-map scales "
                          "(bit.activationScales channel; costs only per-channel look-up tables) and search from "
                          "them when they measure better.")


class LlmConfig(ConfigSection):
    """Large-language-model handling (``llm``)."""

    apply: bool = Field(False, description="Treat the model as a decoder LLM (KV cache, per-token inputs).")
    outlier_prefix: bool = Field(
        False, description="Put fixed tokens in front of every sequence, their KV cache computed once in FP32 "
                           "(PrefixQuant), so the attention sink's massive activations never reach the quantized "
                           "graphs; the tokens are chosen on the calibration text.")
    gptq: bool = Field(
        False, description="Round the weights with GPTQ (codes that keep each layer's output on the calibration "
                           "text, same per-channel format) instead of to the nearest code.")
    rotate: bool = Field(
        False, description="Rotate the residual stream by an orthogonal matrix folded into the weights (QuaRot): "
                           "its outlier features spread over all features, so one int16 scale per tensor fits "
                           "them; the model computes the same function.")


class SaveSampleConfig(ConfigSection):
    """Saving input/output samples next to the MXQ (``saveSample``)."""

    apply: bool = Field(False, description="Save sample inputs and reference outputs.")
    count: int = Field(0, ge=0, description="Number of samples saved; 0 saves every held-out analysis sample.")


class CpuLayersConfig(ConfigSection):
    """Supported layers the user runs on the host CPU (``cpuLayers``); entries are glob patterns (``layer_matches``).

    The CPU parts join the ``cpuOffload`` split: the NPU runs one contiguous body between a CPU head and a CPU tail.
    """

    head: list[str] = Field(
        default_factory=list,
        description="Layers run on the CPU before the NPU, with every layer they depend on back to the inputs "
                    "(e.g. a log-mel front end whose Log needs more range than int16 holds).")
    tail: list[str] = Field(
        default_factory=list,
        description="Layers run on the CPU after the NPU, with every layer after them to the outputs.")

    @property
    def patterns(self) -> list[str]:
        """Every pattern, head first."""
        return [*self.head, *self.tail]


class QuantizationGroup(ConfigSection):
    """The grouped spelling ``quantization: {calibration, bit}``; moved to the top level."""

    calibration: CalibrationConfig | None = Field(None, description="Same as top-level calibration.")
    bit: BitConfig | None = Field(None, description="Same as top-level bit.")


# ---------------------------------------------------------------- CompileConfig


class CompileConfig(ConfigSection):
    """The complete compile configuration, as stored in JSON/YAML files and MXQ metadata."""

    model_paths: list[str] = Field(default_factory=list, description="Source model files.")
    calib_data_paths: list[str] = Field(
        default_factory=list, description="Calibration data: image/.npy folders, .txt lists, JSON manifests.")
    save_paths: list[str] = Field(default_factory=lambda: ["./tmp.mxq"], description="Output MXQ files.")
    use_random_calib: bool = Field(False, description="Calibrate with random data (smoke tests only).")
    inference_scheme: InferenceScheme = Field("single", description="Core mode(s) to compile for.")
    cpu_offload: bool = Field(False, description="Run unsupported head/tail layers on the host CPU.")
    cpu_layers: CpuLayersConfig = Field(
        default_factory=CpuLayersConfig,
        description="Supported layers to run on the host CPU anyway, with what they need (a head or a tail).")
    input_shape_dict: dict[str, list[PositiveInt]] = Field(
        default_factory=dict, description="Input name -> static shape, pinning dynamic dimensions.")
    device: Literal["cpu", "gpu"] = Field("cpu", description="Compile host device for calibration.")
    image_channels: Literal[0, 1, 3] = Field(
        0, description="Channels calibration images are decoded to. 0 Model: the model input's own channel count; "
                       "1 Gray: convert to gray (the model must take 1 channel); "
                       "3 RGB: convert gray to RGB (the model must take 3 channels).")
    config_version: str = Field(CONFIG_VERSION, description="Schema version; this compiler reads 1.x.y.")
    target_device: str | None = Field(None, description="Target NPU, e.g. aries-rb (checked by targets).")
    backend: Backend | None = Field(None, description="Source framework; None guesses from the file.")
    analysis_holdout: int = Field(
        16, ge=0, description="Calibration samples held out for FP32-vs-quantized accuracy analysis.")
    uint8_input: Uint8InputConfig = Field(default_factory=Uint8InputConfig, description="uint8 inputs.")
    preprocessing: PreprocessingConfig = Field(
        default_factory=PreprocessingConfig, description="Calibration image preprocessing.")
    calibration: CalibrationConfig = Field(default_factory=CalibrationConfig, description="Calibration.")
    bit: BitConfig = Field(default_factory=BitConfig, description="Bit widths and overrides.")
    layer_bias_correction: LayerBiasCorrectionConfig = Field(
        default_factory=LayerBiasCorrectionConfig, description="Layer bias correction.")
    equivalent_transformation: EquivalentTransformationConfig = Field(
        default_factory=EquivalentTransformationConfig, description="Equivalent transformation.")
    cross_layer_equalization: CrossLayerEqualizationConfig = Field(
        default_factory=CrossLayerEqualizationConfig, description="Cross-layer equalization.")
    mixed_precision: MixedPrecisionConfig = Field(
        default_factory=MixedPrecisionConfig, description="Automatic mixed precision.")
    llm: LlmConfig = Field(default_factory=LlmConfig, description="LLM handling.")
    save_sample: SaveSampleConfig = Field(default_factory=SaveSampleConfig, description="Sample saving.")
    quantization: QuantizationGroup | None = Field(
        None, exclude=True, description="Grouped spelling of calibration and bit; read only.")

    @field_validator("model_paths", "calib_data_paths", "save_paths", mode="before")
    @classmethod
    def _single_path_as_list(cls, value: Any) -> Any:
        return [os.fspath(value)] if isinstance(value, (str, os.PathLike)) else value

    @field_validator("config_version")
    @classmethod
    def _supported_version(cls, version: str) -> str:
        if re.fullmatch(r"1\.\d+\.\d+", version) is None:
            raise ValueError(f"configVersion '{version}' is not supported; this compiler reads 1.x.y")
        return version

    @model_validator(mode="after")
    def _ungroup(self) -> CompileConfig:
        group = self.__dict__.get("quantization")
        if group is None:
            return self
        for name in sorted(group.model_fields_set):
            if name in self.model_fields_set:
                raise ValueError(f"'{name}' is given both at the top level and under quantization; keep one")
            self.__dict__[name] = getattr(group, name)
            self.__pydantic_fields_set__.add(name)
        self.__dict__["quantization"] = None
        self.__pydantic_fields_set__.discard("quantization")
        return self

    @classmethod
    def default_config(cls) -> CompileConfig:
        """Every field at its default."""
        return cls()

    @classmethod
    def from_dict(cls, data: Any, source: str = "config") -> CompileConfig:
        """Validate a mapping, raising ConfigError (not ValidationError) that names ``source``.

        Raises:
            ConfigError: an unknown key, a wrong type or an out-of-range value.
        """
        try:
            return cls.model_validate(data)
        except ValidationError as error:
            raise config_error_from_validation(error, source) from error

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> CompileConfig:
        """Read a ``.json``, ``.yaml`` or ``.yml`` config file.

        Raises:
            ConfigError: the file is unreadable, not valid JSON/YAML, or not a valid config; the
                message names the file and the offending key.
        """
        data = files.read_mapping(path)
        try:
            return cls.model_validate(data)
        except ValidationError as error:
            raise config_error_from_validation(error, os.fspath(path), file=os.fspath(path)) from error

    @classmethod
    def from_preset(cls, name: str) -> CompileConfig:
        """The defaults with preset ``name`` applied.

        Raises:
            ConfigError: no preset of that name (the message lists the valid names).
        """
        from compiler_core.config.presets import preset_config

        return cls.from_dict(preset_config(name), source=f"preset '{name}'")

    def to_dict(self, *, grouped: bool = False) -> dict[str, Any]:
        """JSON-ready dict with camelCase keys; ``grouped`` nests calibration and bit under quantization."""
        data = self.model_dump(mode="json", by_alias=True)
        if not grouped:
            return data
        result: dict[str, Any] = {}
        for key, value in data.items():
            target = result.setdefault("quantization", {}) if key in QuantizationGroup.model_fields else result
            target[key] = value
        return result

    def to_file(self, path: str | os.PathLike, *, grouped: bool = False) -> None:
        """Write the config atomically as JSON or YAML, chosen by the suffix of ``path``.

        Raises:
            ArgumentError: the suffix is not .json, .yaml or .yml.
            OutputWriteError: the file cannot be written.
        """
        files.write_mapping(path, self.to_dict(grouped=grouped))


def layer_matches(patterns: Iterable[str], *names: str | None) -> bool:
    """Whether any of ``names`` (MBLT node name, source name) matches any glob pattern.

    Matching is case-insensitive ``fnmatch`` (``*``, ``?``, ``[...]``); a pattern without wildcards
    must equal the whole name.
    """
    candidates = [name.lower() for name in names if name]
    return any(fnmatch.fnmatchcase(name, pattern.lower()) for pattern in patterns for name in candidates)
