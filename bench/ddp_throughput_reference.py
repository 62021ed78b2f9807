#!/usr/bin/env python3
"""PyTorch reference for bench/ddp_throughput_bench.cpp: the same models, weights, global batch
(each rank trains its slice), optimizer and step, with torch.nn.parallel.DistributedDataParallel
over Gloo (bucket_cap_mb 25, broadcast_buffers on: PyTorch's defaults, which Largo's DDP
mirrors). --procs 1 trains the whole global batch in one process without DDP; --procs N starts
N processes with torch.multiprocessing (rendezvous on 127.0.0.1 and a free port).

Usage: ddp_throughput_reference.py MODEL [--procs N] [--batch GLOBAL] [--threads T]
                                   [--warmup W] [--steps S]
Prints one JSON line (rank 0), like the Largo driver.
"""
import argparse
import json
import os
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_throughput_reference import param_groups, resnet, small_cnn  # noqa: E402

# Keep in sync with the defaults in ddp_throughput_bench.cpp.
DEFAULTS = {
    "small_cnn": {"batch": 128, "warmup": 10, "steps": 60},
    "resnet18": {"batch": 32, "warmup": 2, "steps": 6},
}


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker(rank, procs, args, port, queue):
    torch.set_num_threads(args.threads)
    if procs > 1:
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ["MASTER_PORT"] = str(port)
        dist.init_process_group("gloo", rank=rank, world_size=procs)
    per_rank = args.batch // procs
    # The whole global batch on every rank (same seed and order as Largo), then this rank's
    # slice; the weights come next from the same generator.
    torch.manual_seed(0)
    shape = (args.batch, 1, 28, 28) if args.model == "small_cnn" else (args.batch, 3, 32, 32)
    images = torch.randn(shape)[rank * per_rank:(rank + 1) * per_rank].contiguous()
    labels = torch.randint(0, 10, (args.batch,), dtype=torch.long)[
        rank * per_rank:(rank + 1) * per_rank].contiguous()
    model = small_cnn() if args.model == "small_cnn" else resnet(18, cifar_stem=True)
    model.train()
    num_parameters = sum(p.numel() for p in model.parameters())
    optimizer = torch.optim.SGD(param_groups(model, 0.05, 5e-4), lr=0.05, momentum=0.9,
                                nesterov=True)
    net = model
    if procs > 1:
        net = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=25,
                                                        broadcast_buffers=True)

    last_loss = 0.0

    def one_step():
        nonlocal last_loss
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(net(images), labels)
        last_loss = loss.item()
        loss.backward()
        optimizer.step()

    for _ in range(args.warmup):
        one_step()
    if procs > 1:
        dist.barrier()
    start = time.perf_counter()
    for _ in range(args.steps):
        one_step()
    if procs > 1:
        dist.barrier()
    ms_per_step = (time.perf_counter() - start) * 1000.0 / args.steps
    if rank == 0:
        queue.put({
            "impl": "pytorch_ddp" if procs > 1 else "pytorch",
            "model": args.model,
            "procs": procs,
            "batch": args.batch,
            "threads": args.threads,
            "steps": args.steps,
            "num_parameters": num_parameters,
            "ms_per_step": ms_per_step,
            "images_per_sec": args.batch * 1000.0 / ms_per_step,
            "final_loss": last_loss,
        })
    if procs > 1:
        dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model", choices=sorted(DEFAULTS))
    parser.add_argument("--procs", type=int, default=2)
    parser.add_argument("--batch", type=int)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--warmup", type=int)
    parser.add_argument("--steps", type=int)
    args = parser.parse_args()
    defaults = DEFAULTS[args.model]
    args.batch = args.batch or defaults["batch"]
    args.warmup = args.warmup or defaults["warmup"]
    args.steps = args.steps or defaults["steps"]
    if args.batch % args.procs:
        parser.error("the global batch must divide by --procs")

    if args.procs == 1:
        queue = mp.get_context("spawn").SimpleQueue()
        worker(0, 1, args, 0, queue)
    else:
        context = mp.get_context("spawn")
        queue = context.SimpleQueue()
        mp.start_processes(worker, args=(args.procs, args, free_port(), queue),
                           nprocs=args.procs, start_method="spawn")
    print(json.dumps(queue.get()))


if __name__ == "__main__":
    main()
