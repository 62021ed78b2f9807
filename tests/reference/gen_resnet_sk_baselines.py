#!/usr/bin/env python3
"""Writes tests/models/baselines/resnet_sk_baselines.json (GENERATED FILE, do not edit) for
tests/models/resnet_sk_test.cpp.

Run from the repository root with LARGO_PYTHON (scripts/torch_env.sh: PyTorch 2.11):
    $LARGO_PYTHON tests/reference/gen_resnet_sk_baselines.py

The model below is a transcription of VISSL's resnet_sk trunk
(vissl/models/trunks/resnext_selective_kernels.py at 09270ed, SimCLRv2's ResNet with
selective kernels) written from its description: the same layers, the same module names
(so that the state_dict names are VISSL's), the same forward. VISSL builds depth 152 only
({3, 8, 36, 3} blocks); the cases here take fewer blocks per stage to stay small.

For each case: the state_dict's names and shapes in order; the parameter count; the
convolutions' forward FLOPs as torch.profiler counts them (with_flops, aten::conv2d, one
image); and the trunk's output on fixed images with every tensor of the state_dict set by
fill() below (the C++ test sets Largo's tensors by the same formula through the name
mapping), in float64, in eval mode (running statistics) and in train mode (batch
statistics): per image the sum, the sum of absolute values and every 61st channel.
"""

import json
import math
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

OUTPUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "models", "baselines",
                      "resnet_sk_baselines.json")

# "forward": whether the case records outputs (the wider one only its sizes and FLOPs).
CASES = [
    {"name": "sk_w1", "blocks": [1, 2, 1, 1], "width_multiplier": 1, "sk_ratio": 0.0625,
     "forward": True},
    {"name": "sk_w1_ratio_half", "blocks": [2, 1, 1, 1], "width_multiplier": 1,
     "sk_ratio": 0.5, "forward": True},
    {"name": "no_sk_w1", "blocks": [1, 1, 2, 1], "width_multiplier": 1, "sk_ratio": 0.0,
     "forward": True},
    {"name": "sk_w3", "blocks": [1, 1, 1, 1], "width_multiplier": 3, "sk_ratio": 0.0625,
     "forward": False},
]
IMAGE_SIZE = 32
CHANNEL_STRIDE = 61


