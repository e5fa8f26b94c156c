"""Train the bundled Fashion-MNIST sample CNN and write its ONNX model, images and documentation.

Usage::

    python scripts/train_sample.py --out resources/samples/fashion_cnn [--epochs N]

The data comes from the Debian package ``dataset-fashion-mnist`` (IDX files, read here with numpy
and gzip). Training is seeded and deterministic on CPU. The model is exported with the legacy
TorchScript exporter and without constant folding, so its BatchNormalization nodes stay in the graph:
folding them is the compiler's job, and the tests of that pass need them present.
"""

from __future__ import annotations

import argparse
import gzip
import json
import platform
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import torch
from PIL import Image
from torch import nn

DATASET_DIR = Path("/usr/share/datasets/fashion-mnist")
CLASS_NAMES = (
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
    "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
)
# File-name forms of CLASS_NAMES, e.g. ``000_tshirt.png``.
CLASS_SLUGS = (
    "tshirt", "trouser", "pullover", "dress", "coat",
    "sandal", "shirt", "sneaker", "bag", "ankle_boot",
)
SEED = 20240601
BATCH_SIZE = 128
LEARNING_RATE = 2e-3
OPSET = 17
CALIBRATION_COUNT = 48
TRY_COUNT = 20
INPUT_NAME = "image"
OUTPUT_NAME = "logits"


class FashionCNN(nn.Module):
    """Three Conv+BN+ReLU+MaxPool stages, then a two-layer classifier with dropout."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            *_conv_stage(1, 16), *_conv_stage(16, 32), *_conv_stage(32, 64),
        )
        self.classifier = nn.Sequential(
            nn.Flatten(), nn.Linear(64 * 3 * 3, 64), nn.ReLU(), nn.Dropout(0.25), nn.Linear(64, 10),
        )

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(image))


def _conv_stage(in_channels: int, out_channels: int) -> list[nn.Module]:
    return [
        nn.Conv2d(in_channels, out_channels, 3, padding=1, bias=False),
        nn.BatchNorm2d(out_channels), nn.ReLU(), nn.MaxPool2d(2),
    ]


def read_idx(path: Path) -> np.ndarray:
    """Reads a gzipped IDX file (unsigned-byte data only) into an array of its stated shape."""
    with gzip.open(path, "rb") as stream:
        raw = stream.read()
    if raw[:2] != b"\0\0" or raw[2] != 0x08:
        raise ValueError(f"{path}: not an unsigned-byte IDX file")
    rank = raw[3]
    shape = tuple(int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(rank))
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * rank).reshape(shape)


def load_split(split: str) -> tuple[np.ndarray, np.ndarray]:
    """Returns (images uint8 [N,28,28], labels uint8 [N]) of ``train`` or ``t10k``."""
    images_path = DATASET_DIR / f"{split}-images-idx3-ubyte.gz"
    labels_path = DATASET_DIR / f"{split}-labels-idx1-ubyte.gz"
    for path in (images_path, labels_path):
        if not path.is_file():
            sys.exit(f"error: {path} is missing; install the data with "
                     "`apt-get install -y dataset-fashion-mnist` (as root)")
    return read_idx(images_path), read_idx(labels_path)


def to_tensor(images: np.ndarray, mean: float, std: float) -> torch.Tensor:
    """Applies the sample's preprocessing: uint8 -> /255 -> (x - mean) / std, NCHW."""
    scaled = torch.from_numpy(images.astype(np.float32) / 255.0)
    return ((scaled - mean) / std).unsqueeze(1)


def configure_determinism() -> None:
    torch.manual_seed(SEED)
    torch.set_num_threads(2)
    torch.use_deterministic_algorithms(True)


