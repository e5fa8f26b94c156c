"""TensorFlow / Keras frontend: SavedModel folders, ``.keras`` and ``.h5`` files, via TFLite.

TensorFlow's own TFLite converter lowers the model to TFLite builtin ops (folding BatchNorm,
resolving Keras layers and control flow that tf2onnx would have to pattern-match), and the TFLite
frontend turns that into ONNX. Only builtin TFLite ops are allowed (no Select TF ops), and no
quantization is applied: the compiler quantizes later. TensorFlow is an optional extra.

Two retries on Keras files: a conversion that fails on TensorList ops (the loop of LSTM/GRU/SimpleRNN) is
done again with the recurrent layers unrolled; a flatbuffer that depends on the dynamic batch (ops the
TFLite frontend cannot convert, such as a dilated convolution kept as SPACE_TO_BATCH_ND/BATCH_TO_SPACE_ND,
or inner tensor sizes left open) is made again from a copy of the model whose inputs have batch 1 (same
names), which TensorFlow writes with static shapes and plain ops.
"""

from __future__ import annotations

import contextlib
import io
import logging
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import onnx_ir as ir

from compiler_core.errors import ArgumentError, ModelLoadError, UnsupportedOpsError

logger = logging.getLogger(__name__)

TF_EXTRA_HINT = "install the tf extra: pip install qbstudio[tf]"
_KERAS_SUFFIXES = (".keras", ".h5", ".hdf5")


def load_tf(model: Any, output_names: Sequence[str] | None = None, *, allow_pickle: bool = False,
            **_: Any) -> ir.Model:
    """Load a SavedModel folder or a Keras ``.keras``/``.h5`` file as an ONNX onnx-ir model.

    The model keeps TensorFlow's layout (NHWC) and its input names as TFLite gives them.

    Args:
        model: Path to a SavedModel folder (with ``saved_model.pb``) or a Keras model file.
        output_names: Tensors (TFLite names) to end the graph at, as for the TFLite frontend.
        allow_pickle: Load Keras ``Lambda`` layers, whose Python code is stored in the file and runs when it loads
            (Keras's ``safe_mode=False``; the same consent as a pickled torch module).

    Raises:
        ModelLoadError: TensorFlow is not installed, or the model cannot be read or converted.
        UnsupportedOpsError: the model uses TensorFlow ops with no TFLite builtin equivalent.
    """
    from compiler_core.frontends.tflite import load_tflite_bytes

    path = _as_path(model)
    tf = import_tensorflow()
    try:
        flatbuffer = _convert(tf, _converter(tf, path, allow_pickle))
    except ModelLoadError:
        raise
    except Exception as error:  # tf.lite's ConverterError and whatever TF raises while tracing
        if "TensorList" not in str(error) or path.is_dir():
            raise _conversion_error(path, error) from error
        try:  # Keras LSTM/GRU/SimpleRNN loop over TensorLists, which TFLite builtins lack; unrolled they convert
            flatbuffer = _convert(tf, _unrolled_converter(tf, path, allow_pickle))
        except Exception:  # not unrollable (no static sequence length): the first error says what is wrong
            raise _conversion_error(path, error) from error
    logger.info("TensorFlow converted %s to a %d-byte TFLite flatbuffer", path.name, len(flatbuffer))
    if not path.is_dir() and (reason := _batch_dependent(flatbuffer, path)):
        batch_one = _batch_one_flatbuffer(tf, path, allow_pickle)
        if batch_one is not None:
            logger.info("%s: converted again with batch 1 (%s)", path.name, reason)
            flatbuffer = batch_one
    if path.is_dir() and _has_resource_variables(flatbuffer, path):
        flatbuffer = _frozen_signature_flatbuffer(tf, path)
    return load_tflite_bytes(flatbuffer, path, output_names)


_RESOURCE_VARIABLE_OPS = frozenset({"VAR_HANDLE", "READ_VARIABLE", "ASSIGN_VARIABLE"})


def _has_resource_variables(flatbuffer: bytes, path: Path) -> bool:
    """True when the converter kept the weights as resource variables (VAR_HANDLE / READ_VARIABLE), as it does for a
    SavedModel written with ``tf.saved_model.save`` of a ``tf.Module`` (a Keras model behind hand-written
    signatures) rather than by Keras's own ``model.export``."""
    from compiler_core.frontends.tflite.reader import decode_tflite

    return any(op.display_name in _RESOURCE_VARIABLE_OPS for op in decode_tflite(flatbuffer, path).operators)


