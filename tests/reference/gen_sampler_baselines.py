#!/usr/bin/env python3
"""Writes tests/data/baselines/sampler_baselines.json: the indices PyTorch's
torch.utils.data.DistributedSampler yields for a set of cases, the indices VISSL's
StatefulDistributedSampler yields (its formula, restated below on top of PyTorch's sampler, as
VISSL builds it), and a few raw torch.randperm permutations, which largo::data's samplers (and
`largo inspect sampler`) must reproduce exactly.

Run from the repository root with LARGO_PYTHON (scripts/torch_env.sh: the venv of
scripts/install_deps.sh, PyTorch 2.11):
    $LARGO_PYTHON tests/reference/gen_sampler_baselines.py
"""
import json
import os

import torch
from torch.utils.data import DistributedSampler

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "baselines",
                   "sampler_baselines.json")

# Lists longer than this are stored as head, tail and a checksum to keep the file small.
MAX_FULL = 200


class Sized:
    """A dataset stand-in: the sampler only calls len()."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n


def summarize(values):
    entry = {"length": len(values)}
    if len(values) <= MAX_FULL:
        entry["values"] = values
    else:
        entry["head"] = values[:32]
        entry["tail"] = values[-32:]
        # sum over positions of (position + 1) * value: catches any reordering.
        entry["checksum"] = sum((i + 1) * v for i, v in enumerate(values))
    return entry


# (dataset_size, num_replicas, shuffle, drop_last, seed, epoch); every rank is recorded.
CASES = [
    (10, 1, True, False, 0, 0),
    (10, 3, True, False, 42, 1),   # N not divisible by R: padded
    (10, 3, True, True, 42, 1),    # ... or truncated
    (11, 4, False, False, 0, 0),   # no shuffle, padding
    (11, 4, False, True, 0, 0),
    (3, 8, True, False, 7, 2),     # padding longer than the list: repeats it
    (3, 8, True, True, 7, 2),      # drop_last with N < R: nothing
    (100, 4, True, False, 0, 5),
    (1000, 8, True, False, 1234, 3),
    (60000, 4, True, False, 0, 0),  # Fashion-MNIST train size
    (60001, 3, True, True, 2**40 + 3, 9),
]

# VISSL's StatefulDistributedSampler: (dataset_size, num_replicas, seed, epoch, batch_size,
# start_iter); every rank is recorded. Sizes not divisible by the world size drop the tail.
STATEFUL_CASES = [
    (10, 1, 0, 0, 2, 0),
    (10, 3, 42, 1, 2, 0),        # 10 % 3 = 1 sample dropped
    (10, 3, 42, 1, 2, 1),        # resumed at batch 1
    (11, 4, 7, 2, 1, 1),
    (3, 8, 7, 2, 1, 0),          # N < R: every rank gets nothing
    (10, 2, 0, 0, 4, 5),         # start_iter past the end: nothing left
    (100, 4, 0, 5, 8, 3),
    (1000, 8, 1234, 3, 16, 0),
    (1003, 6, 5, 1, 32, 2),
    (60000, 4, 0, 0, 256, 0),    # Fashion-MNIST train size
    (60001, 3, 2**40 + 3, 9, 64, 7),
]

RANDPERM = [(1, 0), (2, 5), (17, 0), (17, 1), (1000, 2**63 + 11), (60000, 3)]


class VisslStatefulDistributedSampler(DistributedSampler):
    """VISSL's StatefulDistributedSampler (vissl/data/data_helper.py), restated: the
    N - N % R leading samples are cut into one contiguous block per rank, each block is
    reordered by randperm(block length) seeded with seed + epoch (the same permutation on
    every rank), and iteration starts at start_iter * batch_size."""

    def __init__(self, dataset, num_replicas, rank, batch_size, seed=0):
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=False, seed=seed)
        self.start_iter = 0
        self.batch_size = batch_size
        self.total_size = len(dataset) - (len(dataset) % self.num_replicas)
        self.num_samples = self.total_size // self.num_replicas

    def set_start_iter(self, start_iter):
        self.start_iter = start_iter

    def __iter__(self):
        g = torch.Generator()
        g.manual_seed(self.epoch + self.seed)
        shuffling = torch.randperm(self.num_samples, generator=g).tolist()
        block = list(range(self.rank * self.num_samples, (self.rank + 1) * self.num_samples))
        indices = [block[i] for i in shuffling]
        assert len(indices) == self.num_samples
        return iter(indices[self.start_iter * self.batch_size:])


def main():
    samplers = []
    for n, replicas, shuffle, drop_last, seed, epoch in CASES:
        for rank in range(replicas):
            sampler = DistributedSampler(Sized(n), num_replicas=replicas, rank=rank,
                                         shuffle=shuffle, seed=seed, drop_last=drop_last)
            sampler.set_epoch(epoch)
            indices = list(iter(sampler))
            assert len(indices) == len(sampler)
            case = {"dataset_size": n, "num_replicas": replicas, "rank": rank,
                    "shuffle": shuffle, "drop_last": drop_last, "seed": seed, "epoch": epoch,
                    "num_samples": len(sampler)}
            case.update(summarize(indices))
            samplers.append(case)
    stateful = []
    for n, replicas, seed, epoch, batch_size, start_iter in STATEFUL_CASES:
        for rank in range(replicas):
            sampler = VisslStatefulDistributedSampler(Sized(n), replicas, rank, batch_size, seed)
            sampler.set_epoch(epoch)
            sampler.set_start_iter(start_iter)
            indices = list(iter(sampler))
            case = {"dataset_size": n, "num_replicas": replicas, "rank": rank, "seed": seed,
                    "epoch": epoch, "batch_size": batch_size, "start_iter": start_iter,
                    "num_samples": len(sampler)}
            case.update(summarize(indices))
            stateful.append(case)
    perms = []
    for n, seed in RANDPERM:
        g = torch.Generator()
        g.manual_seed(seed)
        perm = torch.randperm(n, generator=g).tolist()
        entry = {"n": n, "seed": seed}
        entry.update(summarize(perm))
        perms.append(entry)
    data = {
        "_generated": "GENERATED by tests/reference/gen_sampler_baselines.py -- do not edit",
        "torch_version": torch.__version__,
        "distributed_sampler": samplers,
        "stateful_distributed_sampler": stateful,
        "randperm": perms,
    }
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as f:
        json.dump(data, f, indent=1, separators=(",", ": "))
        f.write("\n")
    print(f"wrote {len(samplers)} DistributedSampler cases, {len(stateful)} "
          f"StatefulDistributedSampler cases and {len(perms)} permutations to "
          f"{os.path.normpath(OUT)}")


if __name__ == "__main__":
    main()
