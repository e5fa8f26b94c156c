"""Leave-one-out robustness of per-channel feature-map ranges (docs/accuracy.md, "Leave-one-out ranges").

A per-channel range that one calibration sample alone sets is fragile: an unseen input goes past it. From the
calibration samples only, per 8-bit tensor of the program (uint8 input where ``quant_accuracy.EXTRA_DATA`` has one,
zero points, per-channel feature-map scales: the variant automatic mixed precision measures), this bench computes:

1. **LOO clipping / rounding**: for each calibration sample i, the range the *other* samples give (max observer:
   per channel for a channel-scale tensor, per tensor otherwise), the energy of sample i's values past it, over
   the rounding noise of that range (``step^2 / 12`` per value); per tensor, the median over the samples. Tensors
   are ranked by it; the columns after it judge the ranking (computed afterwards, never used to choose): the same
   ratio for the search and held-out samples against the whole calibration range, and for one held-out sample.
2. **Cross-validated widening**: per channel-scale tensor, the factor k of ``range_validation.WIDENINGS`` that minimizes, summed
   over the calibration samples, the clipped energy plus the rounding noise of sample i under the other samples'
   per-channel range times k (cut to their per-tensor range, as the quantizer cuts it): what
   ``bit.channelRanges: crossValidated`` computes (:mod:`compiler_core.quantization.range_validation`).
3. The program with those widenings (per-channel ranges times k on the full calibration statistics) against the
   base, on the search and the held-out samples (fast executor against the MBLT in onnxruntime; worst output's
   mean cosine), with the estimated aries-rb latency. ``--refit`` measures both with
   ``bit.weightRounding: sequential`` too; ``--int16-ops A-B`` adds int16 activations on those ops.
4. ``--loo-judge``: every calibration sample judged by a program quantized from the other samples' statistics
   (min / max and per-channel ranges recomputed from the per-sample ranges): a calibration sample that sets a range
   by itself is unseen there.

Data: the splits of ``python bench/quant_accuracy.py --amp`` (``quant_accuracy.amp_splits``; ``--amp-holdout`` search
samples), statistics of exactly the calibration split.

5. ``--amp``: automatic mixed precision (target cosine 0.99, 25 %, +15 %) with each ``bit.channelRanges``, judged on the
   held-out samples (:func:`amp_row`; use ``--amp-holdout 4``).

Usage: ``python bench/loo_ranges.py [--models ppocr_det,ppocr_rec,ppocr_cls,mobilenet_v2] [--amp-holdout 8]
[--top 16] [--refit] [--int16-ops 43-67] [--loo-judge] [--amp] [--held-out-sample 2]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT / "tests"))
sys.path.insert(0, str(REPO_ROOT / "bench"))
sys.path.insert(0, str(REPO_ROOT))

import quant_accuracy  # noqa: E402


def setup(name: str, holdout: int, folder: Path) -> dict:
    """The model's MBLT, the three ``--amp`` splits and the base config (as ``quant_accuracy --amp`` builds them)."""
    import corpus

    from compiler_core.api import mblt_compile

    entry = corpus.corpus_by_name()[name]
    mblt = mblt_compile(entry.source(), folder / f"{name}.mblt", input_shape_dict=entry.input_shape_dict or None,
                        constant_inputs=entry.constant_inputs or None)
    splits, sources = quant_accuracy.amp_splits(name, corpus._mblt_inputs(mblt), holdout)
    return {"name": name, "mblt": mblt, "splits": splits, "sources": sources}


def config(name: str, refit: bool = False, activation16: tuple[str, ...] = ()):
    """uint8 input (text detector), zero points (method 2), per-channel feature-map scales; optionally the refit."""
    from compiler_core.config import resolve_config
    from compiler_core.quantization.mixed_precision import with_overrides

    bit = {"activationScales": "channel", **({"weightRounding": "sequential"} if refit else {})}
    resolved = resolve_config(target_device="aries-rb", calibration_config={"method": 2}, bit_config=bit,
                              **quant_accuracy.uint8_input_config(name))
    return with_overrides(resolved, activation16, []) if activation16 else resolved


def statistics(session, samples: list[dict]):
    """Statistics of exactly ``samples`` on the program's quantization points."""
    from compiler_core.calibration.statistics import collect_statistics
    from compiler_core.quantization.run import _quantization_points

    return collect_statistics(session.graph, samples, num_samples=len(samples), mblt_sha256=session.sha256,
                              tensors=_quantization_points(session.graph, None))


