#!/usr/bin/env python3
"""The reference side of bench/run_loader_webdataset.sh: the `webdataset` package's loader
(PyPI, its documented ImageNet recipe) over the same shards, with the transform Largo runs:
shards shuffled and split over the DataLoader's workers, a shuffle buffer, PIL decoding,
torchvision's RandomResizedCrop 224 + RandomHorizontalFlip + ToTensor + Normalize, batched
in the workers. Prints one line: images/s over one epoch after a warm-up of WARMUP batches
(worker start-up excluded), like bench/image_pipeline_reference.py.

  webdataset_reference.py SHARDS WORKERS BATCH SHUFFLE_BUFFER
"""
import sys
import time

import torch
import webdataset as wds
from torchvision import transforms as T

WARMUP = 2


def main():
    shards, workers, batch, buffer = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    transform = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(),
                           T.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])])
    torch.manual_seed(0)
    # shardshuffle: a buffer of 1000 shards, more than the bench writes: a full permutation.
    dataset = (wds.WebDataset(shards, shardshuffle=1000, nodesplitter=wds.single_node_only,
                              empty_check=False)
               .shuffle(buffer)
               .decode("pil")
               .to_tuple("jpg;jpeg;png", "cls")
               .map_tuple(transform, lambda label: label)
               .batched(batch, partial=False))
    loader = wds.WebLoader(dataset, batch_size=None, num_workers=workers)
    start, images = None, 0
    for k, (x, _) in enumerate(loader):
        if k == WARMUP:
            start = time.perf_counter()
        elif k > WARMUP:
            images += x.shape[0]
    elapsed = time.perf_counter() - start
    print(f"webdataset (PyPI) workers={workers}: {images / elapsed:.1f} images/s ({images} images, {elapsed:.2f} s)")


if __name__ == "__main__":
    main()
