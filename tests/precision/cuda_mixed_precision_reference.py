#!/usr/bin/env python3
"""PyTorch reference for tests/precision/mixed_precision_against_pytorch_test.cpp: a small
CNN (two convolutions with BatchNorm2d, a Linear head) trained for 50 steps of SGD on one
fixed batch, in three modes, on one device:

  o1_fp16  torch.autocast(float16) + torch.amp.GradScaler. init_scale 2^24 makes the first
           steps overflow (skipped, the scale halves each time); growth_interval 10 makes the
           scale grow again within the 50 steps (and overflow again when it grows too far).
  o2_fp16  Apex's O2 written out (as bench/precision_reference.py does; Apex is not
           installed): the model cast to float16 except BatchNorm, float32 master weights
           that the optimizer updates, inputs cast down and logits cast up, gradients copied
           up to the masters and unscaled by the same kind of GradScaler, masters copied down
           after the step.
  o1_bf16  torch.autocast(bfloat16), no loss scaling.

Weights and data come from closed-form formulas (no RNG) and are written to OUTDIR as raw
little-endian float32 / int64 files, listed in OUTDIR/manifest.json, so that the C++ test
reads exactly these tensors. Results go to OUTDIR/reference.json: per mode and step the loss,
the loss scale before and after the step, whether the step was skipped (inf/NaN found), and
(a diagnostic the test prints only when the skipped steps differ) the largest finite scaled
gradient seen at a module output or parameter.

With --device cuda (the default) the C++ Cuda tests read OUTDIR through
LARGO_CUDA_REFERENCE_DIR; the C++ CPU test runs this script with --device cpu itself. Python:
the PyTorch 2.11 Largo builds against ($LARGO_PYTHON after `source scripts/torch_env.sh`).

Usage: cuda_mixed_precision_reference.py OUTDIR [--device cuda|cpu]
"""
import argparse
import json
import math
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

STEPS = 50
BATCH = 32
IMAGE_SIZE = 16
NUM_CLASSES = 10
LR = 0.05
MOMENTUM = 0.9
INIT_SCALE = 2.0**24
GROWTH_INTERVAL = 10


def make_model():
    # The C++ test builds the same torch::nn::Sequential: the names ("0.weight", "1.bias", ...)
    # and the order of parameters and buffers are the same.
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1, bias=False),  # [B, 8, 16, 16]
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.Conv2d(8, 16, 3, stride=2, padding=1, bias=False),  # [B, 16, 8, 8]
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),  # [B, 16]
        nn.Linear(16, NUM_CLASSES),
    )


def formula(numel, k):
    # Values in [-1, 1], computed in float64 and rounded once to float32.
    i = torch.arange(numel, dtype=torch.float64)
    return torch.sin(1.3 * i + 0.7 * k + 0.1)


def initial_state(model):
    """Every parameter and buffer as float32 (BatchNorm: weight 1, bias 0, running stats 0/1)."""
    state = {}
    for k, (name, param) in enumerate(model.named_parameters()):
        if param.dim() > 1:  # convolution and linear weights: uniform-ish, 1/sqrt(fan_in)
            fan_in = param[0].numel()
            values = formula(param.numel(), k) / math.sqrt(fan_in)
        elif name.startswith("8."):  # the Linear bias
            values = 0.1 * formula(param.numel(), k)
        else:  # BatchNorm weight and bias keep their defaults
            values = param.detach().double().flatten()
        state[name] = values.float().reshape(param.shape)
    return state


def batch():
    images = formula(BATCH * 3 * IMAGE_SIZE * IMAGE_SIZE, 100).float()
    images = images.reshape(BATCH, 3, IMAGE_SIZE, IMAGE_SIZE)  # [B, 3, 16, 16]
    labels = torch.arange(BATCH, dtype=torch.int64) % NUM_CLASSES  # [B]
    return images, labels


def write_inputs(outdir):
    model = make_model()
    files = {}

    def save(name, tensor):
        filename = name + ".bin"
        tensor.contiguous().numpy().tofile(os.path.join(outdir, filename))
        files[name] = {"file": filename, "dtype": str(tensor.dtype).replace("torch.", ""),
                       "shape": list(tensor.shape)}

    for name, tensor in initial_state(model).items():
        save("param." + name, tensor)
    images, labels = batch()
    save("images", images)
    save("labels", labels)
    return files


