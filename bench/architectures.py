"""Published detector and classifier architectures, written as plain torch modules (random weights).

Latency does not depend on the weight values, so the cost-model benchmark (bench/cost_model.py)
builds these with random initialisation and exports them to ONNX. Written from the published
layer tables: ResNet-50 (He et al. 2016, v1.5 with the stride on the 3x3 convolution), YOLOv5n
(Ultralytics yolov5 v6 ``yolov5n.yaml``: depth 0.33, width 0.25) and YOLO11 s/m/l (Ultralytics
``yolo11.yaml`` with its scales). The YOLO heads end at the raw per-level box-distribution and class
maps, concatenated per anchor point (the anchor decoding is post-processing).
"""

from __future__ import annotations

import math

import torch
from torch import nn


def make_divisible(value: float, divisor: int = 8) -> int:
    """Round channels up to a multiple of ``divisor`` (as the Ultralytics model parser does)."""
    return int(math.ceil(value / divisor) * divisor)


class Conv(nn.Module):
    """Convolution + batch norm + SiLU (``act=False``: no activation)."""

    def __init__(self, c1: int, c2: int, k: int = 1, s: int = 1, p: int | None = None, g: int = 1, act: bool = True):
        super().__init__()
        self.conv = nn.Conv2d(c1, c2, k, s, k // 2 if p is None else p, groups=g, bias=False)
        self.bn = nn.BatchNorm2d(c2)
        self.act = nn.SiLU() if act else nn.Identity()

    def forward(self, x):
        return self.act(self.bn(self.conv(x)))


class Bottleneck(nn.Module):
    """Two convolutions with an optional residual."""

    def __init__(self, c1: int, c2: int, shortcut: bool = True, k=(3, 3), e: float = 0.5):
        super().__init__()
        hidden = int(c2 * e)
        self.cv1, self.cv2 = Conv(c1, hidden, k[0]), Conv(hidden, c2, k[1])
        self.add = shortcut and c1 == c2

    def forward(self, x):
        y = self.cv2(self.cv1(x))
        return x + y if self.add else y


class C3(nn.Module):
    """CSP bottleneck with three convolutions (YOLOv5); ``k`` is the bottlenecks' kernel."""

    def __init__(self, c1: int, c2: int, n: int = 1, shortcut: bool = True, e: float = 0.5, k=(1, 3)):
        super().__init__()
        hidden = int(c2 * e)
        self.cv1, self.cv2, self.cv3 = Conv(c1, hidden), Conv(c1, hidden), Conv(2 * hidden, c2)
        self.m = nn.Sequential(*(Bottleneck(hidden, hidden, shortcut, k, 1.0) for _ in range(n)))

    def forward(self, x):
        return self.cv3(torch.cat((self.m(self.cv1(x)), self.cv2(x)), 1))


class C3k2(nn.Module):
    """CSP bottleneck with two convolutions, every stage's output concatenated (YOLO11); ``c3k``: C3k stages."""

    def __init__(self, c1: int, c2: int, n: int = 1, c3k: bool = False, e: float = 0.5, shortcut: bool = True):
        super().__init__()
        self.c = int(c2 * e)
        self.cv1, self.cv2 = Conv(c1, 2 * self.c), Conv((2 + n) * self.c, c2)
        self.m = nn.ModuleList(C3(self.c, self.c, 2, shortcut, k=(3, 3)) if c3k else Bottleneck(self.c, self.c, shortcut)
                               for _ in range(n))

    def forward(self, x):
        y = list(self.cv1(x).chunk(2, 1))
        y.extend(m(y[-1]) for m in self.m)
        return self.cv2(torch.cat(y, 1))


class SPPF(nn.Module):
    """Spatial pyramid pooling, fast: three chained 5x5 max-pools."""

    def __init__(self, c1: int, c2: int, k: int = 5):
        super().__init__()
        hidden = c1 // 2
        self.cv1, self.cv2 = Conv(c1, hidden), Conv(hidden * 4, c2)
        self.m = nn.MaxPool2d(k, 1, k // 2)

    def forward(self, x):
        y = [self.cv1(x)]
        y.extend(self.m(y[-1]) for _ in range(3))
        return self.cv2(torch.cat(y, 1))


class Attention(nn.Module):
    """Multi-head self-attention over the pixels of a feature map, with a depthwise positional term."""

    def __init__(self, dim: int, num_heads: int, attn_ratio: float = 0.5):
        super().__init__()
        self.num_heads, self.head_dim = num_heads, dim // num_heads
        self.key_dim = int(self.head_dim * attn_ratio)
        self.scale = self.key_dim ** -0.5
        self.qkv = Conv(dim, dim + 2 * self.key_dim * num_heads, 1, act=False)
        self.proj, self.pe = Conv(dim, dim, 1, act=False), Conv(dim, dim, 3, 1, g=dim, act=False)

    def forward(self, x):
        b, c, h, w = x.shape
        q, k, v = self.qkv(x).view(b, self.num_heads, self.key_dim * 2 + self.head_dim, h * w).split(
            [self.key_dim, self.key_dim, self.head_dim], dim=2)
        attn = ((q.transpose(-2, -1) @ k) * self.scale).softmax(dim=-1)
        x = (v @ attn.transpose(-2, -1)).view(b, c, h, w) + self.pe(v.reshape(b, c, h, w))
        return self.proj(x)


class C2PSA(nn.Module):
    """CSP block with position-sensitive attention (YOLO11)."""

    def __init__(self, c1: int, n: int = 1):
        super().__init__()
        self.c = c1 // 2
        self.cv1, self.cv2 = Conv(c1, 2 * self.c), Conv(2 * self.c, c1)
        self.attn = nn.ModuleList(Attention(self.c, self.c // 64) for _ in range(n))
        self.ffn = nn.ModuleList(nn.Sequential(Conv(self.c, 2 * self.c), Conv(2 * self.c, self.c, act=False))
                                 for _ in range(n))

    def forward(self, x):
        a, b = self.cv1(x).split((self.c, self.c), dim=1)
        for attn, ffn in zip(self.attn, self.ffn):
            b = b + attn(b)
            b = b + ffn(b)
        return self.cv2(torch.cat((a, b), 1))


class Detect11(nn.Module):
    """YOLO11 head: per level a box branch (4 x 16 distribution bins) and a depthwise-separable class branch."""

    def __init__(self, channels: list[int], classes: int = 80, reg_max: int = 16):
        super().__init__()
        c2, c3 = max(16, channels[0] // 4, reg_max * 4), max(channels[0], min(classes, 100))
        self.box = nn.ModuleList(nn.Sequential(Conv(c, c2, 3), Conv(c2, c2, 3), nn.Conv2d(c2, 4 * reg_max, 1))
                                 for c in channels)
        self.cls = nn.ModuleList(nn.Sequential(Conv(c, c, 3, g=c), Conv(c, c3), Conv(c3, c3, 3, g=c3), Conv(c3, c3),
                                               nn.Conv2d(c3, classes, 1)) for c in channels)

    def forward(self, features):
        outs = [torch.cat((box(x), cls(x)), 1).flatten(2) for x, box, cls in zip(features, self.box, self.cls)]
        return torch.cat(outs, 2)


class Yolo11(nn.Module):
    """YOLO11 (``scale``: s, m or l)."""

    SCALES = {"s": (0.50, 0.50, 1024), "m": (0.50, 1.00, 512), "l": (1.00, 1.00, 512)}

    def __init__(self, scale: str):
        super().__init__()
        depth, width, max_channels = self.SCALES[scale]

        def ch(c):
            return make_divisible(min(c, max_channels) * width)

        def n(count):
            return max(round(count * depth), 1)

        big = scale in ("m", "l")
        self.b0, self.b1 = Conv(3, ch(64), 3, 2), Conv(ch(64), ch(128), 3, 2)
        self.b2 = C3k2(ch(128), ch(256), n(2), big, 0.25)
        self.b3 = Conv(ch(256), ch(256), 3, 2)
        self.b4 = C3k2(ch(256), ch(512), n(2), big, 0.25)
        self.b5 = Conv(ch(512), ch(512), 3, 2)
        self.b6 = C3k2(ch(512), ch(512), n(2), True)
        self.b7 = Conv(ch(512), ch(1024), 3, 2)
        self.b8 = C3k2(ch(1024), ch(1024), n(2), True)
        self.b9, self.b10 = SPPF(ch(1024), ch(1024)), C2PSA(ch(1024), n(2))
        self.up = nn.Upsample(scale_factor=2, mode="nearest")
        self.h13 = C3k2(ch(1024) + ch(512), ch(512), n(2), big)
        self.h16 = C3k2(ch(512) + ch(512), ch(256), n(2), big)
        self.h17 = Conv(ch(256), ch(256), 3, 2)
        self.h19 = C3k2(ch(256) + ch(512), ch(512), n(2), big)
        self.h20 = Conv(ch(512), ch(512), 3, 2)
        self.h22 = C3k2(ch(512) + ch(1024), ch(1024), n(2), True)
        self.detect = Detect11([ch(256), ch(512), ch(1024)])

    def forward(self, x):
        p3 = self.b4(self.b3(self.b2(self.b1(self.b0(x)))))
        p4 = self.b6(self.b5(p3))
        p5 = self.b10(self.b9(self.b8(self.b7(p4))))
        h13 = self.h13(torch.cat((self.up(p5), p4), 1))
        h16 = self.h16(torch.cat((self.up(h13), p3), 1))
        h19 = self.h19(torch.cat((self.h17(h16), h13), 1))
        h22 = self.h22(torch.cat((self.h20(h19), p5), 1))
        return self.detect([h16, h19, h22])


class Yolov5n(nn.Module):
    """YOLOv5n (v6.0 layout: 6x6 stem, C3 blocks, SPPF, PANet, anchor-based 1x1 heads)."""

    def __init__(self, classes: int = 80, anchors: int = 3):
        super().__init__()

        def ch(c):
            return make_divisible(c * 0.25)

        def n(count):
            return max(round(count * 0.33), 1)

        self.b0, self.b1 = Conv(3, ch(64), 6, 2, 2), Conv(ch(64), ch(128), 3, 2)
        self.b2, self.b3 = C3(ch(128), ch(128), n(3)), Conv(ch(128), ch(256), 3, 2)
        self.b4, self.b5 = C3(ch(256), ch(256), n(6)), Conv(ch(256), ch(512), 3, 2)
        self.b6, self.b7 = C3(ch(512), ch(512), n(9)), Conv(ch(512), ch(1024), 3, 2)
        self.b8, self.b9 = C3(ch(1024), ch(1024), n(3)), SPPF(ch(1024), ch(1024))
        self.h10, self.up = Conv(ch(1024), ch(512)), nn.Upsample(scale_factor=2, mode="nearest")
        self.h13, self.h14 = C3(ch(1024), ch(512), n(3), False), Conv(ch(512), ch(256))
        self.h17, self.h18 = C3(ch(512), ch(256), n(3), False), Conv(ch(256), ch(256), 3, 2)
        self.h20, self.h21 = C3(ch(512), ch(512), n(3), False), Conv(ch(512), ch(512), 3, 2)
        self.h23 = C3(ch(1024), ch(1024), n(3), False)
        self.heads = nn.ModuleList(nn.Conv2d(c, anchors * (classes + 5), 1) for c in (ch(256), ch(512), ch(1024)))

    def forward(self, x):
        p3 = self.b4(self.b3(self.b2(self.b1(self.b0(x)))))
        p4 = self.b6(self.b5(p3))
        h10 = self.h10(self.b9(self.b8(self.b7(p4))))
        h14 = self.h14(self.h13(torch.cat((self.up(h10), p4), 1)))
        h17 = self.h17(torch.cat((self.up(h14), p3), 1))
        h20 = self.h20(torch.cat((self.h18(h17), h14), 1))
        h23 = self.h23(torch.cat((self.h21(h20), h10), 1))
        return torch.cat([head(f).flatten(2) for head, f in zip(self.heads, (h17, h20, h23))], 2)


class ResNetBottleneck(nn.Module):
    """ResNet bottleneck (1x1, 3x3 with the stride, 1x1 x4) with ReLU and a projection shortcut."""

    def __init__(self, c1: int, width: int, stride: int):
        super().__init__()
        c2 = width * 4
        self.body = nn.Sequential(nn.Conv2d(c1, width, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
                                  nn.Conv2d(width, width, 3, stride, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
                                  nn.Conv2d(width, c2, 1, bias=False), nn.BatchNorm2d(c2))
        self.short = (nn.Sequential(nn.Conv2d(c1, c2, 1, stride, bias=False), nn.BatchNorm2d(c2))
                      if stride != 1 or c1 != c2 else nn.Identity())

    def forward(self, x):
        return torch.relu(self.body(x) + self.short(x))


class ResNet50(nn.Module):
    """ResNet-50 for 224 x 224 ImageNet classification."""

    def __init__(self, classes: int = 1000):
        super().__init__()
        layers, c1 = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(3, 2, 1)], 64
        for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
            for index in range(blocks):
                layers.append(ResNetBottleneck(c1, width, stride if index == 0 else 1))
                c1 = width * 4
        self.features = nn.Sequential(*layers)
        self.fc = nn.Linear(2048, classes)

    def forward(self, x):
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(self.features(x), 1), 1))
