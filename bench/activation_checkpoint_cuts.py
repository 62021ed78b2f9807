#!/usr/bin/env python3
"""Peak activation memory of every 2-segment activation-checkpointing cut of a trunk.

For one model (the blocks of activation_checkpoint_reference.py, i.e. Largo's trunk blocks),
batch and image size: the plain step's peak, then for every boundary b in 1..num_blocks-1
the peak of the step whose trunk runs blocks [0, b) under torch.utils.checkpoint.checkpoint
(reentrant, checkpoint_sequential's default in PyTorch 2.11) and blocks [b, num_blocks) plainly:
checkpoint_sequential's 2-segment semantics with the cut at b. The step and the memory
figure are exactly those of activation_checkpoint_reference.py (zero_grad(set_to_none=False)
-> forward -> cross-entropy -> backward; peak of the running sum of the CPU allocator's
reports to the profiler during one step, above what was live before it; images require grad
in the checkpointed steps). "vs plain" is peak / plain peak - 1, the benchmark's "memory vs 0".

Each checkpointed step's peak is split into two phases at the start of the recompute:
  A  forward of everything + head + backward of the last (plain) segment [b, n)
  B  recompute of the first segment [0, b) with grad + its backward
so peak = max(A, B), which shows which side of the cut limits a given boundary.

Per block it also prints the probe figure Largo's planner balances
(measure_trunk_block_activation_bytes: growth of the live bytes across the block's forward
with grad while the whole graph stays alive), at the planner's probe batch and at the
benchmark batch, and the block's output bytes (what crosses a boundary there).

All measurements run in one process with one model (memory does not depend on timing):
one warm-up plain step and one warm-up checkpointed step first (gradients, images.grad and
first-use allocations), then one profiled step per point.

Usage: activation_checkpoint_cuts.py MODEL [--batch B] [--image S] [--threads T]
                                     [--boundaries b1,b2,...] [--probe-batch P]
"""
import argparse
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from activation_checkpoint_reference import DEFAULTS, build_benchmark  # noqa: E402

MIB = 1024.0 * 1024.0
RECOMPUTE = "largo_cuts_recompute"


def memory_timeline(step):
    """Runs step() under the profiler. Returns (memory events as (time_us, nbytes) in time
    order, start time of the first RECOMPUTE annotation or None). The running sum of the
    nbytes is what activation_checkpoint_reference.peak_bytes_of sums."""
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True
    ) as prof:
        step()
    events = list(prof.profiler.kineto_results.events())
    memory = [e for e in events if e.name() == "[memory]"]
    memory.sort(key=lambda e: e.start_us())  # stable, as in peak_bytes_of
    marks = [e.start_us() for e in events if e.name() == RECOMPUTE]
    return [(e.start_us(), e.nbytes()) for e in memory], (min(marks) if marks else None)


def peaks(timeline, split_us):
    """Peak of the running sum overall, before split_us and from split_us on."""
    current = peak = peak_a = peak_b = 0
    for t, nbytes in timeline:
        current += nbytes
        peak = max(peak, current)
        if split_us is None or t < split_us:
            peak_a = max(peak_a, current)
        else:
            peak_b = max(peak_b, current)
    return peak, peak_a, peak_b


def net_bytes(fn):
    """fn()'s result and the net bytes it left allocated (allocations minus frees)."""
    out = {}
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True
    ) as prof:
        out["y"] = fn()
    total = sum(e.nbytes() for e in prof.profiler.kineto_results.events() if e.name() == "[memory]")
    return out["y"], total


def block_activation_bytes(blocks, sample_shape, batch):
    """Largo's probe (checkpointed_trunk.cpp): zeros input, train mode, grad on, the graph of
    all blocks kept alive; per block the growth of the live bytes across its forward. Also
    each block's output bytes. BatchNorm statistics are saved and put back."""
    saved = [{k: v.clone() for k, v in b.state_dict().items()} for b in blocks]
    sizes, outputs = [], []
    with torch.enable_grad():
        x = torch.zeros(batch, *sample_shape)
        keep = []
        for block in blocks:
            x, grown = net_bytes(lambda: block(x))
            keep.append(x)
            sizes.append(max(0, grown))
            outputs.append(x.numel() * x.element_size())
        del keep, x
    for b, state in zip(blocks, saved):
        b.load_state_dict(state)
    return sizes, outputs