def run(mode, device):
    torch.manual_seed(0)  # unused by the formulas; keeps anything else fixed
    model = make_model()
    with torch.no_grad():
        for name, value in initial_state(model).items():
            model.get_parameter(name).copy_(value)
    model.to(device).train()
    images, labels = (t.to(device) for t in batch())

    low = torch.bfloat16 if mode.endswith("bf16") else torch.float16
    o2 = mode.startswith("o2")
    masters = {}  # model param -> float32 master
    params = list(model.parameters())
    if o2:
        for module in model.modules():
            if isinstance(module, nn.modules.batchnorm._BatchNorm):
                continue
            for param in module.parameters(recurse=False):
                param.data = param.data.to(low)
            for buffer in module.buffers(recurse=False):
                if buffer.is_floating_point():
                    buffer.data = buffer.data.to(low)
        params = []
        for param in model.parameters():
            if param.dtype != torch.float32:
                masters[param] = param.detach().float().requires_grad_(True)
                params.append(masters[param])
            else:
                params.append(param)
    # foreach: the same ATen ops on every device (the C++ test's SGD uses them too).
    optimizer = torch.optim.SGD(params, lr=LR, momentum=MOMENTUM, foreach=True)
    scaler = None
    if low == torch.float16:
        scaler = torch.amp.GradScaler(device.type, init_scale=INIT_SCALE,
                                      growth_interval=GROWTH_INTERVAL)

    # Diagnostic only (the C++ test does not compare it): the largest |gradient| reaching a
    # module output or a parameter (O1: the float16 weight copies' gradients, cast up exactly)
    # in each backward, scale included. On a step that did not overflow,
    # 65504 / this is how far float16 was from overflowing: near 1, a kernel's rounding could
    # tip the step the other way, and the scale sequences could part.
    largest = []

    def seen(grad):
        finite = grad[torch.isfinite(grad)]
        largest.append(finite.abs().max().item() if finite.numel() else 0.0)

    def watch(module, inputs, output):
        if output.requires_grad:
            output.register_hook(seen)

    for module in model:
        module.register_forward_hook(watch)

    record = {"losses": [], "scale_before": [], "scale_after": [], "skipped": [],
              "largest_scaled_grad": []}
    for _ in range(STEPS):
        largest.clear()
        optimizer.zero_grad(set_to_none=True)
        for param in masters:
            param.grad = None
        if o2:
            logits = model(images.to(low))
        else:
            with torch.autocast(device.type, dtype=low):
                logits = model(images)
        loss = F.cross_entropy(logits.float(), labels)
        record["losses"].append(loss.item())
        if scaler is None:
            loss.backward()
            for param, master in masters.items():
                master.grad = param.grad.float()
                param.grad = None
            optimizer.step()
            skipped = False
            scale_before = scale_after = 1.0
        else:
            scale_before = scaler.get_scale()
            scaler.scale(loss).backward()
            for param in model.parameters():
                seen(param.grad)
            for param, master in masters.items():
                master.grad = param.grad.float()
                param.grad = None
            scaler.unscale_(optimizer)
            found_inf = sum(v.item() for v in scaler._found_inf_per_device(optimizer).values())
            skipped = found_inf > 0
            scaler.step(optimizer)
            scaler.update()
            scale_after = scaler.get_scale()
        with torch.no_grad():
            for param, master in masters.items():
                param.copy_(master)
        record["scale_before"].append(scale_before)
        record["scale_after"].append(scale_after)
        record["skipped"].append(skipped)
        record["largest_scaled_grad"].append(max(largest))
    if o2:
        record["model_dtypes"] = {name: str(p.dtype).replace("torch.", "")
                                  for name, p in model.named_parameters()}
    return record


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("outdir")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("cuda_mixed_precision_reference: --device cuda but no CUDA device")
    device = torch.device(args.device)
    # The same switches as the C++ test: no TF32, deterministic cuDNN algorithms.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    os.makedirs(args.outdir, exist_ok=True)
    files = write_inputs(args.outdir)
    with open(os.path.join(args.outdir, "manifest.json"), "w") as out:
        json.dump(files, out, indent=1)
    result = {
        "generator": "tests/precision/cuda_mixed_precision_reference.py",
        "torch_version": torch.__version__,
        "device": args.device,
        "device_name": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
        "config": {"steps": STEPS, "lr": LR, "momentum": MOMENTUM, "init_scale": INIT_SCALE,
                   "growth_interval": GROWTH_INTERVAL},
        "modes": {mode: run(mode, device) for mode in ("o1_fp16", "o2_fp16", "o1_bf16")},
    }
    with open(os.path.join(args.outdir, "reference.json"), "w") as out:
        json.dump(result, out, indent=1)


if __name__ == "__main__":
    main()
