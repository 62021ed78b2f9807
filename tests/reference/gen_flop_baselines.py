#!/usr/bin/env python3
"""Writes tests/models/baselines/flop_baselines.json: PyTorch's own count of each zoo model's
forward FLOPs, for tests/models/flop_count_test.cpp.

Run from the repository root with LARGO_PYTHON (scripts/torch_env.sh: the venv of
scripts/install_deps.sh, PyTorch 2.11, torchvision 0.26):
    $LARGO_PYTHON tests/reference/gen_flop_baselines.py

Each case builds the model in PyTorch (torchvision's ResNets with Largo's "cifar" stem and
layer-4 stride where asked; torchvision's RegNets, whose widths equal ClassyVision's for the
presets used here; the small CNN, the MLP and the ViT written out layer by layer
from their Largo headers), runs one forward pass on one image under torch.profiler with
with_flops=True, and records the FLOPs the profiler attributes to aten::conv2d
(convolutions), aten::addmm / aten::mm (Linear layers) and aten::bmm (attention matmuls):
2 per multiply-accumulate, no bias adds, the convention Largo's count documents. The C++ test
requires Largo's analytic count to equal these numbers exactly, per kind and in total.
"""

import json
import math
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
import torchvision
from torch.profiler import ProfilerActivity, profile
from torchvision.models.regnet import BlockParams, RegNet
from torchvision.models.resnet import BasicBlock, Bottleneck, ResNet

OUTPUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "models", "baselines",
                      "flop_baselines.json")

KINDS = {"aten::conv2d": "conv", "aten::addmm": "linear", "aten::mm": "linear",
         "aten::bmm": "attention"}

RESNET_LAYERS = {18: (BasicBlock, [2, 2, 2, 2]), 34: (BasicBlock, [3, 4, 6, 3]),
                 50: (Bottleneck, [3, 4, 6, 3]), 101: (Bottleneck, [3, 4, 23, 3]),
                 152: (Bottleneck, [3, 8, 36, 3]), 200: (Bottleneck, [3, 24, 36, 3])}


def resnet(depth, stem, num_classes, groups=1, width_per_group=64, layer4_stride=2,
           in_channels=3):
    block, layers = RESNET_LAYERS[depth]
    net = ResNet(block, layers, num_classes=num_classes, groups=groups,
                 width_per_group=width_per_group)
    if stem == "cifar":
        net.conv1 = nn.Conv2d(in_channels, 64, 3, stride=1, padding=1, bias=False)
        net.maxpool = nn.Identity()
    elif in_channels != 3:
        net.conv1 = nn.Conv2d(in_channels, 64, 7, stride=2, padding=3, bias=False)
    if layer4_stride == 1:  # VISSL's LAYER4_STRIDE: no downsampling in the last stage
        first = net.layer4[0]
        (first.conv2 if depth >= 50 else first.conv1).stride = (1, 1)
        first.downsample[0].stride = (1, 1)
    return net


class SmallCnn(nn.Module):
    """include/largo/models/small_cnn.h: per stage conv3x3 (no bias) -> max pool 2 -> BN ->
    ReLU; the last stage average-pools to pooled x pooled and flattens; Linear head."""

    def __init__(self, in_channels, channels, pooled, num_classes):
        super().__init__()
        convs, c = [], in_channels
        for out in channels:
            convs.append(nn.Conv2d(c, out, 3, padding=1, bias=False))
            c = out
        self.convs = nn.ModuleList(convs)
        self.bns = nn.ModuleList(nn.BatchNorm2d(conv.out_channels) for conv in convs)
        self.pooled = pooled
        self.head = nn.Linear(c * pooled * pooled, num_classes)

    def forward(self, x):
        for conv, bn in zip(self.convs, self.bns):
            x = bn(F.max_pool2d(conv(x), 2)).relu()
        return self.head(F.adaptive_avg_pool2d(x, self.pooled).flatten(1))


def mlp(in_features, hidden, num_classes):
    layers, f = [nn.Flatten()], in_features
    for h in hidden:
        layers += [nn.Linear(f, h), nn.ReLU()]
        f = h
    return nn.Sequential(*layers, nn.Linear(f, num_classes))