def train(model: nn.Module, inputs: torch.Tensor, labels: torch.Tensor, epochs: int) -> list[dict]:
    """Trains with Adam and cross-entropy; returns per-epoch loss and train accuracy."""
    optimizer = torch.optim.Adam(model.parameters(), lr=LEARNING_RATE)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(
        optimizer, LEARNING_RATE, total_steps=epochs * _batch_count(len(labels)))
    shuffle = torch.Generator().manual_seed(SEED)
    history = []
    for epoch in range(1, epochs + 1):
        model.train()
        started = time.perf_counter()
        loss_sum, correct = 0.0, 0
        for batch in torch.randperm(len(labels), generator=shuffle).split(BATCH_SIZE):
            logits = model(inputs[batch])
            loss = nn.functional.cross_entropy(logits, labels[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            scheduler.step()
            loss_sum += loss.item() * len(batch)
            correct += int((logits.argmax(1) == labels[batch]).sum())
        history.append({"epoch": epoch, "loss": round(loss_sum / len(labels), 4),
                        "train_accuracy": round(correct / len(labels), 4),
                        "seconds": round(time.perf_counter() - started, 1)})
    return history


def _batch_count(sample_count: int) -> int:
    return -(-sample_count // BATCH_SIZE)


@torch.no_grad()
def torch_predictions(model: nn.Module, inputs: torch.Tensor) -> np.ndarray:
    model.eval()
    return torch.cat([model(chunk).argmax(1) for chunk in inputs.split(1000)]).numpy()


def onnx_predictions(model_path: Path, inputs: torch.Tensor) -> np.ndarray:
    """Runs the exported model one image at a time (its batch dimension is a static 1)."""
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 2
    session = onnxruntime.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])
    images = inputs.numpy()
    return np.array([session.run(None, {INPUT_NAME: images[i: i + 1]})[0].argmax() for i in range(len(images))])


def export_onnx(model: nn.Module, path: Path) -> None:
    """Exports in eval mode, batch 1 static, weights embedded, BatchNormalization kept unfolded."""
    model.eval()
    with warnings.catch_warnings():
        # The legacy exporter is chosen on purpose: it is the one that can leave BatchNorm unfolded.
        warnings.filterwarnings("ignore", "You are using the legacy TorchScript", DeprecationWarning)
        torch.onnx.export(
            model, (torch.zeros(1, 1, 28, 28),), str(path), dynamo=False, do_constant_folding=False,
            opset_version=OPSET, input_names=[INPUT_NAME], output_names=[OUTPUT_NAME],
        )
    check_onnx(path)


def check_onnx(path: Path) -> dict[str, int]:
    """Validates the exported file and returns its op-type counts."""
    proto = onnx.load(str(path))
    onnx.checker.check_model(proto, full_check=True)
    op_counts: dict[str, int] = {}
    for node in proto.graph.node:
        op_counts[node.op_type] = op_counts.get(node.op_type, 0) + 1
    if op_counts.get("BatchNormalization", 0) != 3:
        raise RuntimeError(f"expected 3 BatchNormalization nodes in {path}, found {op_counts}")
    input_dims = [d.dim_value for d in proto.graph.input[0].type.tensor_type.shape.dim]
    if input_dims != [1, 1, 28, 28] or any(t.data_location == onnx.TensorProto.EXTERNAL
                                             for t in proto.graph.initializer):
        raise RuntimeError(f"{path}: input must be static 1x1x28x28 with embedded weights")
    return op_counts


def pick_balanced(labels: np.ndarray, count: int, seed: int) -> list[int]:
    """Picks ``count`` indices, cycling over the classes so they differ in count by at most one."""
    rng = np.random.default_rng(seed)
    per_class = [rng.permutation(np.flatnonzero(labels == c)) for c in range(len(CLASS_NAMES))]
    return [int(per_class[i % len(per_class)][i // len(per_class)]) for i in range(count)]


def write_images(folder: Path, images: np.ndarray, labels: np.ndarray, indices: list[int]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for stale in folder.glob("*.png"):
        stale.unlink()
    for position, index in enumerate(indices):
        name = f"{position:03d}_{CLASS_SLUGS[labels[index]]}.png"
        Image.fromarray(images[index], mode="L").save(folder / name, optimize=True)


def write_readme(out: Path, log: dict) -> None:
    text = README_TEMPLATE.format(
        mean=log["normalization"]["mean"], std=log["normalization"]["std"],
        epochs=log["epochs"], seconds=log["train_seconds"], torch=log["versions"]["torch"],
        torch_acc=100 * log["test_accuracy_torch"], onnx_acc=100 * log["test_accuracy_onnxruntime"],
        agree=log["prediction_agreement"], batch=BATCH_SIZE, lr=LEARNING_RATE, seed=SEED,
        ops=", ".join(f"{op} x{n}" for op, n in sorted(log["onnx_op_counts"].items())),
        calib=CALIBRATION_COUNT, tries=TRY_COUNT, size_kb=log["model_bytes"] / 1024,
    )
    (out / "README.md").write_text(text)


README_TEMPLATE = """\
# fashion_cnn — bundled sample model

A small convolutional classifier for [Fashion-MNIST](https://github.com/zalandoresearch/fashion-mnist)
(28x28 grayscale pictures of clothing, 10 classes), trained on CPU by `scripts/train_sample.py`.
It is the quick-start model of qb Studio: small enough to compile, quantize and simulate in seconds,
and real enough that accuracy before and after quantization means something.

## Files
| file | what |
|---|---|
| `model.onnx` | the network, opset 17, FP32, weights embedded ({size_kb:.0f} KB) |
| `labels.txt` | the 10 class names, one per line, in logit order |
| `calib/` | {calib} calibration images from the Fashion-MNIST **train** set, balanced over the classes |
| `test/` | {tries} other images from the **test** set, for trying `run`; the name holds the true label |
| `train_log.json` | epochs, losses, training time, measured accuracies |

## Model
- Input `image`: float32 `[1, 1, 28, 28]` (NCHW, batch 1 static). Output `logits`: float32 `[1, 10]`.
- Three stages of Conv 3x3 (pad 1, no bias) + BatchNormalization + ReLU + MaxPool 2
  (1->16->32->64 channels, 28->14->7->3), then Flatten, Gemm 576->64, ReLU, Gemm 64->10.
  Dropout (p=0.25) was used in training; being an identity at inference it is not in the graph.
- Exported in eval mode with the TorchScript exporter and `do_constant_folding=False`, so the
  three BatchNormalization nodes are **not** folded into the convolutions: that is left to the compiler.
- Ops: {ops}.

## Preprocessing
1. Gray uint8 image, 28x28 (white garment on black, as in the dataset).
2. `x = pixel / 255` (float32).
3. `x = (x - {mean:.4f}) / {std:.4f}` — the mean ({mean:.6f}) and standard deviation ({std:.6f}) of
   all 60,000 training images, measured on the /255 values.
4. Shape `[1, 1, 28, 28]`.

## Training
Full train set (60,000 images), {epochs} epochs, Adam with a one-cycle schedule peaking at lr {lr},
batch {batch}, cross-entropy, seed {seed}, deterministic algorithms, 2 CPU threads, torch {torch}.
Training took {seconds:.0f} s.

## Measured accuracy (all 10,000 test images, FP32)
| runtime | top-1 |
|---|---|
| PyTorch | {torch_acc:.2f} % |
| onnxruntime on `model.onnx` | {onnx_acc:.2f} % |

The two runtimes agree on the predicted class for {agree:,} of the 10,000 images.

Regenerate (deterministic, same `model.onnx` bytes on the same versions):
`apt-get install -y dataset-fashion-mnist && python scripts/train_sample.py --out resources/samples/fashion_cnn`.
"""


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="output folder, e.g. resources/samples/fashion_cnn")
    parser.add_argument("--epochs", type=int, default=3, help="training epochs (default 3)")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    configure_determinism()
    train_images, train_labels = load_split("train")
    test_images, test_labels = load_split("t10k")
    mean = float(train_images.mean() / 255.0)
    std = float((train_images / 255.0).std())
    train_inputs, test_inputs = to_tensor(train_images, mean, std), to_tensor(test_images, mean, std)

    model = FashionCNN()
    started = time.perf_counter()
    history = train(model, train_inputs, torch.from_numpy(train_labels.astype(np.int64)), args.epochs)
    train_seconds = time.perf_counter() - started

    args.out.mkdir(parents=True, exist_ok=True)
    model_path = args.out / "model.onnx"
    export_onnx(model, model_path)
    torch_predicted = torch_predictions(model, test_inputs)
    onnx_predicted = onnx_predictions(model_path, test_inputs)
    agreement = int((torch_predicted == onnx_predicted).sum())
    if agreement != len(test_labels):
        raise RuntimeError(f"torch and onnxruntime disagree on {len(test_labels) - agreement} test images")

    write_images(args.out / "calib", train_images, train_labels,
                 pick_balanced(train_labels, CALIBRATION_COUNT, SEED))
    write_images(args.out / "test", test_images, test_labels, pick_balanced(test_labels, TRY_COUNT, SEED + 1))
    (args.out / "labels.txt").write_text("\n".join(CLASS_NAMES) + "\n")
    log = {
        "dataset": "Fashion-MNIST (dataset-fashion-mnist, Debian)",
        "epochs": args.epochs, "batch_size": BATCH_SIZE, "optimizer": "Adam, one-cycle",
        "learning_rate": LEARNING_RATE, "seed": SEED, "train_seconds": round(train_seconds, 1),
        "history": history,
        "normalization": {"mean": round(mean, 6), "std": round(std, 6)},
        "test_images": len(test_labels),
        "test_accuracy_torch": round(float((torch_predicted == test_labels).mean()), 4),
        "test_accuracy_onnxruntime": round(float((onnx_predicted == test_labels).mean()), 4),
        "prediction_agreement": agreement,
        "onnx_op_counts": check_onnx(model_path), "model_bytes": model_path.stat().st_size,
        "versions": {"torch": torch.__version__, "onnx": onnx.__version__,
                     "onnxruntime": onnxruntime.__version__, "python": platform.python_version()},
    }
    (args.out / "train_log.json").write_text(json.dumps(log, indent=2) + "\n")
    write_readme(args.out, log)
    print(f"{args.epochs} epochs in {train_seconds:.0f} s; test accuracy torch "
          f"{log['test_accuracy_torch']:.2%}, onnxruntime {log['test_accuracy_onnxruntime']:.2%}; "
          f"wrote {args.out}")


if __name__ == "__main__":
    main()
