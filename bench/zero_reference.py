#!/usr/bin/env python3
"""PyTorch reference for bench/zero_bench.cpp: the same wide MLP, batch and optimizer on the
same ranks (one process per rank, RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT from
bench/run_zero_bench.sh, Gloo over 127.0.0.1; started without RANK, the script starts
--world ranks of itself the same way), with PyTorch's DistributedDataParallel and either the
plain optimizer ("ddp") or torch.distributed.optim.ZeroRedundancyOptimizer ("zero",
PyTorch's ZeRO stage 1), or with FSDP2, torch.distributed.fsdp.fully_shard ("fsdp2",
PyTorch >= 2.6: ZeRO stage 3, every Linear but the last its own unit and the last in the
root unit, as zero_bench.cpp's stage 3 cuts (Linear, ReLU) blocks; not among the default
variants: run_zero_bench.sh asks for it). Rank 0 prints one JSON line per variant,
in the format of zero_bench.cpp (step times; every rank's bytes of parameters, .grad tensors
and optimizer state, measured like Largo's measure_model_state_bytes: each storage once, a
DTensor's local shard), plus images_per_s (both ranks' images per second at the median step
time) and every rank's peak_rss_bytes (the process's peak resident memory during the
variant: /proc/self/status VmHWM, reset at the start of the variant; it includes the Python
interpreter and torch's libraries, and memory an earlier variant in the same process left
mapped, so run one variant per process for clean peaks).

Usage: zero_reference.py [--variants ddp,zero[,fsdp2]] [--optimizer adamw|sgd] [--input N]
                         [--width N] [--depth N] [--classes N] [--batch N] [--warmup W]
                         [--steps S] [--threads T] [--foreach] [--world N]
"""
import argparse
import gc
import json
import os
import socket
import statistics
import subprocess
import sys
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


def local_tensor(t):
    """A DTensor's (FSDP2's) local shard; any other tensor itself."""
    return t.to_local() if hasattr(t, "to_local") else t


def storage_bytes(tensors):
    seen, total = set(), 0
    for t in tensors:
        if t is None:
            continue
        t = local_tensor(t)
        storage = t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()
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
                value = local_tensor(value)
                total += value.numel() * value.element_size()
    return total


def reset_peak_rss():
    """Resets this process's VmHWM to its current resident size (Linux >= 4.0)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def peak_rss_bytes():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def launch_ranks_if_needed(world):
    """Without RANK in the environment: runs this script as `world` ranks (as
    bench/run_zero_bench.sh does: 1 OpenMP thread each, rank 0's stdout passed through, the
    others' discarded) and exits with the first failing status."""
    if "RANK" in os.environ:
        return
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    procs = []
    for rank in reversed(range(world)):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([sys.executable] + sys.argv, env=env,
                                      stdout=None if rank == 0 else subprocess.DEVNULL))
    statuses = [p.wait() for p in procs]
    sys.exit(next((s for s in statuses if s != 0), 0))


def measured_ranks(measured, peak):
    """Every rank's [parameters, gradients, optimizer state] bytes and peak RSS, on all ranks."""
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, (measured, peak))
    return [{"measured": {"parameters": m[0], "gradients": m[1], "optimizer_state": m[2],
                          "total": sum(m)}, "peak_rss_bytes": rss} for m, rss in everyone]


def shard_fully(net, mesh):
    """FSDP2: every Linear but the last its own unit, the last in the root (net's) unit."""
    from torch.distributed.fsdp import fully_shard
    linears = [m for m in net if isinstance(m, nn.Linear)]
    for linear in linears[:-1]:
        fully_shard(linear, mesh=mesh)
    fully_shard(net, mesh=mesh)
    return net


def run_variant(variant, a):
    reset_peak_rss()
    net = make_mlp(a)
    num_parameters = sum(p.numel() for p in net.parameters())
    cls, kwargs = optimizer_class_and_args(a)
    if variant == "fsdp2":
        from torch.distributed.device_mesh import init_device_mesh
        ddp = shard_fully(net, init_device_mesh("cpu", (dist.get_world_size(),)))
    else:
        ddp = DistributedDataParallel(net)
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
    ranks = measured_ranks(measured, peak_rss_bytes())
    ms = statistics.median(step_ms)
    return {"impl": "pytorch", "variant": variant, "optimizer": a.optimizer,
            "foreach": a.foreach, "world_size": dist.get_world_size(),
            "num_parameters": num_parameters,
            "batch_per_rank": a.batch, "steps": a.steps,
            "ms_per_step": ms, "mean_ms_per_step": statistics.fmean(step_ms), "step_ms": step_ms,
            "images_per_s": a.batch * dist.get_world_size() / (ms / 1e3), "ranks": ranks,
            "torch_version": torch.__version__}


def parse_arguments(default_variants, known_variants):
    """The arguments of this script and of fairscale_reference.py (the same model and run)."""
    p = argparse.ArgumentParser()
    p.add_argument("--variants", default=default_variants)
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
    p.add_argument("--world", type=int, default=2,
                   help="ranks to start when RANK is not set (else WORLD_SIZE decides)")
    a = p.parse_args()
    for variant in a.variants.split(","):
        if variant not in known_variants:
            p.error(f"unknown variant {variant!r}: {', '.join(known_variants)}")
    return a


def run_variants(a, run_variant):
    """Starts the ranks if needed, runs each variant, rank 0 printing its JSON line."""
    launch_ranks_if_needed(a.world)
    torch.set_num_threads(a.threads)
    dist.init_process_group("gloo")
    for variant in a.variants.split(","):
        result = run_variant(variant, a)
        if dist.get_rank() == 0:
            print(json.dumps(result), flush=True)
        # Free this variant's model, optimizer and wrappers now (they hold reference cycles),
        # before the next one is built (its peak_rss_bytes) and before the process group goes:
        # a teardown at interpreter exit after the group was gone aborted ("terminate called
        # without an active exception") in about 1 run of 4 after FairScale's
        # ShardedDataParallel on torch 2.11 + Gloo.
        gc.collect()
    dist.barrier()
    dist.destroy_process_group()


def main():
    run_variants(parse_arguments("ddp,zero", ("ddp", "zero", "fsdp2")), run_variant)


if __name__ == "__main__":
    main()
