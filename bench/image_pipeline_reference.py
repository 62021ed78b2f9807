#!/usr/bin/env python3
"""The reference side of bench/run_image_pipeline_bench.sh: torchvision's ImageFolder +
torch.utils.data.DataLoader with the ImageNet training or validation transform, the way the
Apex/PyTorch ImageNet examples load data; or VISSL's SwAV multi-crop recipe (multicrop: 2 x 224
+ 6 x 96 crops, flip, colour distortion, PIL Gaussian blur, as VISSL's transforms compose it,
with the default collate giving one tensor per crop as VISSL's multicrop_collator). Prints one
line: images/s over one shuffled epoch, after a warm-up of WARMUP batches (worker start-up
excluded).

  image_pipeline_reference.py FOLDER train|val|multicrop WORKERS BATCH
"""
import random
import sys
import time

import torch
import torchvision
from PIL import ImageFilter
from torchvision import transforms as T

WARMUP = 2
NORMALIZE = T.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])


class SwavMultiCrop:
    """VISSL's SwAV TRANSFORMS: ImgPilToMultiCrop (8 crops), then per crop RandomHorizontalFlip,
    ImgPilColorDistortion(1.0), ImgPilGaussianBlur(0.5, 0.1, 2.0), ToTensor, Normalize."""

    def __init__(self):
        self.crops = [T.RandomResizedCrop(224, scale=(0.14, 1.0))] * 2 + \
            [T.RandomResizedCrop(96, scale=(0.05, 0.14))] * 6
        jitter = T.ColorJitter(0.8, 0.8, 0.8, 0.2)
        self.per_crop = T.Compose([
            T.RandomHorizontalFlip(0.5),
            T.Compose([T.RandomApply([jitter], p=0.8), T.RandomGrayscale(p=0.2)]),
            self.pil_gaussian_blur,
            T.ToTensor(), NORMALIZE])

    @staticmethod
    def pil_gaussian_blur(image):  # VISSL's ImgPilGaussianBlur
        if random.random() > 0.5:
            return image
        return image.filter(ImageFilter.GaussianBlur(radius=random.uniform(0.1, 2.0)))

    def __call__(self, image):
        return [self.per_crop(crop(image)) for crop in self.crops]


def main():
    folder, which, workers, batch = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    if which == "multicrop":
        transform = SwavMultiCrop()
    elif which == "train":
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
            images += (x[0] if isinstance(x, list) else x).shape[0]
    elapsed = time.perf_counter() - start
    print(f"torchvision {which} workers={workers}: {images / elapsed:.1f} images/s ({images} images, {elapsed:.2f} s)")


if __name__ == "__main__":
    main()
