#!/usr/bin/env python3
"""Optimizer step time over ResNet-50's parameters, PyTorch's side of
bench/run_optimizer_step_bench.sh (Largo's side: bench/optimizer_step_bench.cpp).

Usage: optimizer_step_reference.py PARAMS_JSON OPTIMIZER [--foreach] [--threads T]
                                   [--warmup W] [--steps S]
  PARAMS_JSON: the output of `optimizer_step_bench --describe` (names, shapes, which are
               decayed), so both sides step the same 161 tensors in the same groups.
  OPTIMIZER:   sgd (torch.optim.SGD, momentum 0.9), sgd_larc (Apex's LARC around it, clip
               mode), adamw (torch.optim.AdamW), lamb (tests/reference/reference_optimizers.py).
  --foreach:   the multi-tensor variants: torch.optim's foreach=True, and for LARC and LAMB
               the _foreach versions in reference_optimizers.py (PyTorch 2.11 has neither).

Parameters and gradients are drawn exactly as the C++ side draws them (manual_seed(0),
randn in parameter order); only step() is timed; the gradients are restored (untimed)
before every step. Prints one JSON line like the C++ side.
"""

import argparse
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "reference"))
from reference_optimizers import LAMB, LARC  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("params_json")
    parser.add_argument("optimizer", choices=["sgd", "sgd_larc", "adamw", "lamb"])
    parser.add_argument("--foreach", action="store_true")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    with open(args.params_json) as f:
        described = json.load(f)
    torch.manual_seed(0)
    params = [torch.randn(p["shape"]).requires_grad_() for p in described]
    grads = [torch.randn(p["shape"]) * 0.01 for p in described]
    groups = [
        dict(params=[p for p, d in zip(params, described) if d["decayed"]], weight_decay=1e-4),
        dict(params=[p for p, d in zip(params, described) if not d["decayed"]], weight_decay=0.0),
    ]
    name = args.optimizer
    lr = 1e-3 if name in ("adamw", "lamb") else 0.1
    if name in ("sgd", "sgd_larc"):
        optimizer = torch.optim.SGD(groups, lr=lr, momentum=0.9, foreach=args.foreach)
        if name == "sgd_larc":
            optimizer = LARC(optimizer, trust_coefficient=0.02, clip=True, foreach=args.foreach)
    elif name == "adamw":
        optimizer = torch.optim.AdamW(groups, lr=lr, foreach=args.foreach)
    else:
        optimizer = LAMB(groups, lr=lr, foreach=args.foreach)

    times_ms = []
    for step in range(args.warmup + args.steps):
        with torch.no_grad():
            for p, g in zip(params, grads):
                if p.grad is None:
                    p.grad = g.clone()
                else:
                    p.grad.copy_(g)
        start = time.perf_counter()
        optimizer.step()
        elapsed = (time.perf_counter() - start) * 1000.0
        if step >= args.warmup:
            times_ms.append(elapsed)
    checksum = sum(p.detach().double().sum().item() for p in params)
    print(json.dumps(dict(
        optimizer=name, impl="pytorch_foreach" if args.foreach else "pytorch",
        threads=args.threads, steps=args.steps, ms_per_step=statistics.median(times_ms),
        mean_ms_per_step=statistics.mean(times_ms),
        num_parameters=sum(p.numel() for p in params), num_tensors=len(params),
        checksum=checksum)))


if __name__ == "__main__":
    main()
