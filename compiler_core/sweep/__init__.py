"""Settings sweeps: a grid of compile configs, compiled in parallel over one cached calibration, with a Pareto front."""

from compiler_core.sweep.executor import (
    EXECUTORS,
    InProcessExecutor,
    LocalProcessExecutor,
    PointTask,
    RayExecutor,
    SweepExecutor,
    make_executor,
)
from compiler_core.sweep.grid import AXES, SweepGrid, SweepPoint, differing_settings, expand_grid, load_grid
from compiler_core.sweep.pareto import pareto_front
from compiler_core.sweep.run import SweepResult, results_csv, run_sweep

__all__ = ["AXES", "EXECUTORS", "InProcessExecutor", "LocalProcessExecutor", "PointTask", "RayExecutor",
           "SweepExecutor", "SweepGrid",
           "SweepPoint", "SweepResult", "differing_settings", "expand_grid", "load_grid", "make_executor",
           "pareto_front", "results_csv", "run_sweep"]
