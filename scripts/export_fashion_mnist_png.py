#!/usr/bin/python3
"""Exports Fashion-MNIST (Debian's dataset-fashion-mnist idx files) to PNG class folders, the
ImageFolder layout DATA_SOURCES: [disk_folder] reads:

  OUT/train/0_T-shirt_top/00000.png ... OUT/train/9_Ankle_boot/...   (60000 images)
  OUT/test/...                                                       (10000 images)

Folder names start with the class index, so their sorted order (ImageFolder's label order) is
the idx label order. Images are 28 x 28 grayscale PNGs, exactly the idx pixels.

  scripts/export_fashion_mnist_png.py OUT [--source /usr/share/datasets/fashion-mnist] [--limit N]
"""
import argparse
import gzip
import os
import struct

import numpy as np
from PIL import Image

CLASSES = ["T-shirt_top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag",
           "Ankle_boot"]


def read_idx(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    zero, dtype, dims = struct.unpack(">HBB", data[:4])
    if zero != 0 or dtype != 0x08:
        raise SystemExit(f"{path}: not an idx file of unsigned bytes")
    shape = struct.unpack(">" + "I" * dims, data[4:4 + 4 * dims])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def find(source, stem):
    for name in (stem + ".gz", stem):
        path = os.path.join(source, name)
        if os.path.exists(path):
            return path
    raise SystemExit(f"no {stem}[.gz] in {source}: apt-get install dataset-fashion-mnist")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--source", default="/usr/share/datasets/fashion-mnist")
    parser.add_argument("--limit", type=int, default=0, help="export only the first N images of each split")
    args = parser.parse_args()
    for split, prefix in [("train", "train"), ("test", "t10k")]:
        images = read_idx(find(args.source, f"{prefix}-images-idx3-ubyte"))
        labels = read_idx(find(args.source, f"{prefix}-labels-idx1-ubyte"))
        count = len(images) if args.limit <= 0 else min(args.limit, len(images))
        for label, name in enumerate(CLASSES):
            os.makedirs(os.path.join(args.out, split, f"{label}_{name}"), exist_ok=True)
        for i in range(count):
            label = int(labels[i])
            path = os.path.join(args.out, split, f"{label}_{CLASSES[label]}", f"{i:05d}.png")
            Image.fromarray(images[i], mode="L").save(path)
        print(f"{split}: {count} images in {os.path.join(args.out, split)}")


if __name__ == "__main__":
    main()
