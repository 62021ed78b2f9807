#!/usr/bin/env python3
"""How evenly whole-parameter partitions spread optimizer state over N ranks, next to
Largo's flat even slices (docs/zero.md): the largest rank's share divided by the even share.

Greedy largest-first is what FairScale's OSS and PyTorch's ZeroRedundancyOptimizer do;
greedy in parameter order is shown for contrast. Parameter sizes come from torchvision.
Run: $LARGO_PYTHON bench/zero_partition_balance.py
(LARGO_PYTHON from scripts/torch_env.sh: the venv of scripts/install_deps.sh, PyTorch 2.11)
"""
import torchvision


def largest_share(sizes, world_size):
    loads = [0] * world_size
    for size in sizes:
        loads[loads.index(min(loads))] += size
    return max(loads)


def main():
    models = {"resnet50": torchvision.models.resnet50,
              "resnet152": torchvision.models.resnet152,
              "vit_b_16": torchvision.models.vit_b_16}
    print("model      N  params     largest-first  in-order  flat (padding elements)")
    for name, build in models.items():
        sizes = [p.numel() for p in build().parameters()]
        total = sum(sizes)
        for world_size in (2, 4, 8):
            even = -(-total // world_size)
            first = largest_share(sorted(sizes, reverse=True), world_size) / even
            in_order = largest_share(sizes, world_size) / even
            print(f"{name:10s} {world_size}  {total:9d}  {first:13.4f}  {in_order:8.4f}  "
                  f"1 ({even * world_size - total})")


if __name__ == "__main__":
    main()