class VitLayer(nn.Module):
    """include/largo/models/vit.h's encoder layer (pre-norm, qkv Linear, explicit matmuls)."""

    def __init__(self, d, heads, mlp_dim, qkv_bias):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d, bias=qkv_bias)
        self.proj = nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, mlp_dim), nn.Linear(mlp_dim, d)

    def forward(self, x):
        b, t, d = x.shape
        qkv = self.qkv(self.norm1(x)).reshape(b, t, 3, self.heads, d // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)
        weights = torch.matmul(q / math.sqrt(d // self.heads), k.transpose(-2, -1)).softmax(-1)
        x = x + self.proj(torch.matmul(weights, v).transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


class Vit(nn.Module):
    def __init__(self, in_channels, image, patch, layers, heads, d, mlp_dim, classifier,
                 qkv_bias, num_classes):
        super().__init__()
        self.conv_proj = nn.Conv2d(in_channels, d, patch, stride=patch)
        n = (image // patch) ** 2 + (1 if classifier == "token" else 0)
        self.class_token = nn.Parameter(torch.zeros(1, 1, d)) if classifier == "token" else None
        self.pos = nn.Parameter(torch.zeros(1, n, d))
        self.layers = nn.Sequential(*[VitLayer(d, heads, mlp_dim, qkv_bias) for _ in range(layers)])
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, num_classes)

    def forward(self, x):
        x = self.conv_proj(x).flatten(2).transpose(1, 2)
        if self.class_token is not None:
            x = torch.cat([self.class_token.expand(x.size(0), -1, -1), x], 1)
        x = self.norm(self.layers(x + self.pos))
        return self.head(x[:, 0] if self.class_token is not None else x.mean(1))


def count(model, in_channels, image_size):
    model.eval()
    x = torch.randn(1, in_channels, image_size, image_size)
    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU], with_flops=True) as prof:
        model(x)
    flops = {"conv": 0, "linear": 0, "attention": 0}
    for event in prof.events():
        if event.name in KINDS and event.flops:
            flops[KINDS[event.name]] += event.flops
    flops["total"] = sum(flops.values())
    return flops


def cases():
    """(name, Largo ModelOptions fields, PyTorch model)"""
    out = []
    for depth in sorted(RESNET_LAYERS):
        for stem, size in (("imagenet", 224), ("cifar", 32)):
            options = {"trunk": "resnet", "in_channels": 3, "image_size": size,
                       "num_classes": 1000 if stem == "imagenet" else 10,
                       "resnet": {"depth": depth, "stem": stem}}
            out.append((f"resnet{depth}_{stem}_{size}", options,
                        resnet(depth, stem, options["num_classes"])))
    for name, extra in (("resnext50_32x4d", {"groups": 32, "width_per_group": 4}),
                        ("wide_resnet50_2", {"width_per_group": 128}),
                        ("resnet50_layer4_stride1", {"layer4_stride": 1})):
        options = {"trunk": "resnet", "in_channels": 3, "image_size": 224, "num_classes": 1000,
                   "resnet": {"depth": 50, "stem": "imagenet", **extra}}
        out.append((name, options, resnet(50, "imagenet", 1000, **extra)))
    # A 1-channel, odd-sized imagenet stem (28 -> 14 -> 7 -> ...): floor division everywhere.
    options = {"trunk": "resnet", "in_channels": 1, "image_size": 28, "num_classes": 10,
               "resnet": {"depth": 18, "stem": "imagenet"}}
    out.append(("resnet18_imagenet_28_gray", options, resnet(18, "imagenet", 10, in_channels=1)))

    # RegNets: presets whose torchvision widths are ClassyVision's (Largo's), and a small
    # explicit RegNetY on odd-sized maps (28 -> 14 -> 7 -> 4 -> 2 -> 1).
    for preset in ("regnet_y_400mf", "regnet_x_800mf"):
        options = {"trunk": "regnet", "in_channels": 3, "image_size": 224, "num_classes": 1000,
                   "regnet": {"name": preset}}
        out.append((f"{preset}_224", options, getattr(torchvision.models, preset)()))
    small = {"depth": 6, "w_0": 8, "w_a": 8.0, "w_m": 2.0, "group_width": 4, "stem_width": 8}
    options = {"trunk": "regnet", "in_channels": 3, "image_size": 28, "num_classes": 10,
               "regnet": small}
    params = BlockParams.from_init_params(depth=6, w_0=8, w_a=8.0, w_m=2.0, group_width=4,
                                          se_ratio=0.25)
    out.append(("regnet_small_se_28", options, RegNet(params, num_classes=10, stem_width=8)))

    for name, c, size, channels, pooled in (("small_cnn_fashion_mnist", 1, 28, [16, 32, 64], 3),
                                            ("small_cnn_cifar_wide", 3, 32, [32, 64, 128], 2)):
        options = {"trunk": "small_cnn", "in_channels": c, "image_size": size, "num_classes": 10,
                   "small_cnn": {"channels": channels, "pooled_size": pooled}}
        out.append((name, options, SmallCnn(c, channels, pooled, 10)))

    for name, c, size, hidden in (("mlp_default", 1, 28, [512, 256]),
                                  ("mlp_wide", 3, 32, [2048, 2048, 2048])):
        options = {"trunk": "mlp", "in_channels": c, "image_size": size, "num_classes": 10,
                   "mlp": {"hidden_dims": hidden}}
        out.append((name, options, mlp(c * size * size, hidden, 10)))

    for name, size, patch, layers, heads, d, mlp_dim, classifier, qkv_bias, classes in (
            ("vit_tiny_32", 32, 4, 4, 4, 128, 256, "token", False, 10),
            ("vit_small_32_gap", 32, 4, 6, 6, 384, 1536, "gap", True, 10),
            ("vit_b16_224", 224, 16, 12, 12, 768, 3072, "token", False, 1000)):
        options = {"trunk": "vision_transformer", "in_channels": 3, "image_size": size,
                   "num_classes": classes,
                   "vit": {"patch_size": patch, "num_layers": layers, "num_heads": heads,
                           "hidden_dim": d, "mlp_dim": mlp_dim, "classifier": classifier,
                           "qkv_bias": qkv_bias}}
        out.append((name, options, Vit(3, size, patch, layers, heads, d, mlp_dim, classifier,
                                       qkv_bias, classes)))
    return out


def main():
    torch.manual_seed(0)
    torch.set_num_threads(1)
    entries = []
    for name, options, model in cases():
        flops = count(model, options["in_channels"], options["image_size"])
        entries.append({"name": name, "options": options, "forward_flops": flops})
        print(f"{name:28} {flops['total'] / 1e9:10.4f} GFLOP forward per sample")
    with open(OUTPUT, "w") as f:
        json.dump({"_generated_by": "tests/reference/gen_flop_baselines.py",
                   "_note": "GENERATED FILE, do not edit. Regenerate with $LARGO_PYTHON "
                            "tests/reference/gen_flop_baselines.py",
                   "torch_version": torch.__version__,
                   "torchvision_version": torchvision.__version__,
                   "cases": entries}, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
