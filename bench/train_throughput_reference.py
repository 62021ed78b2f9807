#!/usr/bin/python3
"""PyTorch reference for bench/train_throughput_bench.cpp.

Builds the same model as Largo (same layers in the same order, same layouts, same parameter
count), the same optimizer setup (SGD, Nesterov momentum 0.9, weight decay 5e-4 except on
BatchNorm parameters), the same fixed batch (same generator, seed and draw order) and thread
count, runs the same step (zero_grad(set_to_none) -> forward -> cross-entropy -> loss.item()
-> backward -> step) and prints the same JSON line.

Usage: train_throughput_reference.py MODEL [--batch N] [--threads T] [--warmup W]
                                     [--steps S] [--foreach] [--phases]
  --foreach uses torch.optim.SGD(foreach=True) (multi-tensor kernels); without it, the
  default of PyTorch 1.13 on CPU (one update per parameter).
"""
import argparse
import json
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
import torchvision

# Keep in sync with the defaults in train_throughput_bench.cpp.
DEFAULTS = {
    "small_cnn": {"batch": 128, "warmup": 10, "steps": 100},
    "resnet18": {"batch": 16, "warmup": 2, "steps": 3},
}


class SmallCnnStage(nn.Module):
    """Mirrors largo::models::SmallCnnStageImpl (src/largo/models/small_cnn.cpp)."""

    def __init__(self, in_channels, out_channels, pooled_size, channels_last=True):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(out_channels)
        self.pooled_size = pooled_size
        self.channels_last = channels_last

    def forward(self, x):
        weight = self.conv.weight
        # Like Largo, contiguous(): for the 1-channel first stage it keeps the NCHW strides
        # (a [b, 1, h, w] tensor counts as channels-last contiguous), so that stage runs NCHW.
        if self.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
            weight = weight.contiguous(memory_format=torch.channels_last)
        x = F.conv2d(x, weight, None, 1, 1)
        x = F.max_pool2d(x, 2)
        x = self.bn(x).relu_()
        if self.pooled_size > 0:
            p = self.pooled_size
            if x.size(2) != p or x.size(3) != p:
                x = F.adaptive_avg_pool2d(x, (p, p))
            x = x.flatten(1)
        return x


class TrunkHead(nn.Module):
    """Mirrors largo::models::TrunkHeadModelImpl: parameters named trunk.<i>.* and head.*."""

    def __init__(self, trunk_blocks, head):
        super().__init__()
        self.trunk = nn.Sequential(*trunk_blocks)
        self.head = nn.Sequential(head)

    def forward(self, x):
        return self.head(self.trunk(x))


def small_cnn(channels=(16, 32, 64), pooled_size=3, in_channels=1, num_classes=10):
    blocks = []
    c = in_channels
    for i, out in enumerate(channels):
        last = i + 1 == len(channels)
        blocks.append(SmallCnnStage(c, out, pooled_size if last else 0))
        c = out
    return TrunkHead(blocks, nn.Linear(c * pooled_size * pooled_size, num_classes))


def resnet18_cifar(num_classes=10):
    """torchvision's ResNet-18 with the stem Largo's STEM: cifar builds (3x3 stride-1 conv1,
    no max pool). Same blocks, shapes and ops as Largo's BasicBlock trunk (NCHW).

    The weights are then drawn again in the order Largo's build_model draws them, so both
    sides start from the same weights and, running the same kernels, reach the same loss:
    a check that the two models really are the same."""
    state = torch.get_rng_state()
    net = torchvision.models.resnet18(num_classes=num_classes)
    net.conv1 = nn.Conv2d(3, 64, 3, stride=1, padding=1, bias=False)
    net.maxpool = nn.Identity()
    torch.set_rng_state(state)
    # Largo: each conv is constructed with libtorch's default init (in module order, which
    # is also torchvision's), then re-initialized like torchvision, then the head is built.
    convs = [m for m in net.modules() if isinstance(m, nn.Conv2d)]
    for conv in convs:
        conv.reset_parameters()
    for conv in convs:
        nn.init.kaiming_normal_(conv.weight, mode="fan_out", nonlinearity="relu")
    net.fc.reset_parameters()
    return net


def param_groups(model, lr, weight_decay):
    """Largo's build_param_groups with VISSL's defaults (regularize_bn False, regularize_bias
    True): trunk (decayed), trunk_no_wd (BatchNorm), head (decayed); empty groups dropped."""
    groups = {"trunk": [], "trunk_no_wd": [], "head": []}
    head_modules = {"fc", "head"}
    for module_name, module in model.named_modules():
        for _, param in module.named_parameters(recurse=False):
            in_head = module_name.split(".")[0] in head_modules
            is_bn = isinstance(module, nn.modules.batchnorm._BatchNorm)
            key = "head" if in_head else ("trunk_no_wd" if is_bn else "trunk")
            groups[key].append(param)
    return [
        {"params": params, "lr": lr, "weight_decay": 0.0 if key == "trunk_no_wd" else weight_decay}
        for key, params in groups.items()
        if params
    ]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model", choices=sorted(DEFAULTS))
    parser.add_argument("--batch", type=int)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--warmup", type=int)
    parser.add_argument("--steps", type=int)
    parser.add_argument("--foreach", action="store_true")
    parser.add_argument("--phases", action="store_true")
    args = parser.parse_args()
    defaults = DEFAULTS[args.model]
    batch = args.batch or defaults["batch"]
    warmup = args.warmup or defaults["warmup"]
    steps = args.steps or defaults["steps"]

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    if args.model == "small_cnn":
        shape = (batch, 1, 28, 28)
    else:
        shape = (batch, 3, 32, 32)
    images = torch.randn(shape)
    labels = torch.randint(0, 10, (batch,), dtype=torch.long)
    model = small_cnn() if args.model == "small_cnn" else resnet18_cifar()
    model.train()
    num_parameters = sum(p.numel() for p in model.parameters())
    optimizer = torch.optim.SGD(
        param_groups(model, 0.05, 5e-4),
        lr=0.05,
        momentum=0.9,
        nesterov=True,
        foreach=True if args.foreach else None,
    )

    timing = {"forward": 0.0, "backward": 0.0, "step": 0.0}
    last_loss = 0.0

    def one_step(time_phases):
        nonlocal last_loss
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(images), labels)
        last_loss = loss.item()
        if time_phases:
            now = time.perf_counter()
            timing["forward"] += now - start
            start = now
        loss.backward()
        if time_phases:
            now = time.perf_counter()
            timing["backward"] += now - start
            start = now
        optimizer.step()
        if time_phases:
            timing["step"] += time.perf_counter() - start

    for _ in range(warmup):
        one_step(False)
    start = time.perf_counter()
    cpu_start = time.process_time()  # CPU time of all threads, like std::clock() in C++
    for _ in range(steps):
        one_step(args.phases)
    ms_per_step = (time.perf_counter() - start) * 1000.0 / steps
    cpu_ms_per_step = (time.process_time() - cpu_start) * 1000.0 / steps

    result = {
        "impl": "pytorch_foreach" if args.foreach else "pytorch",
        "model": args.model,
        "batch": batch,
        "threads": args.threads,
        "steps": steps,
        "num_parameters": num_parameters,
        "ms_per_step": ms_per_step,
        "cpu_ms_per_step": cpu_ms_per_step,
        "images_per_sec": batch * 1000.0 / ms_per_step,
        "final_loss": last_loss,
    }
    if args.phases:
        for phase, seconds in timing.items():
            result[f"{phase}_ms"] = seconds * 1000.0 / steps
    print(json.dumps(result))


if __name__ == "__main__":
    main()