def largo_balanced_boundary(costs):
    """balanced_segment_boundaries(costs, 2): the b minimising max(sum[0,b), sum[b,n))
    (first minimum, as the C++ DP's strict < keeps the earliest start)."""
    n = len(costs)
    best = None
    for b in range(1, n):
        c = max(sum(costs[:b]), sum(costs[b:]))
        if best is None or c < best[0]:
            best = (c, b)
    return best[1]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model", choices=sorted(DEFAULTS))
    parser.add_argument("--batch", type=int)
    parser.add_argument("--image", type=int)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--boundaries", help="comma-separated subset of 1..num_blocks-1")
    parser.add_argument("--probe-batch", type=int, default=2, help="Largo's probe batch (2)")
    args = parser.parse_args()
    batch = args.batch or DEFAULTS[args.model]["batch"]
    image = args.image or DEFAULTS[args.model]["image"]

    torch.set_num_threads(args.threads)
    images, labels, blocks, head, model = build_benchmark(args.model, batch, image)
    n = len(blocks)
    images_ck = images.clone().requires_grad_(True)  # as the reference at 2+ segments
    started = time.perf_counter()

    # Per-block probe figures (before any step, so no gradients exist yet: the probe's
    # growth counts activations only, as Largo's ProbeGuard arranges).
    sample_shape = (3, image, image)
    probe_sizes, probe_out = block_activation_bytes(blocks, sample_shape, args.probe_batch)
    sizes, out_bytes = block_activation_bytes(blocks, sample_shape, batch)

    def plain_step():
        model.zero_grad(set_to_none=False)
        logits = model(images)  # held through the backward, as in the reference
        loss = F.cross_entropy(logits, labels)
        loss.backward()

    def cut_step(b):
        first = nn.Sequential(*blocks[:b])
        rest = nn.Sequential(*blocks[b:])

        def run_first(x):
            if torch.is_grad_enabled():  # the recompute in the backward
                with torch.profiler.record_function(RECOMPUTE):
                    return first(x)
            return first(x)

        def step():
            model.zero_grad(set_to_none=False)
            # The segment boundary tensor is not held here (checkpoint_sequential drops it
            # too); the logits are, as in the reference.
            logits = head(rest(torch.utils.checkpoint.checkpoint(run_first, images_ck)))
            loss = F.cross_entropy(logits, labels)
            loss.backward()

        return step

    plain_step()
    cut_step(n // 2)()
    missing = [name for name, p in model.named_parameters() if p.grad is None]
    if missing:
        raise SystemExit(f"parameters without a gradient: {missing[:5]} ...")

    plain, _ = memory_timeline(plain_step)
    plain_peak = peaks(plain, None)[0]

    print(f"{args.model}: batch {batch}, image {image}, {n} trunk blocks, threads {args.threads}")
    print(f"plain step peak: {plain_peak} B = {plain_peak / MIB:.2f} MiB")
    print()
    print(f"per block: probe bytes (Largo's planner cost) at probe batch {args.probe_batch} and at "
          f"batch {batch}, output bytes at batch {batch} (MiB)")
    print(f"{'block':>5} {'probe@' + str(args.probe_batch):>9} {'probe@' + str(batch):>9} "
          f"{'output':>8} {'cum probe':>10}")
    cum = 0
    for i in range(n):
        cum += sizes[i]
        print(f"{i:>5} {probe_sizes[i] / MIB:9.2f} {sizes[i] / MIB:9.2f} {out_bytes[i] / MIB:8.2f} "
              f"{cum / MIB:10.2f}")
    print(f"{'sum':>5} {sum(probe_sizes) / MIB:9.2f} {sum(sizes) / MIB:9.2f}")
    planner_b = largo_balanced_boundary(probe_sizes)
    print(f"Largo's balanced 2-segment cut from the probe@{args.probe_batch} costs: "
          f"(0, {planner_b}, {n})")
    print()

    wanted = range(1, n)
    if args.boundaries:
        wanted = [int(b) for b in args.boundaries.split(",")]
    rows = []
    print(f"{'cut':>4} {'peak B':>11} {'peak MiB':>9} {'vs plain':>9} {'phase A MiB':>12} "
          f"{'phase B MiB':>12} {'probe[0,b)':>11} {'probe[b,n)':>11} {'limit':>6}", flush=True)
    for b in wanted:
        timeline, split = memory_timeline(cut_step(b))
        peak, a, bb = peaks(timeline, split)
        first, last = sum(sizes[:b]), sum(sizes[b:])
        rows.append((b, peak, a, bb))
        print(f"{b:>4} {peak:>11} {peak / MIB:9.2f} {100 * (peak / plain_peak - 1):+8.1f}% "
              f"{a / MIB:12.2f} {bb / MIB:12.2f} {first / MIB:11.2f} {last / MIB:11.2f} "
              f"{'A' if a >= bb else 'B':>6}", flush=True)
    best = min(rows, key=lambda r: r[1])
    print()
    print(f"best cut: (0, {best[0]}, {n}): {best[1] / MIB:.2f} MiB, "
          f"{100 * (best[1] / plain_peak - 1):+.1f}% vs plain "
          f"({'reaches' if best[1] <= 0.6 * plain_peak else 'does NOT reach'} -40 %)")
    for b, peak, _, _ in rows:
        if b == planner_b:
            print(f"Largo's planner cut (0, {b}, {n}): {peak / MIB:.2f} MiB, "
                  f"{100 * (peak / plain_peak - 1):+.1f}% vs plain")
    print(f"(took {time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
