#!/usr/bin/env python3
"""PyTorch reference for bench/precision_bench.cpp: the same model, batch, optimizer (SGD,
Nesterov momentum 0.9, weight decay 5e-4 except on BatchNorm) and precision, one JSON line.

Precisions (as in the C++ driver):
  fp32      TF32 off for matmuls and cuDNN       tf32   TF32 on for both
  o1_bf16   torch.autocast(device, bfloat16)     o1_fp16  torch.autocast(float16) + GradScaler
  o2_bf16 / o2_fp16  Apex's O2 recipe written out (Apex is not installed): the model cast to
            the low precision except BatchNorm, float32 master copies that the optimizer
            updates, inputs cast down and logits cast up, gradients copied up to the masters
            (unscaled by a GradScaler for fp16), masters copied down after the step.

--memory (CPU) measures like the C++ driver: RSS at the start of one extra step (after
zero_grad(set_to_none)), and the peak RSS above it (VmHWM, reset via /proc/self/clear_refs)
after the forward and after the whole step; run under the same glibc tunables (set by
bench/run_precision_bench.sh). Parameter/master/gradient/optimizer-state bytes are summed
from the tensors.

--channels-last puts the model's 4-d weights and the images in channels-last memory format;
--compile runs the model through torch.compile (default mode; its compilation happens in the
warm-up steps, which must be at least 2; the warm-up's seconds are reported as
warmup_seconds).
--profile PATH: after the timed steps, --profile-steps more (default 3) under torch.profiler
(CPU and, on CUDA, the GPU's kernels), written to PATH as a Chrome trace;
bench/kernel_profile_table.py compares it with precision_bench's.
On CUDA the result also holds the allocator's peak over the timed steps and the training
FLOPs per image counted by torch.utils.flop_counter (forward + backward of one step).

Usage: precision_reference.py MODEL [--precision P] [--device cpu|cuda] [--batch N]
                              [--threads T] [--warmup W] [--steps S] [--memory]
                              [--channels-last] [--compile] [--profile PATH]
                              [--profile-steps K]
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
import torchvision

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_throughput_reference import param_groups, resnet, small_cnn  # noqa: E402


def defaults(model, cuda):
    small = model == "small_cnn"
    return {
        "batch": (512 if small else 128) if cuda else (128 if small else 16),
        "warmup": 10 if cuda else (3 if small else 1),
        "steps": 50 if cuda else (10 if small else 2),
    }


def status_kb(name):
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(name + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {name} in /proc/self/status")


def reset_peak_rss():
    with open("/proc/self/clear_refs", "w") as clear_refs:
        clear_refs.write("5")


def nbytes(tensor):
    return 0 if tensor is None else tensor.numel() * tensor.element_size()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model", choices=["small_cnn", "resnet18", "resnet50", "vit_b16"])
    parser.add_argument("--precision", default="fp32",
                        choices=["fp32", "tf32", "o1_bf16", "o2_bf16", "o1_fp16", "o2_fp16"])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--batch", type=int)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--warmup", type=int)
    parser.add_argument("--steps", type=int)
    parser.add_argument("--memory", action="store_true")
    parser.add_argument("--channels-last", action="store_true")
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--profile")
    parser.add_argument("--profile-steps", type=int, default=3)
    args = parser.parse_args()
    cuda = args.device == "cuda"
    d = defaults(args.model, cuda)
    batch, warmup, steps = args.batch or d["batch"], args.warmup or d["warmup"], args.steps or d["steps"]

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    tf32 = args.precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    device = torch.device(args.device)

    if args.model == "small_cnn":
        shape, num_classes = (batch, 1, 28, 28), 10
    elif args.model == "resnet18":
        shape, num_classes = (batch, 3, 32, 32), 10
    else:
        shape, num_classes = (batch, 3, 224, 224), 1000
    images = torch.randn(shape).to(device)
    labels = torch.randint(0, num_classes, (batch,), dtype=torch.long).to(device)
    if args.model == "small_cnn":
        model = small_cnn()
    elif args.model == "resnet18":
        model = resnet(18, cifar_stem=True)
    elif args.model == "resnet50":
        model = torchvision.models.resnet50(num_classes=1000)
    else:
        model = torchvision.models.vit_b_16(num_classes=1000)
    model.to(device).train()
    if args.channels_last:
        model.to(memory_format=torch.channels_last)
        images = images.contiguous(memory_format=torch.channels_last)
    num_parameters = sum(p.numel() for p in model.parameters())

    level, _, dtype_name = args.precision.partition("_")
    low = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(dtype_name)
    o1, o2 = level == "o1", level == "o2"
    groups = param_groups(model, 0.05, 5e-4)
    masters = {}  # model param -> float32 master (O2, low-precision params only)
    if o2:
        for module in model.modules():
            if isinstance(module, nn.modules.batchnorm._BatchNorm):
                continue
            for param in module.parameters(recurse=False):
                param.data = param.data.to(low)
            for buffer in module.buffers(recurse=False):
                if buffer.is_floating_point():
                    buffer.data = buffer.data.to(low)
        for group in groups:
            replaced = []
            for param in group["params"]:
                if param.dtype != torch.float32:
                    masters[param] = param.detach().float().requires_grad_(True)
                    replaced.append(masters[param])
                else:
                    replaced.append(param)
            group["params"] = replaced
    optimizer = torch.optim.SGD(groups, lr=0.05, momentum=0.9, nesterov=True)
    scaler = torch.cuda.amp.GradScaler() if (cuda and low == torch.float16) else None
    if low == torch.float16 and not cuda:
        sys.exit("precision_reference: float16 needs --device cuda (no float16 CPU kernels)")

    last_loss = 0.0
    measured = {}

    def one_step(measure_memory):
        nonlocal last_loss
        optimizer.zero_grad(set_to_none=True)
        for param in masters:
            param.grad = None
        if measure_memory:
            base_kb = status_kb("VmRSS")
            reset_peak_rss()
        if o1:
            with torch.autocast(args.device, dtype=low):
                logits = model(images)
        elif o2:
            logits = model(images.to(low))
        else:
            logits = model(images)
        loss = F.cross_entropy(logits.float(), labels)
        last_loss = loss.item()
        if measure_memory:
            measured["forward_peak_bytes"] = (status_kb("VmHWM") - base_kb) * 1024
        (scaler.scale(loss) if scaler else loss).backward()
        for param, master in masters.items():
            master.grad = param.grad.float()
            param.grad = None
        if scaler:
            scaler.unscale_(optimizer)
        if measure_memory:
            measured["grad_bytes"] = sum(nbytes(p.grad) for p in model.parameters()) + sum(
                nbytes(m.grad) for m in masters.values())
        if scaler:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        with torch.no_grad():
            for param, master in masters.items():
                param.copy_(master)
        if measure_memory:
            measured["step_peak_bytes"] = (status_kb("VmHWM") - base_kb) * 1024

    def synchronize():
        if cuda:
            torch.cuda.synchronize()

    flops_per_image = None
    if cuda:  # counted on the eager model, before any compilation
        from torch.utils.flop_counter import FlopCounterMode
        with FlopCounterMode(display=False) as counter:
            one_step(False)
        flops_per_image = counter.get_total_flops() / batch
    if args.compile:
        model = torch.compile(model)
    synchronize()
    compile_start = time.perf_counter()
    for _ in range(warmup):
        one_step(False)
    synchronize()
    warmup_seconds = time.perf_counter() - compile_start
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    cpu_start = time.process_time()
    for _ in range(steps):
        one_step(False)
    synchronize()
    ms_per_step = (time.perf_counter() - start) * 1000.0 / steps
    cpu_ms_per_step = (time.process_time() - cpu_start) * 1000.0 / steps
    result = {
        "impl": "pytorch",
        "model": args.model,
        "precision": args.precision,
        "device": args.device,
        "batch": batch,
        "threads": args.threads,
        "steps": steps,
        "num_parameters": num_parameters,
        "ms_per_step": ms_per_step,
        "cpu_ms_per_step": cpu_ms_per_step,
        "images_per_sec": batch * 1000.0 / ms_per_step,
        "final_loss": last_loss,
        "channels_last": args.channels_last,
        "compiled": args.compile,
        "warmup_seconds": warmup_seconds,
    }
    if cuda:
        result["cuda_peak_allocated_bytes"] = torch.cuda.max_memory_allocated()
        result["training_flops_per_image"] = flops_per_image
    if args.memory and not cuda:
        one_step(True)
        result["param_bytes"] = sum(nbytes(p) for p in model.parameters()) + sum(
            nbytes(b) for b in model.buffers())
        result["master_bytes"] = sum(nbytes(m) for m in masters.values())
        result["optimizer_state_bytes"] = sum(
            nbytes(v) for state in optimizer.state.values() for v in state.values()
            if torch.is_tensor(v))
        result.update(measured)
    if args.profile:
        from torch.profiler import ProfilerActivity, profile
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        with profile(activities=activities) as prof:
            for _ in range(args.profile_steps):
                one_step(False)
            synchronize()
        prof.export_chrome_trace(args.profile)
        result["profile"] = args.profile
        result["profile_steps"] = args.profile_steps
    print(json.dumps(result))


if __name__ == "__main__":
    main()
