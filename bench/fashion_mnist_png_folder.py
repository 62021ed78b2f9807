#!/usr/bin/env python3
"""Writes Fashion-MNIST's idx files as ImageFolder trees of PNGs (OUT/train/<class>/<i>.png,
OUT/test/<class>/<i>.png), the first N_TRAIN training and N_TEST test images, for
bench/run_ssl_linear_eval.sh. Nothing here is committed: the folders are made at run time.

  fashion_mnist_png_folder.py IDX_DIR OUT_DIR N_TRAIN N_TEST
"""
import gzip
import os
import sys

import numpy as np
from PIL import Image


def read_idx(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    dims = data[3]
    shape = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def find(idx_dir, stem):
    for name in (stem, stem + ".gz"):
        if os.path.exists(os.path.join(idx_dir, name)):
            return os.path.join(idx_dir, name)
    sys.exit(f"{stem}[.gz] not found in {idx_dir}")


def write_split(idx_dir, out, prefix, split, count):
    images = read_idx(find(idx_dir, f"{prefix}-images-idx3-ubyte"))[:count]
    labels = read_idx(find(idx_dir, f"{prefix}-labels-idx1-ubyte"))[:count]
    for i, (image, label) in enumerate(zip(images, labels)):
        folder = os.path.join(out, split, f"class{label}")
        os.makedirs(folder, exist_ok=True)
        Image.fromarray(image).convert("RGB").save(os.path.join(folder, f"{i:05d}.png"))


def main():
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    idx_dir, out, n_train, n_test = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    write_split(idx_dir, out, "train", "train", n_train)
    write_split(idx_dir, out, "t10k", "test", n_test)


if __name__ == "__main__":
    main()
