"""The simulator runtime, qbruntime-style: ``Accelerator``, ``ModelConfig``, ``Model``, ``get_model_summary``."""

from compiler_core.runtime.model import Accelerator, Model, ModelConfig, get_model_summary

__all__ = ["Accelerator", "Model", "ModelConfig", "get_model_summary"]
