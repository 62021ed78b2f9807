#!/usr/bin/env python3
"""Writes tests/data/baselines/multicrop/: what torchvision and VISSL's multi-crop transforms
make of the image fixtures (tests/data/baselines/images/fixtures, gen_image_baselines.py), for
tests/data/multi_view_pipeline_test.cpp.

  expected/crop_<n>.png       torchvision's F.resized_crop(image, top, left, h, w, size,
                              BILINEAR), then F.hflip when the case says so: a fixed crop box
                              and flip decision, so that Largo's crop math is compared on its
                              own, without any random draw
  expected/<recipe>_<k>.png   view k of a whole VISSL transform list (SwAV's multi-crop,
                              SimCLR's ImgReplicatePil pair, BYOL's per-crop random apply) run
                              after torch.manual_seed(seed), with VISSL's order of draws: each
                              transform runs on every crop before the next transform
                              (SSLTransformsWrapper). ImgPilGaussianBlur and
                              ImgPilRandomSolarize draw from torch, as Largo does (VISSL draws
                              them with NumPy / random), see gen_image_baselines.py
  multicrop_baselines.json    the cases and recipes (transform lists as Largo's specs)

Run from the repository root with LARGO_PYTHON (scripts/torch_env.sh):
  $LARGO_PYTHON tests/reference/gen_multicrop_baselines.py
"""
import io
import json
import os
import shutil
import sys

import torch
import torchvision
from PIL import Image
from torchvision import transforms as T
from torchvision.transforms import functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from gen_image_baselines import vissl_pil_gaussian_blur, vissl_random_solarize  # noqa: E402

FIXTURES = os.path.join(HERE, "..", "data", "baselines", "images", "fixtures")
OUT = os.path.join(HERE, "..", "data", "baselines", "multicrop")
BILINEAR = T.InterpolationMode.BILINEAR


def open_rgb(name):
    with open(os.path.join(FIXTURES, name), "rb") as f:
        return Image.open(io.BytesIO(f.read())).convert("RGB")


def save_png(image, name):
    image.save(os.path.join(OUT, "expected", name + ".png"), format="PNG")


# ---- VISSL's transforms (vissl/data/ssl_transforms), copied without classy_vision -------

class ImgPilToMultiCrop:
    def __init__(self, total_num_crops, num_crops, size_crops, crop_scales):
        assert sum(num_crops) == total_num_crops
        assert len(size_crops) == len(num_crops) == len(crop_scales)
        self.transforms = []
        for num, size, scale in zip(num_crops, size_crops, crop_scales):
            self.transforms.extend([T.RandomResizedCrop(size, scale=scale)] * num)

    def __call__(self, image):
        return [transform(image) for transform in self.transforms]


class ImgReplicatePil:
    def __init__(self, num_times=2):
        self.num_times = num_times

    def __call__(self, image):
        return [image.copy() for _ in range(self.num_times)]


def img_pil_color_distortion(strength=1.0):
    jitter = T.ColorJitter(0.8 * strength, 0.8 * strength, 0.8 * strength, 0.2 * strength)
    return T.Compose([T.RandomApply([jitter], p=0.8), T.RandomGrayscale(p=0.2)])


class ImgPilMultiCropRandomApply:
    def __init__(self, transforms, prob):
        composed = T.Compose(transforms)
        self.prob = prob
        self.transforms = [T.RandomApply([composed], p=p) for p in prob]

    def __call__(self, image_list):
        assert len(image_list) == len(self.prob)
        return [t(image) for t, image in zip(self.transforms, image_list)]


LIST_TRANSFORMS = (ImgPilToMultiCrop, ImgReplicatePil, ImgPilMultiCropRandomApply)


def run_vissl_list(transforms, image):
    """SSLTransformsWrapper: a one-image transform meeting a list runs on each crop in turn."""
    data = image
    for transform in transforms:
        if isinstance(transform, LIST_TRANSFORMS):
            data = transform(data)
        elif isinstance(data, list):
            data = [transform(crop) for crop in data]
        else:
            data = transform(data)
    return data


# ---- cases ------------------------------------------------------------------------------

