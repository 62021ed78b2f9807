#!/usr/bin/env python3
"""The reference side of bench/run_image_pipeline_bench.sh: torchvision's ImageFolder +
torch.utils.data.DataLoader with the ImageNet training or validation transform, the way the
Apex/PyTorch ImageNet examples load data. Prints one line: images/s over one shuffled epoch,
after a warm-up of WARMUP batches (worker start-up excluded).

  image_pipeline_reference.py FOLDER train|val WORKERS BATCH
"""
import sys
import time

import torch
import torchvision
from torchvision import transforms as T

WARMUP = 2
NORMALIZE = T.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])


def main():
    folder, which, workers, batch = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    if which == "train":
        transform = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(), NORMALIZE])
    else:
        transform = T.Compose([T.Resize(256), T.CenterCrop(224), T.ToTensor(), NORMALIZE])
    torch.manual_seed(0)
    dataset = torchvision.datasets.ImageFolder(folder, transform)
    loader = torch.utils.data.DataLoader(dataset, batch_size=batch, shuffle=True, num_workers=workers)
    start, images = None, 0
    for k, (x, _) in enumerate(loader):
        if k == WARMUP:
            start = time.perf_counter()
        elif k > WARMUP:
            images += x.shape[0]
    elapsed = time.perf_counter() - start
    print(f"torchvision {which} workers={workers}: {images / elapsed:.1f} images/s ({images} images, {elapsed:.2f} s)")


if __name__ == "__main__":
    main()