def _frozen_signature_flatbuffer(tf: Any, path: Path) -> bytes:
    """The SavedModel's serving signature (or its only one) converted as a concrete function of the loaded model,
    which folds its variables into constants. Several signatures and no ``serving_default``: refused, naming them."""
    loaded = _guarded(path, lambda: tf.saved_model.load(str(path)))
    names = list(loaded.signatures)
    name = "serving_default" if "serving_default" in names else (names[0] if len(names) == 1 else None)
    if name is None:
        raise ModelLoadError(f"'{path.name}' has {len(names)} signatures and none is serving_default: "
                             f"{', '.join(names)}.", hint="Save the SavedModel with the signature to compile as "
                             "serving_default (signatures={'serving_default': ...}).", file=str(path))
    if len(names) > 1:
        logger.info("%s: compiling its signature %s (of %s)", path.name, name, ", ".join(names))
    try:
        return _convert(tf, tf.lite.TFLiteConverter.from_concrete_functions([loaded.signatures[name]], loaded))
    except Exception as error:  # tf.lite's ConverterError and whatever TF raises while tracing
        raise _conversion_error(path, error) from error


def _batch_dependent(flatbuffer: bytes, path: Path) -> str | None:
    """Why the flatbuffer of a dynamic-batch conversion will not import as the model is, or None.

    TensorFlow keeps what depends on the batch at run time: a dilated convolution as SPACE_TO_BATCH_ND ->
    CONV_2D -> BATCH_TO_SPACE_ND (no converter here), and inner tensors whose sizes it cannot write (a
    Cropping2D after an UpSampling2D slices a tensor stored as height 1).
    """
    from compiler_core.frontends.tflite.converters import CONVERTERS
    from compiler_core.frontends.tflite.reader import decode_tflite

    graph = decode_tflite(flatbuffer, path)
    missing = sorted({op.display_name for op in graph.operators if op.key not in CONVERTERS})
    if missing:
        return f"no converter for {', '.join(missing)}"
    if any(dim != 0 for tensor in graph.tensors for dim in tensor.dynamic_dims):
        return "tensor sizes left open beyond the batch"
    return None


def _batch_one_flatbuffer(tf: Any, path: Path, allow_pickle: bool) -> bytes | None:
    """The Keras model converted with its inputs' batch fixed to 1 (same input names), or None where that fails.

    With a dynamic batch TensorFlow's converter keeps a dilated convolution as SPACE_TO_BATCH_ND -> CONV_2D ->
    BATCH_TO_SPACE_ND (Keras Conv1D/Conv2D with ``dilation_rate``, DeepLab's atrous convolutions), which the
    NPU cannot run (a batch of blocks); with batch 1 it writes the dilated CONV_2D.
    """
    try:
        keras_model = _load_keras(tf, path, allow_pickle)
        inputs = tf.nest.map_structure(lambda tensor: tf.keras.Input(
            batch_shape=(1, *tensor.shape[1:]), dtype=tensor.dtype, name=tensor.name), keras_model.input)
        fixed = tf.keras.models.clone_model(keras_model, input_tensors=inputs)
        fixed.set_weights(keras_model.get_weights())
        for layer in _sublayers(fixed):  # as the first conversion left them (unrolled or not)
            if isinstance(layer, tf.keras.layers.RNN):
                layer.unroll = True
        return _convert(tf, tf.lite.TFLiteConverter.from_keras_model(fixed))
    except Exception as error:  # subclassed models cannot be cloned; TF raises many types
        logger.debug("%s: no batch-1 conversion (%s)", path.name, _first_line(error))
        return None


def _convert(tf: Any, converter: Any) -> bytes:
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):  # Keras prints the exported signature ("Endpoint 'serve' ...")
            return converter.convert()
    finally:
        if printed.getvalue().strip():
            logger.debug("TensorFlow's converter printed:\n%s", printed.getvalue().rstrip())


def _unrolled_converter(tf: Any, path: Path, allow_pickle: bool) -> Any:
    """The converter of the Keras model with its recurrent layers unrolled (``unroll=True``: the same outputs, the
    time loop written out step by step), for a static sequence length."""
    keras_model = _guarded(path, lambda: _load_keras(tf, path, allow_pickle))
    recurrent = [layer for layer in _sublayers(keras_model) if isinstance(layer, tf.keras.layers.RNN)]
    for layer in recurrent:
        layer.unroll = True
    logger.info("%s: unrolled %d recurrent layer(s) for the TFLite converter", path.name, len(recurrent))
    return tf.lite.TFLiteConverter.from_keras_model(keras_model)


def _sublayers(layer: Any):
    """``layer`` and every layer inside it (models, wrappers such as Bidirectional and TimeDistributed)."""
    yield layer
    children = list(getattr(layer, "layers", None) or [])
    children += [getattr(layer, name) for name in ("forward_layer", "backward_layer", "layer") if hasattr(layer, name)]
    for child in children:
        if child is not layer and hasattr(child, "weights"):
            yield from _sublayers(child)


