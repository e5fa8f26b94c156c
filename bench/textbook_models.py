"""Textbook architectures written in plain torch with random weights (seed 0), exported as users do.

For coverage of layer patterns the corpus's trained models lack, not for accuracy claims about trained weights:
a YOLOv8-style detector (SiLU, C2f split/concat, SPPF max-pool chain, nearest Resize, decoupled heads), UNet++
(nested dense skip Concats, bilinear Resize), a TCN (causal dilated Conv1d with weight norm), a Conformer (Conv2d
subsampling, macaron feed-forward, multi-head attention, GLU, depthwise Conv1d, BatchNorm1d) and a GPT-2-style
decoder (learned positions, causal attention, tanh GELU, tied LM head), and a spectrogram classifier (``torch.stft``
magnitudes, Conv1d, mean over time; only the dynamo exporter writes ``torch.stft``: ONNX STFT). Each is exported with torch's TorchScript
exporter (``dynamo=False``) or its dynamo exporter, at a given opset, with a dynamic batch dimension, and cached
under ``build/testdata/``. ``bench/probe_pip_models.py`` measures them (``TEXTBOOK_MODELS``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

EXAMPLES = {"yolo": (1, 3, 256, 256), "unetpp": (1, 3, 128, 128), "tcn": (1, 100, 40), "conformer": (1, 100, 80),
            "gpt": (1, 64), "stft": (1, 16000), "embbag": (1, 64), "bigru": (1, 100, 40), "tencoder": (1, 100, 40),
            "upsample": (1, 3, 128, 128)}
"""Example input shape per architecture (its static shape in the probe)."""
GPT_VOCAB = 512


def _modules():
    import torch
    from torch import nn
    from torch.nn import functional as F  # noqa: N812

    class ConvBNSiLU(nn.Sequential):
        def __init__(self, cin, cout, k=3, stride=1):
            super().__init__(nn.Conv2d(cin, cout, k, stride, k // 2, bias=False), nn.BatchNorm2d(cout), nn.SiLU())

    class C2f(nn.Module):
        def __init__(self, cin, cout, n=1):
            super().__init__()
            self.c = cout // 2
            self.cv1, self.cv2 = ConvBNSiLU(cin, 2 * self.c, 1), ConvBNSiLU((2 + n) * self.c, cout, 1)
            self.m = nn.ModuleList(nn.Sequential(ConvBNSiLU(self.c, self.c), ConvBNSiLU(self.c, self.c))
                                   for _ in range(n))

        def forward(self, x):
            y = list(self.cv1(x).chunk(2, 1))
            for block in self.m:
                y.append(y[-1] + block(y[-1]))
            return self.cv2(torch.cat(y, 1))

    class SPPF(nn.Module):
        def __init__(self, cin, cout):
            super().__init__()
            self.cv1, self.cv2, self.m = ConvBNSiLU(cin, cin // 2, 1), ConvBNSiLU(cin * 2, cout, 1), nn.MaxPool2d(5, 1, 2)

        def forward(self, x):
            x = self.cv1(x)
            a = self.m(x)
            b = self.m(a)
            return self.cv2(torch.cat([x, a, b, self.m(b)], 1))

    class TinyYolo(nn.Module):
        def __init__(self, classes=20):
            super().__init__()
            self.b1 = nn.Sequential(ConvBNSiLU(3, 16, 3, 2), ConvBNSiLU(16, 32, 3, 2), C2f(32, 32))
            self.b2 = nn.Sequential(ConvBNSiLU(32, 64, 3, 2), C2f(64, 64))
            self.b3 = nn.Sequential(ConvBNSiLU(64, 128, 3, 2), C2f(128, 128), SPPF(128, 128))
            self.n1, self.n2, self.n3, self.n4 = C2f(192, 64), C2f(96, 32), C2f(96, 64), C2f(192, 128)
            self.d1, self.d2 = ConvBNSiLU(32, 32, 3, 2), ConvBNSiLU(64, 64, 3, 2)
            self.heads = nn.ModuleList(nn.Sequential(ConvBNSiLU(c, 32), nn.Conv2d(32, 4 + classes, 1))
                                       for c in (32, 64, 128))

        def forward(self, x):
            p3 = self.b1(x)
            p4 = self.b2(p3)
            p5 = self.b3(p4)
            up = self.n1(torch.cat([F.interpolate(p5, scale_factor=2.0, mode="nearest"), p4], 1))
            o3 = self.n2(torch.cat([F.interpolate(up, scale_factor=2.0, mode="nearest"), p3], 1))
            o4 = self.n3(torch.cat([self.d1(o3), up], 1))
            o5 = self.n4(torch.cat([self.d2(o4), p5], 1))
            y = torch.cat([head(o).flatten(2) for head, o in zip(self.heads, (o3, o4, o5))], 2)
            return torch.cat([y[:, :4], y[:, 4:].sigmoid()], 1)

    def double_conv(cin, cout):
        return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(),
                             nn.Conv2d(cout, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU())

    class UNetPP(nn.Module):
        def __init__(self, widths=(16, 32, 64, 128), classes=2):
            super().__init__()
            self.depth, self.pool = len(widths), nn.MaxPool2d(2)
            self.cells = nn.ModuleDict()
            for i in range(self.depth):
                for j in range(self.depth - i):
                    cin = 3 if i == j == 0 else (widths[i - 1] if j == 0 else widths[i] * j + widths[i + 1])
                    self.cells[f"{i}_{j}"] = double_conv(cin, widths[i])
            self.final = nn.ModuleList(nn.Conv2d(widths[0], classes, 1) for _ in range(self.depth - 1))

        def forward(self, x):
            cells = {}
            for i in range(self.depth):
                cells[i, 0] = self.cells[f"{i}_0"](x if i == 0 else self.pool(cells[i - 1, 0]))
            for j in range(1, self.depth):
                for i in range(self.depth - j):
                    up = F.interpolate(cells[i + 1, j - 1], scale_factor=2.0, mode="bilinear", align_corners=False)
                    cells[i, j] = self.cells[f"{i}_{j}"](torch.cat([cells[i, k] for k in range(j)] + [up], 1))
            return sum(conv(cells[0, j]) for j, conv in zip(range(1, self.depth), self.final)) / (self.depth - 1)

    class TCN(nn.Module):
        def __init__(self, cin=40, width=64, levels=6, kernel=3, classes=10):
            super().__init__()
            self.kernel, norm = kernel, nn.utils.parametrizations.weight_norm
            self.blocks = nn.ModuleList(nn.ModuleDict({
                "c1": norm(nn.Conv1d(cin if level == 0 else width, width, kernel, dilation=2 ** level)),
                "c2": norm(nn.Conv1d(width, width, kernel, dilation=2 ** level)),
                "down": nn.Conv1d(cin, width, 1) if level == 0 else nn.Identity()}) for level in range(levels))
            self.head = nn.Conv1d(width, classes, 1)

        def forward(self, x):  # [B, T, mels]
            x = x.transpose(1, 2)
            for level, block in enumerate(self.blocks):
                pad = (self.kernel - 1) * 2 ** level
                y = F.relu(block["c1"](F.pad(x, (pad, 0))))
                y = F.relu(block["c2"](F.pad(y, (pad, 0))))
                x = F.relu(y + block["down"](x))
            return self.head(x).transpose(1, 2)

    class ConformerBlock(nn.Module):
        def __init__(self, d=144, heads=4, kernel=15):
            super().__init__()
            self.ff1 = nn.Sequential(nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.SiLU(), nn.Linear(4 * d, d))
            self.ln_att, self.att = nn.LayerNorm(d), nn.MultiheadAttention(d, heads, batch_first=True)
            self.ln_conv, self.pw1 = nn.LayerNorm(d), nn.Conv1d(d, 2 * d, 1)
            self.dw, self.bn = nn.Conv1d(d, d, kernel, padding=kernel // 2, groups=d), nn.BatchNorm1d(d)
            self.pw2 = nn.Conv1d(d, d, 1)
            self.ff2 = nn.Sequential(nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.SiLU(), nn.Linear(4 * d, d))
            self.ln = nn.LayerNorm(d)

        def forward(self, x):
            x = x + 0.5 * self.ff1(x)
            a = self.ln_att(x)
            x = x + self.att(a, a, a, need_weights=False)[0]
            c = F.glu(self.pw1(self.ln_conv(x).transpose(1, 2)), dim=1)
            x = x + self.pw2(F.silu(self.bn(self.dw(c)))).transpose(1, 2)
            return self.ln(x + 0.5 * self.ff2(x))

    class Conformer(nn.Module):
        def __init__(self, d=144, blocks=2, mels=80):
            super().__init__()
            self.sub = nn.Sequential(nn.Conv2d(1, d, 3, 2), nn.ReLU(), nn.Conv2d(d, d, 3, 2), nn.ReLU())
            self.proj = nn.Linear(d * (((mels - 1) // 2 - 1) // 2), d)
            self.blocks = nn.Sequential(*[ConformerBlock(d) for _ in range(blocks)])

        def forward(self, x):  # [B, T, mels]
            x = self.sub(x.unsqueeze(1))
            b, c, t, f = x.shape
            return self.blocks(self.proj(x.transpose(1, 2).reshape(b, t, c * f)))

    class TinyGPT(nn.Module):
        def __init__(self, vocab=GPT_VOCAB, d=128, layers=2, heads=4, context=64):
            super().__init__()
            self.heads = heads
            self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(context, d)
            self.layers = nn.ModuleList(nn.ModuleDict({
                "ln1": nn.LayerNorm(d), "qkv": nn.Linear(d, 3 * d), "proj": nn.Linear(d, d), "ln2": nn.LayerNorm(d),
                "fc": nn.Linear(d, 4 * d), "out": nn.Linear(4 * d, d)}) for _ in range(layers))
            self.lnf = nn.LayerNorm(d)

        def forward(self, ids):
            b, t = ids.shape
            x = self.wte(ids) + self.wpe(torch.arange(t, device=ids.device))[None]
            for layer in self.layers:
                q, k, v = (z.view(b, t, self.heads, -1).transpose(1, 2)
                           for z in layer["qkv"](layer["ln1"](x)).split(x.shape[-1], -1))
                attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                x = x + layer["proj"](attended.transpose(1, 2).reshape(b, t, -1))
                x = x + layer["out"](F.gelu(layer["fc"](layer["ln2"](x)), approximate="tanh"))
            return self.lnf(x) @ self.wte.weight.T

    class StftNet(nn.Module):
        def __init__(self, n_fft=512, hop=160, classes=8):
            super().__init__()
            self.n_fft, self.hop = n_fft, hop
            self.conv, self.head = nn.Conv1d(n_fft // 2 + 1, 64, 3, padding=1), nn.Linear(64, classes)
            self.register_buffer("window", torch.hann_window(n_fft))

        def forward(self, audio):  # [B, samples]
            spectrum = torch.stft(audio, self.n_fft, self.hop, window=self.window, return_complex=True).abs()
            return self.head(F.relu(self.conv(spectrum)).mean(2))

    class BagOfBytes(nn.Module):  # nn.EmbeddingBag (TorchScript's exporter writes a Loop over the bags)
        def __init__(self, vocab=GPT_VOCAB, d=64, classes=8):
            super().__init__()
            self.tokens, self.bag = nn.Embedding(vocab, d), nn.EmbeddingBag(vocab, d, mode="mean")
            self.head = nn.Linear(2 * d, classes)

        def forward(self, ids):
            return self.head(torch.cat([self.tokens(ids).amax(1), self.bag(ids)], 1))

    class BiGRU(nn.Module):  # bidirectional, batch_first
        def __init__(self, mels=40, hidden=48, classes=10):
            super().__init__()
            self.gru, self.head = nn.GRU(mels, hidden, batch_first=True, bidirectional=True), nn.Linear(2 * hidden, classes)

        def forward(self, x):
            return self.head(self.gru(x)[0])

    class TEncoder(nn.Module):  # nn.TransformerEncoder in eval mode (torch's fast path)
        def __init__(self, mels=40, d=64):
            super().__init__()
            self.embed = nn.Linear(mels, d)
            self.encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(d, 4, 128, dropout=0.0, batch_first=True), 2)

        def forward(self, x):
            return self.encoder(self.embed(x))

    class Upsample(nn.Module):  # F.interpolate(scale_factor=...) and channels_last weights
        def __init__(self):
            super().__init__()
            self.down, self.mid = nn.Conv2d(3, 16, 3, 2, 1), nn.Conv2d(16, 16, 3, padding=1, groups=16)
            self.out = nn.Conv2d(16, 2, 3, padding=1)

        def forward(self, x):
            y = F.relu(self.mid(F.relu(self.down(x))))
            return self.out(F.interpolate(y, scale_factor=2.0, mode="bilinear", align_corners=False))

    return {"yolo": TinyYolo, "unetpp": UNetPP, "tcn": TCN, "conformer": Conformer, "gpt": TinyGPT, "stft": StftNet,
            "embbag": BagOfBytes, "bigru": BiGRU, "tencoder": TEncoder, "upsample": Upsample}


def module(architecture: str):
    """The architecture with seed-0 random weights (BatchNorm statistics too), in eval mode."""
    import torch

    torch.manual_seed(0)
    net = _modules()[architecture]()
    with torch.no_grad():  # running statistics other than 0/1, as trained BatchNorms have
        for layer in net.modules():
            if isinstance(layer, torch.nn.modules.batchnorm._BatchNorm):
                layer.running_mean.uniform_(-0.2, 0.2)
                layer.running_var.uniform_(0.5, 2.0)
    return net.eval()


def export(architecture: str, exporter: str, opset: int, path: Path) -> None:
    """Write ``architecture`` to ``path`` with ``exporter`` (``torchscript`` or ``dynamo``), batch dynamic."""
    import torch

    shape = EXAMPLES[architecture]
    example = torch.randint(0, GPT_VOCAB, shape) if architecture in ("gpt", "embbag") else torch.from_numpy(
        np.random.default_rng(0).standard_normal(shape).astype(np.float32))
    net = module(architecture)
    if architecture == "upsample":  # as users move a vision model to channels_last for speed
        net, example = net.to(memory_format=torch.channels_last), example.to(memory_format=torch.channels_last)
    with torch.no_grad():
        if exporter == "dynamo":
            program = torch.onnx.export(net, (example,), dynamo=True, opset_version=opset, input_names=["x"],
                                        output_names=["y"],
                                        dynamic_shapes=({0: torch.export.Dim("batch", min=1, max=64)},))
            program.save(str(path), external_data=False)
        else:
            torch.onnx.export(net, (example,), str(path), dynamo=False, opset_version=opset, input_names=["x"],
                              output_names=["y"], dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}})
