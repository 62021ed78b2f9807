#!/usr/bin/env python3
"""Builds an ImageNet-like ImageFolder tree for bench/run_image_pipeline_bench.sh: JPEGs of
ImageNet's typical sizes (about 500x375 or 375x500, some 500x333/400, quality 90, a few
grayscale ones), cut at random from the real photographs that scikit-image (skimage/data) and
scikit-learn (sklearn/datasets/images) ship, installed into LARGO_PYTHON's venv by
scripts/install_deps.sh --bench, resized with PIL's Lanczos filter.
Nothing here is committed: the tree is made at bench time.

  make_image_folder.py OUT_DIR NUM_IMAGES [--classes 10] [--large]

--large keeps the photographs' own size instead (cut to at most 1600 px on a side): the
images that DCT-scaled decoding exists for (bench's "dct" measurement).
"""
import argparse
import importlib.util
import os
import random

from PIL import Image

SIZES = [(500, 375), (375, 500), (500, 333), (333, 500), (500, 400), (400, 500), (500, 375), (500, 375)]


def source_photos():
    folders = []
    for package, sub in [("skimage", "data"), ("sklearn", os.path.join("datasets", "images"))]:
        spec = importlib.util.find_spec(package)
        if spec is None or spec.origin is None:
            raise SystemExit(f"{package} is not installed: run `bash scripts/install_deps.sh --bench`")
        folders.append(os.path.join(os.path.dirname(spec.origin), sub))
    photos = []
    for folder in folders:
        for name in sorted(os.listdir(folder)):
            if not name.lower().endswith((".jpg", ".jpeg", ".png")):
                continue
            try:
                image = Image.open(os.path.join(folder, name))
                image.load()
            except OSError:
                continue  # skimage ships a deliberately truncated JPEG for its own tests
            # Photographs only: big enough, and not the synthetic test patterns.
            if min(image.size) >= 300 and not name.startswith(("chessboard", "checker", "logo", "page", "text")):
                photos.append(image.convert("L" if image.mode in ("L", "I", "I;16") else "RGB"))
    if len(photos) < 5:
        raise SystemExit(f"found only {len(photos)} photographs under {folders}")
    return photos


def cut(photo, rng, large):
    if large:
        width, height = photo.size
        scale = min(1.0, 1600 / max(width, height))
        target = (int(width * scale), int(height * scale))
    else:
        target = rng.choice(SIZES)
    aspect = target[0] / target[1]
    # The largest box of the target's aspect that fits, then 55-100% of it at a random place.
    width = min(photo.width, int(photo.height * aspect))
    height = int(width / aspect)
    fraction = 1.0 if large else rng.uniform(0.55, 1.0)
    width, height = max(int(width * fraction), 16), max(int(height * fraction), 16)
    left, top = rng.randint(0, photo.width - width), rng.randint(0, photo.height - height)
    image = photo.crop((left, top, left + width, top + height)).resize(target, Image.LANCZOS)
    if rng.random() < 0.5:
        image = image.transpose(Image.FLIP_LEFT_RIGHT)
    return image


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("count", type=int)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--large", action="store_true")
    args = parser.parse_args()
    rng = random.Random(1234)
    photos = source_photos()
    for c in range(args.classes):
        os.makedirs(os.path.join(args.out, f"class{c:03d}"), exist_ok=True)
    total_bytes = 0
    for i in range(args.count):
        photo = photos[i % len(photos)]
        image = cut(photo, rng, args.large)
        path = os.path.join(args.out, f"class{i % args.classes:03d}", f"img{i:06d}.JPEG")
        image.save(path, format="JPEG", quality=90)
        total_bytes += os.path.getsize(path)
    print(f"make_image_folder: {args.count} JPEGs from {len(photos)} photographs in {args.out} "
          f"({total_bytes / args.count / 1024:.0f} KiB each on average)")


if __name__ == "__main__":
    main()