def resized_crop_cases():
    """Fixed boxes and flips on the fixtures: inside, whole image, thin, one pixel, upscales."""
    cases = []
    boxes = [
        ("rgb420.jpg", [10, 20, 100, 120], [64, 64], False),
        ("rgb420.jpg", [10, 20, 100, 120], [64, 64], True),
        ("rgb420.jpg", [0, 0, 150, 200], [96, 96], True),
        ("rgb420.jpg", [37, 3, 17, 150], [32, 32], False),
        ("rgb420.jpg", [149, 199, 1, 1], [8, 8], True),
        ("large.jpg", [100, 50, 300, 400], [224, 224], False),
        ("large.jpg", [5, 311, 61, 47], [96, 96], True),
        ("rgb.png", [3, 4, 60, 80], [40, 56], True),
    ]
    for n, (image, box, size, flip) in enumerate(boxes):
        result = F.resized_crop(open_rgb(image), *box, size, interpolation=BILINEAR)
        if flip:
            result = F.hflip(result)
        name = f"crop_{n}"
        save_png(result, name)
        cases.append(dict(name=name, image=image, box=box, size=size, flip=flip))
    return cases


def recipes():
    """(name, fixture, seed, Largo's specs, VISSL's transform list)."""
    out = []
    swav_specs = [
        {"name": "ImgPilToMultiCrop", "total_num_crops": 5, "num_crops": [2, 3],
         "size_crops": [64, 32], "crop_scales": [[0.14, 1.0], [0.05, 0.14]]},
        {"name": "RandomHorizontalFlip", "p": 0.5},
        {"name": "ImgPilColorDistortion", "strength": 1.0},
        {"name": "ImgPilGaussianBlur", "p": 0.5, "radius_min": 0.1, "radius_max": 2.0},
    ]
    for seed in range(3):
        out.append((f"swav_{seed}", "large.jpg" if seed == 0 else "rgb420.jpg", seed, swav_specs, [
            ImgPilToMultiCrop(5, [2, 3], [64, 32], [(0.14, 1.0), (0.05, 0.14)]),
            T.RandomHorizontalFlip(0.5), img_pil_color_distortion(1.0),
            vissl_pil_gaussian_blur(0.5, 0.1, 2.0)]))
    simclr_specs = [
        {"name": "ImgReplicatePil", "num_times": 2},
        {"name": "RandomResizedCrop", "size": [48]},
        {"name": "RandomHorizontalFlip"},
        {"name": "ImgPilColorDistortion", "strength": 0.5},
    ]
    out.append(("simclr", "rgb444.jpg", 7, simclr_specs, [
        ImgReplicatePil(2), T.RandomResizedCrop(48), T.RandomHorizontalFlip(),
        img_pil_color_distortion(0.5)]))
    byol_specs = [
        {"name": "ImgPilToMultiCrop", "total_num_crops": 2, "num_crops": [2], "size_crops": [40],
         "crop_scales": [[0.08, 1.0]]},
        {"name": "ImgPilMultiCropRandomApply", "prob": [0.0, 1.0],
         "transforms": [{"name": "ImgPilRandomSolarize", "p": 1.0}]},
        {"name": "ImgPilMultiCropRandomApply", "prob": [0.9, 0.6],
         "transforms": [{"name": "ImgPilGaussianBlur", "p": 1.0, "radius_min": 0.1,
                         "radius_max": 2.0}]},
    ]
    for seed in range(2):
        out.append((f"byol_{seed}", "rgb420.jpg", seed, byol_specs, [
            ImgPilToMultiCrop(2, [2], [40], [(0.08, 1.0)]),
            ImgPilMultiCropRandomApply([vissl_random_solarize(1.0)], [0.0, 1.0]),
            ImgPilMultiCropRandomApply([vissl_pil_gaussian_blur(1.0, 0.1, 2.0)], [0.9, 0.6])]))
    return out


def main():
    shutil.rmtree(OUT, ignore_errors=True)
    os.makedirs(os.path.join(OUT, "expected"))
    entries = []
    for name, image, seed, specs, transforms in recipes():
        torch.manual_seed(seed)
        views = run_vissl_list(transforms, open_rgb(image))
        for k, view in enumerate(views):
            save_png(view, f"{name}_{k}")
        entries.append(dict(name=name, image=image, seed=seed, transforms=specs,
                            sizes=[[v.height, v.width] for v in views]))
    baselines = dict(
        generated_by="tests/reference/gen_multicrop_baselines.py (generated; do not edit)",
        versions=dict(torch=torch.__version__, torchvision=torchvision.__version__,
                      pillow=Image.__version__),
        resized_crops=resized_crop_cases(), recipes=entries)
    with open(os.path.join(OUT, "multicrop_baselines.json"), "w") as f:
        json.dump(baselines, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