def other_range(low: np.ndarray, high: np.ndarray, left_out: int | None, per_channel: bool):
    """The range of every sample but ``left_out`` (all with ``None``), per channel or per tensor."""
    keep = np.arange(low.shape[0]) != left_out
    lo, hi = low[keep].min(0), high[keep].max(0)
    return (lo, hi) if per_channel else (np.full_like(lo, lo.min()), np.full_like(hi, hi.max()))


def clipping_over_rounding(values: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> float:
    """Energy of ``values`` past ``[lo, hi]`` (per channel) over the 8-bit rounding noise of that range."""
    clipped = values - np.clip(values, lo[:, None], hi[:, None])
    rounding = float(((hi - lo) / 255.0) ** 2 / 12.0 @ np.full(lo.size, values.shape[1]))
    return float((clipped ** 2).sum()) / max(rounding, 1e-30)


def loo_ratios(runner, calibration: list[dict], ranges, per_channel: dict[str, bool]) -> dict[str, np.ndarray]:
    """Second pass over the calibration samples: each one's clipping / rounding under the other samples' range."""
    ratio = {name: [] for name in ranges}
    for index, sample in enumerate(calibration):
        for name, values in runner.run(sample).items():
            ratio[name].append(clipping_over_rounding(values, *other_range(*ranges[name], index, per_channel[name])))
    return {name: np.array(values) for name, values in ratio.items()}


def judge_ratios(runner, samples: list[dict], ranges, per_channel) -> dict[str, np.ndarray]:
    """Clipping / rounding of each of ``samples`` against the whole calibration range."""
    ratios = {name: [] for name in ranges}
    for sample in samples:
        for name, values in runner.run(sample).items():
            ratios[name].append(clipping_over_rounding(values, *other_range(*ranges[name], None, per_channel[name])))
    return {name: np.array(values) for name, values in ratios.items()}


def widened(stats, factors: dict[str, float]):
    """``stats`` with the per-channel ranges of ``factors``' tensors multiplied by their factor."""
    tensors = dict(stats.tensors)
    for name, factor in factors.items():
        if factor != 1.0:
            tensor = tensors[name]
            tensors[name] = dataclasses.replace(tensor, per_channel_min=tensor.per_channel_min * factor,
                                                per_channel_max=tensor.per_channel_max * factor)
    return dataclasses.replace(stats, tensors=tensors)


def left_out(stats, ranges, index: int):
    """``stats`` as the calibration samples other than ``index`` give them (max observer: ranges only)."""
    tensors = dict(stats.tensors)
    for name, (low, high) in ranges.items():
        lo, hi = other_range(low, high, index, True)
        tensors[name] = dataclasses.replace(tensors[name], per_channel_min=lo, per_channel_max=hi,
                                            min=float(lo.min()), max=float(hi.max()))
    return dataclasses.replace(stats, tensors=tensors)


def quantize(session, stats, compile_config, samples=None):
    from compiler_core.progress import Reporter
    from compiler_core.quantization.run import quantize_from_statistics

    return quantize_from_statistics(session.graph, stats, compile_config, mblt_sha256=session.sha256,
                                    reporter=Reporter(None), samples=samples)[1]


def outputs(model, samples: list[dict]) -> list[list[np.ndarray]]:
    """Dequantized outputs of the program, by the fast executor."""
    from compiler_core.runtime.fastpath.plan import executor_for

    fast = executor_for(model)
    results = []
    for sample in samples:
        feeds = {spec.name: np.asarray(sample[spec.name]) for spec in model.inputs}
        codes = fast.execute_codes(fast.quantize_inputs(feeds), keep=set(), as_int64=False)
        results.append([model.params(spec.name).dequantize(codes[spec.name]) for spec in model.outputs])
    return results


def point(model, references: dict, splits: dict) -> dict:
    """Search and held-out cosines (worst output's mean, per sample) and the estimated latency of ``model``."""
    from compiler_core.quantization.mixed_precision import counted_layers, int16_layers
    from compiler_core.runtime.cost import estimate
    from compiler_core.targets import get_device

    row = {"latency_ms": estimate(model, get_device("aries-rb"), "single").latency_ms,
           "int16_layers": f"{int16_layers(model)}/{counted_layers(model)}"}
    for split in ("search", "held_out"):
        test = [[np.reshape(t, np.shape(r)) for r, t in zip(ref, ours)]
                for ref, ours in zip(references[split], outputs(model, splits[split]))]
        row[split] = quant_accuracy.worst_cosine(references[split], test)
        row[f"{split}_per_sample"] = [round(c, 3) for c in quant_accuracy._per_sample(references[split], test)]
    return row


def print_ranking(name: str, ratio, judges, per_channel, op_index, args) -> None:
    median = {tensor: float(np.median(values)) for tensor, values in ratio.items()}
    order = sorted(median, key=lambda tensor: -median[tensor])
    print(f"\n{name}: LOO clipping / rounding (median over {len(next(iter(ratio.values())))} calibration samples), "
          f"top {args.top} of {len(order)} 8-bit tensors; judges: search / held-out median, held-out sample "
          f"#{args.held_out_sample}")
    print("rank  op  range    LOO  | search  held  sample | tensor")
    for rank, tensor in enumerate(order[:args.top], 1):
        held = judges["held_out"][tensor]
        one = held[args.held_out_sample] if args.held_out_sample < held.size else float("nan")
        print(f"{rank:4d} {op_index.get(tensor, -1):4d} {'channel' if per_channel[tensor] else 'tensor '} "
              f"{median[tensor]:6.3f} | {np.median(judges['search'][tensor]):6.3f} {np.median(held):6.3f} "
              f"{one:8.2f} | {tensor}")
    for threshold in (0.1, 0.5, 1.0):
        print(f"  tensors with LOO > {threshold}: {sum(value > threshold for value in median.values())}")


def run_model(name: str, args, folder: Path) -> None:
    from compiler_core.quantization.range_validation import TensorRunner, cross_validated_widenings
    from compiler_core.session import MbltSession

    started = time.perf_counter()
    context = setup(name, args.amp_holdout, folder)
    splits = context["splits"]
    session = MbltSession.open(context["mblt"])
    calibration = splits["calibration"]
    stats = statistics(session, calibration)
    base_config = config(name)
    base = quantize(session, stats, base_config)
    names = [tensor for tensor, record in stats.tensors.items()
             if record.channel_axis is not None and tensor in base.tensors and base.params(tensor).bits == 8]
    per_channel = {tensor: base.params(tensor).axis is not None for tensor in names}
    op_index = {output: index for index, op in enumerate(base.ops) for output in op.outputs}
    axes = {tensor: stats[tensor].channel_axis for tensor in names}
    runner = TensorRunner(session.graph, axes)
    ranges = runner.sample_ranges(calibration)
    ratio = loo_ratios(runner, calibration, ranges, per_channel)
    chosen = cross_validated_widenings(session.graph, {t: axes[t] for t in names if per_channel[t]}, calibration)
    judges = {split: judge_ratios(runner, splits[split], ranges, per_channel) for split in ("search", "held_out")}
    print(f"\n{name}: splits {context['sources']}")
    print_ranking(name, ratio, judges, per_channel, op_index, args)
    wide = {tensor: factor for tensor, factor in chosen.items() if factor > 1}
    print(f"\n{name}: cross-validated widening of {len(wide)} of {len(chosen)} channel-scale tensors: "
          + ", ".join(f"{tensor} (op {op_index.get(tensor)}) x{factor}" for tensor, factor in wide.items()))
    references = {split: quant_accuracy.ort_outputs(context["mblt"], splits[split]) for split in ("search", "held_out")}
    activation16 = ()
    if args.int16_ops:
        first, last = (int(x) for x in args.int16_ops.split("-"))
        activation16 = tuple(base.ops[index].outputs[0] for index in range(first, last + 1))
    variants = [("base", False, ()), ("widened", False, ())]
    if activation16:
        variants += [(f"base, int16 ops {args.int16_ops}", False, activation16),
                     (f"widened, int16 ops {args.int16_ops}", False, activation16)]
    if args.refit:
        variants += [(f"refit {label}", True, int16) for label, _, int16 in variants]
    base_latency = None
    for label, refit, int16 in variants:
        step = time.perf_counter()
        used = widened(stats, chosen) if "widened" in label else stats
        model = quantize(session, used, config(name, refit, int16), calibration if refit else None)
        row = point(model, references, splits)
        base_latency = base_latency or row["latency_ms"]
        print(f"{name} {label:36s} search {row['search']:.4f} (min {min(row['search_per_sample']):.3f}) | held out "
              f"{row['held_out']:.4f} {row['held_out_per_sample']} | int16 {row['int16_layers']} | "
              f"{100 * (row['latency_ms'] / base_latency - 1):+.1f} % | {time.perf_counter() - step:.0f} s", flush=True)
    if args.amp:
        for rule in ("max", "crossValidated"):
            amp_row(name, context, rule, references["held_out"], folder)
    if args.loo_judge:
        loo_judge(name, session, stats, ranges, chosen, calibration, base_config, activation16, args.int16_ops)
    print(f"{name}: {time.perf_counter() - started:.0f} s")


def loo_judge(name: str, session, stats, ranges, chosen, calibration, base_config, activation16, ops: str) -> None:
    references = quant_accuracy.ort_outputs(_model_bytes(session), calibration)
    programs = {"base": ({}, base_config), "widened": (chosen, base_config)}
    if activation16:
        programs[f"int16 ops {ops}"] = ({}, config(name, False, activation16))
    rows = {label: [] for label in programs}
    for index, sample in enumerate(calibration):
        for label, (factors, compile_config) in programs.items():
            model = quantize(session, widened(left_out(stats, ranges, index), factors), compile_config)
            test = [[np.reshape(t, np.shape(r)) for r, t in zip(references[index], outputs(model, [sample])[0])]]
            rows[label].append(quant_accuracy.worst_cosine([references[index]], test))
    print(f"\n{name}: each calibration sample judged by the program of the other samples' statistics")
    for label, values in rows.items():
        values = np.array(values)
        print(f"  {label:16s} mean {values.mean():.4f}  per sample {np.round(values, 3).tolist()}")


def amp_row(name: str, context: dict, rule: str, references, folder: Path) -> None:
    """Automatic mixed precision (target cosine 0.99 on the search samples, 25 % int16, +15 %) from the default config
    with ``bit.channelRanges`` ``rule`` (and the uint8 input of a text detector), judged on the held-out samples. The
    search split sits where the compiler's ``analysisHoldout`` takes it (with ``--amp-holdout 4`` the compiler holds out
    exactly the search samples; more are capped at a quarter of the manifest)."""
    from compiler_core.config import resolve_config
    from compiler_core.progress import Reporter
    from compiler_core.quantization.mixed_precision import choose_mixed_precision
    from compiler_core.quantization.run import calibration_statistics, quantize_from_statistics
    from compiler_core.session import MbltSession

    splits = context["splits"]
    manifest = quant_accuracy.amp_manifest(folder / f"{name}_{rule}_calib", splits["calibration"], splits["search"])
    compile_config = resolve_config(
        target_device="aries-rb", calib_data_path=str(manifest), analysis_holdout=len(splits["search"]),
        calibration_config={"numSamples": len(splits["calibration"])}, bit_config={"channelRanges": rule},
        mixed_precision_config={"apply": True, "target": {"kind": "cosine", "value": 0.99}, "maxInt16Fraction": 0.25,
                                "latencyBudget": 0.15}, **quant_accuracy.uint8_input_config(name))
    started = time.perf_counter()
    session = MbltSession.open(context["mblt"])
    result = choose_mixed_precision(session, compile_config, calib_data_path=str(manifest))
    chosen = result.points[result.chosen]
    calibration, _, stats, _ = calibration_statistics(session, result.config, calib_data_path=str(manifest),
                                                      reporter=Reporter(None))
    model = quantize_from_statistics(session.graph, stats, result.config, mblt_sha256=session.sha256,
                                     reporter=Reporter(None), samples=calibration)[1]
    test = [[np.reshape(t, np.shape(r)) for r, t in zip(ref, ours)]
            for ref, ours in zip(references, outputs(model, splits["held_out"]))]
    print(f"{name} AMP, channelRanges {rule:14s} search {chosen['metric']:.4f} (target met: {result.target_met}, "
          f"{len(result.points)} points, zero points {chosen.get('zero_points')}, channel scales "
          f"{chosen.get('channel_scales')}) | held out {quant_accuracy.worst_cosine(references, test):.4f} "
          f"{[round(c, 3) for c in quant_accuracy._per_sample(references, test)]} | int16 {chosen['int16_layers']} | "
          f"{100 * chosen['latency_increase']:+.1f} % | {time.perf_counter() - started:.0f} s", flush=True)


def _model_bytes(session) -> bytes:
    import onnx_ir as ir

    return ir.to_proto(session.graph).SerializeToString()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="ppocr_det,ppocr_rec,ppocr_cls,mobilenet_v2")
    parser.add_argument("--amp-holdout", type=int, default=8, help="corpus samples of the search split")
    parser.add_argument("--top", type=int, default=16)
    parser.add_argument("--held-out-sample", type=int, default=2, help="held-out sample shown on its own")
    parser.add_argument("--refit", action="store_true", help="also with bit.weightRounding: sequential")
    parser.add_argument("--int16-ops", default="", help="also with int16 activations on ops A-B (e.g. 43-67)")
    parser.add_argument("--loo-judge", action="store_true")
    parser.add_argument("--amp", action="store_true", help="also automatic mixed precision with each channelRanges")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="loo-ranges-") as folder:
        for name in args.models.split(","):
            run_model(name, args, Path(folder))


if __name__ == "__main__":
    main()