def conv_layer(cin, cout, k=3, stride=1):
    return nn.Conv2d(cin, cout, k, stride=stride, padding=(k - 1) // 2, bias=False)


def bn_relu(c, relu=True):
    return nn.Sequential(nn.BatchNorm2d(c, eps=1e-5), nn.ReLU() if relu else nn.Identity())


class SelectiveKernel(nn.Module):
    def __init__(self, cin, cout, stride, ratio):
        super().__init__()
        self.main_conv = nn.Sequential(conv_layer(cin, 2 * cout, stride=stride),
                                       bn_relu(2 * cout))
        mid = max(int(cout * ratio), 32)
        self.mixing_conv = nn.Sequential(conv_layer(cout, mid, 1), bn_relu(mid),
                                         conv_layer(mid, 2 * cout, 1))

    def forward(self, x):
        halves = torch.stack(torch.chunk(self.main_conv(x), 2, dim=1), dim=0)
        pooled = halves.sum(dim=0).mean(dim=[2, 3], keepdim=True)
        mixing = torch.stack(torch.chunk(self.mixing_conv(pooled), 2, dim=1), dim=0)
        return (halves * F.softmax(mixing, dim=0)).sum(dim=0)


class Projection(nn.Module):
    def __init__(self, cin, cout, stride, ratio):
        super().__init__()
        if ratio > 0:
            self.shortcut = nn.Sequential(nn.ZeroPad2d((0, 1, 0, 1)),
                                          nn.AvgPool2d(2, stride=stride, padding=0),
                                          conv_layer(cin, cout, 1))
        else:
            self.shortcut = conv_layer(cin, cout, 1, stride)
        self.bn = bn_relu(cout, relu=False)

    def forward(self, x):
        return self.bn(self.shortcut(x))


class Bottleneck(nn.Module):
    def __init__(self, cin, c, stride, ratio, projection):
        super().__init__()
        self.projection = Projection(cin, 4 * c, stride, ratio) if projection else nn.Identity()
        layers = [conv_layer(cin, c, 1), bn_relu(c)]
        if ratio > 0:
            layers.append(SelectiveKernel(c, c, stride, ratio))
        else:
            layers += [conv_layer(c, c, stride=stride), bn_relu(c)]
        layers += [conv_layer(c, 4 * c, 1), bn_relu(4 * c, relu=False)]
        self.net = nn.Sequential(*layers)

    def forward(self, x):
        return F.relu(self.projection(x) + self.net(x))


class Stage(nn.Module):
    def __init__(self, count, cin, c, stride, ratio):
        super().__init__()
        self.blocks = nn.ModuleList([Bottleneck(cin, c, stride, ratio, True)] +
                                    [Bottleneck(4 * c, c, 1, ratio, False)
                                     for _ in range(count - 1)])

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


class ResNetSk(nn.Module):
    def __init__(self, blocks, w, ratio):
        super().__init__()
        half = 64 * w // 2
        if ratio > 0:
            stem = [conv_layer(3, half, stride=2), bn_relu(half), conv_layer(half, half),
                    bn_relu(half), conv_layer(half, 2 * half)]
        else:
            stem = [conv_layer(3, 2 * half, k=7, stride=2)]
        stem += [bn_relu(2 * half), nn.MaxPool2d(3, stride=2, padding=1)]
        layers = [nn.Sequential(*stem)]
        cin = 64 * w
        for i, count in enumerate(blocks):
            c = 64 * w * 2 ** i
            layers.append(Stage(count, cin, c, 1 if i == 0 else 2, ratio))
            cin = 4 * c
        self.net = nn.Sequential(*layers)

    def forward(self, x):
        return self.net(x).mean(dim=[2, 3])


def fill(name, tensor, index):
    """The value every tensor gets, by its VISSL name and its index in the state_dict."""
    n = tensor.numel()
    wave = torch.sin(torch.arange(n, dtype=torch.float64) * 0.37 + index)
    if name.endswith("running_mean") or name.endswith(".bias"):
        value = 0.1 * wave
    elif name.endswith("running_var"):
        value = 1.0 + 0.5 * wave * wave
    elif tensor.dim() == 1:  # BatchNorm weight
        value = 1.0 + 0.2 * wave
    else:  # conv weight: fan-in scaled
        value = wave * (1.5 / math.sqrt(n / tensor.shape[0]))
    return value.reshape(tensor.shape)


def images():
    n = 2 * 3 * IMAGE_SIZE * IMAGE_SIZE
    return torch.cos(torch.arange(n, dtype=torch.float64) * 0.05).reshape(
        2, 3, IMAGE_SIZE, IMAGE_SIZE)


def summary(output):
    return {"sum": output.sum(dim=1).tolist(), "abs_sum": output.abs().sum(dim=1).tolist(),
            "channels": output[:, ::CHANNEL_STRIDE].tolist()}


def conv_flops(model):
    with profile(activities=[ProfilerActivity.CPU], with_flops=True) as prof:
        with torch.no_grad():
            model(torch.zeros(1, 3, IMAGE_SIZE, IMAGE_SIZE))
    return sum(e.flops for e in prof.key_averages() if e.key == "aten::conv2d")


def case(spec):
    model = ResNetSk(spec["blocks"], spec["width_multiplier"], spec["sk_ratio"])
    flops = conv_flops(model.eval())
    sizes = dict(spec, image_size=IMAGE_SIZE, channel_stride=CHANNEL_STRIDE,
                 state_dict=[[name, list(t.shape)] for name, t in model.state_dict().items()],
                 parameter_count=sum(p.numel() for p in model.parameters()), conv_flops=flops)
    if not spec["forward"]:
        return sizes
    model = model.double()
    state = model.state_dict()
    with torch.no_grad():
        for index, (name, tensor) in enumerate(state.items()):
            if tensor.is_floating_point():
                tensor.copy_(fill(name, tensor, index))
    with torch.no_grad():
        eval_output = model.eval()(images())
        train_output = model.train()(images())
    return dict(sizes, output_width=eval_output.shape[1], eval=summary(eval_output),
                train=summary(train_output))


def main():
    torch.manual_seed(0)
    result = {"generated_by": "tests/reference/gen_resnet_sk_baselines.py",
              "torch": torch.__version__, "cases": [case(spec) for spec in CASES]}
    with open(OUTPUT, "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
