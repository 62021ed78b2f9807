#!/usr/bin/python3
"""PyTorch reference for bench/zero_bench.cpp: the same wide MLP, batch and optimizer on the
same ranks (one process per rank, RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT from
bench/run_zero_bench.sh, Gloo over 127.0.0.1), with PyTorch's DistributedDataParallel and
either the plain optimizer ("ddp") or torch.distributed.optim.ZeroRedundancyOptimizer
("zero", PyTorch's ZeRO stage 1). Rank 0 prints one JSON line per variant, in the format of
zero_bench.cpp (step times; every rank's bytes of parameters, .grad tensors and optimizer
state, measured like Largo's measure_model_state_bytes: each storage once).

Usage: zero_reference.py [--variants ddp,zero] [--optimizer adamw|sgd] [--input N]
                         [--width N] [--depth N] [--classes N] [--batch N] [--warmup W]
                         [--steps S] [--threads T] [--foreach]
"""
import argparse
import json
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel


def make_mlp(a):
    """Keep in sync with make_mlp in zero_bench.cpp."""
    torch.manual_seed(0)
    layers = [nn.Linear(a.input, a.width), nn.ReLU()]
    for _ in range(1, a.depth):
        layers += [nn.Linear(a.width, a.width), nn.ReLU()]
    layers.append(nn.Linear(a.width, a.classes))
    return nn.Sequential(*layers)


def optimizer_class_and_args(a):
    # The same hyperparameters as zero_bench.cpp (lr 1e-3, weight decay 0.01; SGD momentum 0.9).
    if a.optimizer == "adamw":
        return torch.optim.AdamW, {"lr": 1e-3, "weight_decay": 0.01, "foreach": a.foreach}
    return torch.optim.SGD, {"lr": 1e-3, "weight_decay": 0.01, "momentum": 0.9,
                             "foreach": a.foreach}


def storage_bytes(tensors):
    seen, total = set(), 0
    for t in tensors:
        if t is None:
            continue
        storage = t.storage()
        key = storage.data_ptr()
        if key not in seen:
            seen.add(key)
            total += storage.nbytes()
    return total


def state_bytes(optimizer):
    total = 0
    for state in optimizer.state.values():
        for value in state.values():
            if torch.is_tensor(value):
                total += value.numel() * value.element_size()
    return total


def run_variant(variant, a):
    net = make_mlp(a)
    ddp = DistributedDataParallel(net)
    cls, kwargs = optimizer_class_and_args(a)
    if variant == "zero":
        optimizer = ZeroRedundancyOptimizer(net.parameters(), optimizer_class=cls, **kwargs)
        local_optimizer = optimizer.optim  # this rank's shard
    else:
        optimizer = cls(net.parameters(), **kwargs)
        local_optimizer = optimizer
    generator = torch.Generator().manual_seed(100 + dist.get_rank())
    inputs = torch.randn(a.batch, a.input, generator=generator)
    labels = torch.randint(0, a.classes, (a.batch,), generator=generator)
    step_ms, measured = [], None
    for step in range(a.warmup + a.steps):
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(ddp(inputs), labels).backward()
        optimizer.step()
        ms = (time.perf_counter() - start) * 1e3
        if step >= a.warmup:
            step_ms.append(ms)
        if step + 1 == a.warmup + a.steps:
            params = list(net.parameters())
            measured = [storage_bytes(params), storage_bytes([p.grad for p in params]),
                        state_bytes(local_optimizer)]
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, measured)
    ranks = [{"measured": {"parameters": m[0], "gradients": m[1], "optimizer_state": m[2],
                           "total": sum(m)}} for m in everyone]
    return {"impl": "pytorch", "variant": variant, "optimizer": a.optimizer,
            "foreach": a.foreach, "world_size": dist.get_world_size(),
            "num_parameters": sum(p.numel() for p in net.parameters()),
            "batch_per_rank": a.batch, "steps": a.steps,
            "ms_per_step": statistics.median(step_ms),
            "mean_ms_per_step": statistics.fmean(step_ms), "step_ms": step_ms, "ranks": ranks}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--variants", default="ddp,zero")
    p.add_argument("--optimizer", default="adamw", choices=["adamw", "sgd"])
    p.add_argument("--input", type=int, default=1024)
    p.add_argument("--width", type=int, default=4096)
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--classes", type=int, default=9)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--foreach", action="store_true")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    dist.init_process_group("gloo")
    for variant in a.variants.split(","):
        result = run_variant(variant, a)
        if dist.get_rank() == 0:
            print(json.dumps(result), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
