#!/usr/bin/env python3
"""FairScale's side of bench/zero_bench.cpp: the same wide MLP, batch, optimizer, threads and
steps as zero_bench.cpp and zero_reference.py (whose model, optimizer settings and
measurements this script imports), on the same ranks (one process per rank,
RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT as bench/run_zero_bench.sh sets them, Gloo over
127.0.0.1; started without RANK, it starts --world ranks of itself the same way), with
FairScale 0.4.13 (the ZeRO implementation VISSL uses) on PyTorch 2.11:

  oss   torch's DistributedDataParallel + fairscale.optim.OSS    (ZeRO stage 1)
  sdp   fairscale.nn.data_parallel.ShardedDataParallel + OSS     (ZeRO stage 2)
  fsdp  fairscale.nn.FullyShardedDataParallel                    (ZeRO stage 3): every Linear
        but the last its own unit, the last Linear in the root unit, as zero_bench.cpp's
        stage 3 cuts (Linear, ReLU) blocks; float32, reshard_after_forward, flat parameters
        (FairScale's defaults)

Rank 0 prints one JSON line per variant in zero_reference.py's format, with "impl":
"fairscale" and "variant": "fairscale_oss" / "fairscale_sdp" / "fairscale_fsdp": step times
(median and mean ms), images_per_s (both ranks' images per second at the median step time),
and every rank's bytes of parameters, .grad tensors and optimizer state after the last step
(each storage once, as Largo's measure_model_state_bytes), and its peak_rss_bytes
(zero_reference.py's caveats apply: it includes the interpreter and torch; run one variant
per process for clean peaks).

What FairScale needs on PyTorch 2.11, CPU and Gloo (found with these versions; the output
says "shim" where one is used):
  - ShardedDataParallel: its gradients are views into per-rank reduce buckets, so they must
    be zeroed, not freed. torch >= 2.0's Optimizer.zero_grad() frees them by default
    (set_to_none=True), after which SDP silently reduces stale bucket contents (parameters
    off by ~1e-2 after 3 steps on a small MLP; with 1.13's default it was fine). This script
    calls ShardedDataParallel.zero_grad(), whose default keeps them (set_to_none=False).
  - FullyShardedDataParallel is written for CUDA: its compute device defaults to "cuda"
    (passed as cpu here) and it indexes three torch.cuda.Stream()s that exist only when CUDA
    is available ("KeyError: 'all_gather'" on a CPU machine). The "cpu_streams" shim below
    hands FairScale's FSDP module no-op streams; on the CPU every op already runs in order on
    the calling thread, so that is the CPU's semantics. And its reduce-scatter bucket passes
    a 2-D [world, n] tensor to dist._reduce_scatter_base, which Gloo rejects ("Check failed:
    outputShape[0] * worldSize == inputShape[0] (192 vs. 2)"); FairScale's own switch
    ENABLE_NCCL_BASE_COLLECTIVES=0 (set here before the import) makes it use the list form
    dist.reduce_scatter, which Gloo supports.
  With these, OSS, SDP and FSDP all gave parameters bitwise equal to DDP + the same optimizer
  (SGD and AdamW, 3 steps, 2 ranks).

Usage: fairscale_reference.py [--variants oss,sdp,fsdp] [--optimizer adamw|sgd] [--input N]
                              [--width N] [--depth N] [--classes N] [--batch N]
                              [--warmup W] [--steps S] [--threads T] [--foreach] [--world N]
"""
import contextlib
import os
import statistics
import sys
import time
import types

# Before fairscale is imported (its modules read it at import): Gloo-compatible
# reduce-scatter in FSDP's bucketer.
os.environ.setdefault("ENABLE_NCCL_BASE_COLLECTIVES", "0")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from zero_reference import (make_mlp, measured_ranks, optimizer_class_and_args,  # noqa: E402
                            parse_arguments, peak_rss_bytes, reset_peak_rss, run_variants,
                            state_bytes, storage_bytes)


class _CpuStream:
    """A CUDA stream stand-in that does nothing: what a stream is on the CPU."""

    def wait_stream(self, other):
        pass

    def synchronize(self):
        pass

    def wait_event(self, event):
        pass


_CPU_STREAM = _CpuStream()