def import_tensorflow() -> Any:
    """The ``tensorflow`` module, or a ModelLoadError telling the user to install the tf extra."""
    try:
        import tensorflow as tf
    except ImportError as error:
        raise ModelLoadError("TensorFlow is not installed, so TensorFlow and Keras models cannot be read.",
                             hint=TF_EXTRA_HINT) from error
    return tf


def _converter(tf: Any, path: Path, allow_pickle: bool) -> Any:
    if path.is_dir():
        if not (path / "saved_model.pb").exists():
            raise ModelLoadError(f"'{path}' is a folder without saved_model.pb, so not a SavedModel.",
                                 hint="Pass a SavedModel folder, or a .keras / .h5 file.", file=str(path))
        return _guarded(path, lambda: tf.lite.TFLiteConverter.from_saved_model(str(path)))
    if not path.exists():
        raise ModelLoadError(f"Model file '{path}' does not exist.", hint="Check the path.", file=str(path))
    if path.suffix.lower() not in _KERAS_SUFFIXES:
        raise ModelLoadError(f"'{path.name}' is not a SavedModel folder nor a Keras model file.",
                             hint="Pass a SavedModel folder or a .keras / .h5 file; a frozen .pb graph is "
                                  "not supported (export a SavedModel).", file=str(path))
    keras_model = _guarded(path, lambda: _load_keras(tf, path, allow_pickle))
    return tf.lite.TFLiteConverter.from_keras_model(keras_model)


def _load_keras(tf: Any, path: Path, allow_pickle: bool) -> Any:
    """The Keras model in ``path``; Lambda layers (Python code in the file) only with ``allow_pickle``."""
    if allow_pickle and path.suffix.lower() == ".keras":
        return tf.keras.models.load_model(str(path), compile=False, safe_mode=False)
    return tf.keras.models.load_model(str(path), compile=False)


def _guarded(path: Path, load: Any) -> Any:
    try:
        return load()
    except Exception as error:  # TF and Keras raise many types for unreadable or truncated models
        if "Lambda" in str(error) and "safe_mode" in str(error):
            raise ModelLoadError(f"'{path.name}' holds a Keras Lambda layer: loading it runs the Python code stored "
                                 "in the file, which Keras refuses unless told to.",
                                 hint="If you trust the file, pass --allow-pickle (Python: allow_pickle=True); or "
                                      "replace the Lambda with a built-in layer.", file=str(path)) from error
        if custom := re.search(r"Could not locate class '([^']+)'", str(error)):
            raise ModelLoadError(f"'{path.name}' uses the custom Keras layer '{custom.group(1)}', whose code is not in "
                                 "the file.",
                                 hint="Save the model as a SavedModel folder (model.export(FOLDER)), which holds its "
                                      "computation, and compile that; or compile from Python after importing the "
                                      "module that defines the layer.", file=str(path)) from error
        raise ModelLoadError(f"TensorFlow cannot read '{path.name}': {_first_line(error)}",
                             hint="Check that the file is complete and was saved by a compatible "
                                  "TensorFlow/Keras version.", file=str(path)) from error


def _conversion_error(path: Path, error: Exception) -> Exception:
    """Unsupported TF ops become UnsupportedOpsError listing each (with its count); else ModelLoadError."""
    names = re.findall(r"'?tf\.(\w+)'?", str(error))
    if names:
        counts: dict[str, int] = {}
        for name in names:
            counts[f"tf.{name}"] = counts.get(f"tf.{name}", 0) + 1
        ops = [{"op": op, "count": count, "nodes": [], "reason": "no TFLite builtin equivalent"}
               for op, count in counts.items()]
        return UnsupportedOpsError(
            f"'{path.name}' uses TensorFlow ops that TFLite builtins cannot express: {', '.join(counts)}.",
            hint="Replace these ops in the model (Select TF ops cannot be compiled).", ops=ops, file=str(path),
            stage="tf -> tflite")
    return ModelLoadError(f"TensorFlow's TFLite converter failed on '{path.name}': {_first_line(error)}",
                          hint="Check that the model runs in TensorFlow and has static input shapes.",
                          file=str(path))


def _first_line(error: Exception) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def _as_path(model: Any) -> Path:
    if not isinstance(model, (str, Path)):
        raise ArgumentError("The tf backend takes a path to a SavedModel folder or a .keras / .h5 file.",
                            hint="Save the Keras model first (model.save('m.keras')) and pass the path.")
    return Path(model)
