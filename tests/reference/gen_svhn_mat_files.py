#!/usr/bin/env python3
"""SVHN-format MAT-files for tests/data/svhn_dataset_test.cpp, written by scipy.io.savemat (an
independent writer of MATLAB's Level 5 format). Run with LARGO_PYTHON; the test does, at run
time:

  $LARGO_PYTHON tests/reference/gen_svhn_mat_files.py DIR

Writes into DIR/<case>/ the file torchvision's SVHN reads, train_32x32.mat or test_32x32.mat,
holding X, uint8 [32, 32, 3, N] with X[h, w, c, n] = (n + 3c + 5h + 7w) % 256, and y [N, 1]:
  compressed/train_32x32.mat  N = 3, y = [10, 1, 7] as double, zlib-compressed (MATLAB -v7,
                              how SVHN's files are stored)
  plain/test_32x32.mat        N = 2, y = [5, 10] as uint8, uncompressed (-v6)
  bad_label/test_32x32.mat    N = 2, y = [0, 3] as double (0 is no SVHN label)
  not_integer/test_32x32.mat  N = 2, y = [1.5, 3] as double
  wrong_shape/test_32x32.mat  X uint8 [32, 32, 1, 2] (one channel)
"""
import os
import sys

import numpy as np
import scipy.io


def images(n, channels=3):
    h, w, c, i = np.meshgrid(np.arange(32), np.arange(32), np.arange(channels), np.arange(n),
                             indexing="ij")
    return ((i + 3 * c + 5 * h + 7 * w) % 256).astype(np.uint8)


def save(directory, case, name, x, y, compress):
    os.makedirs(os.path.join(directory, case), exist_ok=True)
    scipy.io.savemat(os.path.join(directory, case, name), {"X": x, "y": y},
                     do_compression=compress)


def main():
    directory = sys.argv[1]
    save(directory, "compressed", "train_32x32.mat", images(3),
         np.array([[10.0], [1.0], [7.0]]), True)
    save(directory, "plain", "test_32x32.mat", images(2), np.array([[5], [10]], np.uint8), False)
    save(directory, "bad_label", "test_32x32.mat", images(2), np.array([[0.0], [3.0]]), True)
    save(directory, "not_integer", "test_32x32.mat", images(2), np.array([[1.5], [3.0]]), True)
    save(directory, "wrong_shape", "test_32x32.mat", images(2, channels=1),
         np.array([[1.0], [2.0]]), True)


if __name__ == "__main__":
    main()