def install_cpu_streams_for_fairscale_fsdp():
    """The "cpu_streams" shim: FairScale's FSDP module sees a `torch` whose `cuda` namespace
    hands out _CPU_STREAM (and says CUDA is available, so that FSDP creates its streams), and
    Tensor.record_stream accepts that stream. Nothing else changes."""
    import fairscale.nn.data_parallel.fully_sharded_data_parallel as fsdp_module
    if getattr(fsdp_module.torch, "_largo_cpu_streams", False):
        return
    proxy = types.SimpleNamespace(**{k: getattr(torch, k) for k in dir(torch)
                                     if not k.startswith("__")})
    proxy.cuda = types.SimpleNamespace(
        is_available=lambda: True,
        Stream=lambda *args, **kwargs: _CPU_STREAM,
        stream=lambda stream: contextlib.nullcontext(),
        current_stream=lambda *args, **kwargs: _CPU_STREAM,
        synchronize=lambda *args, **kwargs: None)
    proxy._largo_cpu_streams = True
    fsdp_module.torch = proxy
    record_stream = torch.Tensor.record_stream

    def record_stream_or_nothing(self, stream):
        return None if stream is _CPU_STREAM else record_stream(self, stream)

    torch.Tensor.record_stream = record_stream_or_nothing


def wrap_fully_sharded(net):
    """FairScale FSDP units as zero_bench.cpp's stage 3: each Linear but the last, then the
    root (holding the last Linear)."""
    from fairscale.nn import FullyShardedDataParallel
    install_cpu_streams_for_fairscale_fsdp()
    cpu = torch.device("cpu")
    linears = [i for i, m in enumerate(net) if isinstance(m, nn.Linear)]
    for i in linears[:-1]:
        net[i] = FullyShardedDataParallel(net[i], compute_device=cpu)
    return FullyShardedDataParallel(net, compute_device=cpu)


def run_variant(variant, a):
    from fairscale.nn.data_parallel import ShardedDataParallel
    from fairscale.optim import OSS

    reset_peak_rss()
    net = make_mlp(a)
    num_parameters = sum(p.numel() for p in net.parameters())
    cls, kwargs = optimizer_class_and_args(a)
    shim = None
    if variant == "fsdp":
        model = wrap_fully_sharded(net)
        optimizer = cls(model.parameters(), **kwargs)  # over this rank's flat shards
        local_optimizer = optimizer
        zero_grad = lambda: optimizer.zero_grad(set_to_none=True)  # noqa: E731
        shim = "cpu_streams"
    else:
        optimizer = OSS(net.parameters(), optim=cls, **kwargs)
        local_optimizer = optimizer.optim  # this rank's shard
        if variant == "sdp":
            model = ShardedDataParallel(net, optimizer)
            zero_grad = model.zero_grad  # set_to_none=False: keeps the bucket views
        else:
            model = DistributedDataParallel(net)
            zero_grad = lambda: optimizer.zero_grad(set_to_none=True)  # noqa: E731
    generator = torch.Generator().manual_seed(100 + dist.get_rank())
    inputs = torch.randn(a.batch, a.input, generator=generator)
    labels = torch.randint(0, a.classes, (a.batch,), generator=generator)
    step_ms, measured = [], None
    for step in range(a.warmup + a.steps):
        start = time.perf_counter()
        zero_grad()
        F.cross_entropy(model(inputs), labels).backward()
        optimizer.step()
        ms = (time.perf_counter() - start) * 1e3
        if step >= a.warmup:
            step_ms.append(ms)
        if step + 1 == a.warmup + a.steps:
            params = list(model.parameters())
            measured = [storage_bytes(params), storage_bytes([p.grad for p in params]),
                        state_bytes(local_optimizer)]
    ranks = measured_ranks(measured, peak_rss_bytes())
    ms = statistics.median(step_ms)
    import fairscale
    return {"impl": "fairscale", "variant": "fairscale_" + variant, "optimizer": a.optimizer,
            "foreach": a.foreach, "world_size": dist.get_world_size(),
            "num_parameters": num_parameters, "batch_per_rank": a.batch, "steps": a.steps,
            "ms_per_step": ms, "mean_ms_per_step": statistics.fmean(step_ms), "step_ms": step_ms,
            "images_per_s": a.batch * dist.get_world_size() / (ms / 1e3), "ranks": ranks,
            "torch_version": torch.__version__, "fairscale_version": fairscale.__version__,
            "shim": shim}


def main():
    run_variants(parse_arguments("oss,sdp,fsdp", ("oss", "sdp", "fsdp")), run_variant)


if __name__ == "__main__":
    main()
