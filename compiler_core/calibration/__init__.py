"""Calibration data: reading every supported form, preprocessing images, and the make_calib helpers (images, text).

Open data with :func:`open_calibration_data`; it validates every file against the model inputs
(:func:`input_specs`) and returns a lazily loaded :class:`CalibrationDataset`. See
docs/calibration-data.md.
"""

from compiler_core.calibration.dataset import CalibrationDataset
from compiler_core.calibration.hf_processor import folder_pipeline
from compiler_core.calibration.make_calib import (
    make_calib,
    make_calib_man,
    make_calib_text,
    tokenizer_folder,
    vendor_yaml_to_pipeline,
)
from compiler_core.calibration.preprocess import IMAGE_SUFFIXES, PIPELINE_OPS, preprocess_image
from compiler_core.calibration.readers import open_calibration_data, write_folder_manifest
from compiler_core.calibration.specs import InputSpec, input_kind, input_specs, token_input_roles

__all__ = [
    "IMAGE_SUFFIXES",
    "PIPELINE_OPS",
    "CalibrationDataset",
    "folder_pipeline",
    "InputSpec",
    "input_kind",
    "input_specs",
    "make_calib",
    "make_calib_man",
    "make_calib_text",
    "open_calibration_data",
    "preprocess_image",
    "token_input_roles",
    "tokenizer_folder",
    "vendor_yaml_to_pipeline",
    "write_folder_manifest",
]
