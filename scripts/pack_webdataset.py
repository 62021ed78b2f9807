#!/usr/bin/python3
"""Packs an ImageFolder tree (one subfolder per class) into WebDataset tar shards, what
DATA_SOURCES: [webdataset] reads:

  scripts/pack_webdataset.py ROOT PREFIX [--shard-size 1000] [--seed 0]

writes PREFIX-000000.tar, PREFIX-000001.tar, ... of --shard-size samples each (the last one
holds the rest), and prints the shard list to put in DATA_PATHS ("PREFIX-{000000..000012}.tar").
Sample n (counted over the shards in order) is the pair of members

  <n, 9 digits>.<jpg|jpeg|png>   the image file's bytes, unchanged
  <n, 9 digits>.cls              its class index as decimal text (webdataset's int encoding)

Classes and samples are listed as torchvision's ImageFolder (and Largo's disk_folder) list
them -- class folders sorted by name, the label a class's position; within a class, folders in
sorted path order and files sorted by name, symlinks followed -- so the labels are
disk_folder's. Only .jpg, .jpeg and .png files are packed (Largo decodes JPEG and PNG); other
image extensions are counted and left out, with a warning. The samples are shuffled with
--seed before they are cut into shards, so every shard holds a mix of classes (WebDataset's
loader shuffles whole shards and a window of samples, not the whole set). Members are written
in tar's ustar format with fixed owner, mode and time: the same folder and seed give the same
bytes. Needs only Python's standard library.
"""
import argparse
import io
import os
import random
import sys
import tarfile

PACKED = (".jpg", ".jpeg", ".png")
# torchvision's IMG_EXTENSIONS: listed by ImageFolder, but not packed.
OTHER_IMAGES = (".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


def list_image_folder(root):
    """[(path, label)] in ImageFolder's order, and the number of unpacked image files."""
    classes = sorted(entry.name for entry in os.scandir(root) if entry.is_dir())
    if not classes:
        sys.exit(f"pack_webdataset: {root} has no class subfolder")
    samples, left_out = [], 0
    for label, name in enumerate(classes):
        for folder, _, files in sorted(os.walk(os.path.join(root, name), followlinks=True)):
            for file in sorted(files):
                extension = os.path.splitext(file)[1].lower()
                if extension in PACKED:
                    samples.append((os.path.join(folder, file), label))
                elif extension in OTHER_IMAGES:
                    left_out += 1
    return samples, left_out


def add_member(tar, name, data):
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o444
    info.mtime = 0
    tar.addfile(info, io.BytesIO(data))


def write_shards(samples, prefix, shard_size):
    paths = []
    for start in range(0, len(samples), shard_size):
        path = f"{prefix}-{len(paths):06d}.tar"
        with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
            for n in range(start, min(start + shard_size, len(samples))):
                image, label = samples[n]
                key = f"{n:09d}"
                extension = os.path.splitext(image)[1].lower()
                with open(image, "rb") as f:
                    add_member(tar, key + extension, f.read())
                add_member(tar, key + ".cls", str(label).encode())
        paths.append(path)
    return paths


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("root", help="the ImageFolder root: one subfolder per class")
    parser.add_argument("prefix", help="shards are written as PREFIX-000000.tar, ...")
    parser.add_argument("--shard-size", type=int, default=1000, help="samples per shard")
    parser.add_argument("--seed", type=int, default=0, help="seeds the shuffle before sharding")
    args = parser.parse_args()
    if args.shard_size < 1:
        sys.exit("pack_webdataset: --shard-size must be >= 1")
    samples, left_out = list_image_folder(args.root)
    if not samples:
        sys.exit(f"pack_webdataset: {args.root} holds no .jpg, .jpeg or .png file")
    if left_out:
        print(f"pack_webdataset: warning: {left_out} image files that are not JPEG or PNG were "
              "left out", file=sys.stderr)
    random.Random(args.seed).shuffle(samples)
    os.makedirs(os.path.dirname(os.path.abspath(args.prefix)), exist_ok=True)
    paths = write_shards(samples, args.prefix, args.shard_size)
    last = len(paths) - 1
    print(f"pack_webdataset: {len(samples)} samples in {len(paths)} shards; DATA_PATHS: "
          f"[\"{args.prefix}-{{{0:06d}..{last:06d}}}.tar\"]")


if __name__ == "__main__":
    main()
