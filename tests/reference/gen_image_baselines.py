#!/usr/bin/env python3
"""Writes tests/data/baselines/images/: small images and what torchvision (PIL path) makes of
them, for Largo's image pipeline tests (tests/data/image_*_test.cpp, sample_transforms_test.cpp).

  fixtures/*.jpg|png    deterministic synthetic images (gradients, edges, mild noise) encoded
                        by PIL: JPEG 4:2:0 / 4:4:4 / progressive / grayscale / CMYK, PNG RGB /
                        gray / palette / RGBA
  decoded/<name>.png    PIL's Image.open(f).convert("RGB") of the colour-conversion fixtures
  expected/<case>.png   torchvision's output image (before ToTensor) for each transform case
  image_baselines.json  the cases, RandomResizedCrop boxes per seed, ImageFolder's sample
                        order for a tree of paths, the .npy files NumPy writes

Run from the repository root with LARGO_PYTHON (scripts/torch_env.sh: the venv of
scripts/install_deps.sh, PyTorch 2.11, torchvision 0.26, Pillow 13.0, NumPy 2.4):
  $LARGO_PYTHON tests/reference/gen_image_baselines.py
"""
import base64
import io
import json
import os
import shutil
import tempfile

import numpy as np
import torch
import torchvision
from PIL import Image, ImageFilter, ImageOps
from torchvision import transforms as T
from torchvision.transforms import functional as F

# Fixtures whose full decode is stored too (colour conversions beyond plain YCbCr/RGB).
DECODED = ["gray.jpg", "cmyk.jpg", "gray.png", "palette.png", "rgba.png"]

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "data", "baselines", "images")


def pattern(width, height, seed):
    """Smooth colour gradients, a few sharp-edged rectangles and +-4 noise: every JPEG and
    resampling path sees edges and texture, yet the PNGs stay small."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float64)
    image = np.stack([
        255 * x / max(width - 1, 1),
        255 * y / max(height - 1, 1),
        127.5 + 100 * np.sin(x / 7.0 + seed) * np.cos(y / 11.0),
    ], axis=-1)
    for _ in range(4):
        x0, y0 = rng.integers(0, width - 8), rng.integers(0, height - 8)
        w, h = rng.integers(4, width // 2), rng.integers(4, height // 2)
        image[y0:y0 + h, x0:x0 + w] = rng.integers(0, 256, size=3)
    image += rng.integers(-4, 5, size=image.shape)
    return np.clip(image, 0, 255).astype(np.uint8)


def fixtures():
    """name -> encoded bytes."""
    files = {}

    def save(name, image, **kwargs):
        buffer = io.BytesIO()
        image.save(buffer, **kwargs)
        files[name] = buffer.getvalue()

    rgb = Image.fromarray(pattern(200, 150, 1))
    save("rgb420.jpg", rgb, format="JPEG", quality=90)
    save("rgb444.jpg", Image.fromarray(pattern(150, 200, 2)), format="JPEG", quality=90, subsampling=0)
    save("progressive.jpg", Image.fromarray(pattern(161, 97, 3)), format="JPEG", quality=85, progressive=True)
    save("gray.jpg", Image.fromarray(pattern(120, 90, 4)).convert("L"), format="JPEG", quality=90)
    save("cmyk.jpg", Image.fromarray(pattern(100, 80, 5)).convert("CMYK"), format="JPEG", quality=90)
    save("large.jpg", Image.fromarray(pattern(600, 450, 6)), format="JPEG", quality=90)
    save("rgb.png", Image.fromarray(pattern(90, 70, 7)), format="PNG")
    save("gray.png", Image.fromarray(pattern(64, 48, 8)).convert("L"), format="PNG")
    save("palette.png", Image.fromarray(pattern(64, 48, 9)).convert("P", palette=Image.ADAPTIVE, colors=32), format="PNG")
    rgba = Image.fromarray(pattern(64, 48, 10)).convert("RGBA")
    rgba.putalpha(Image.fromarray((pattern(64, 48, 11)[:, :, 0])))
    save("rgba.png", rgba, format="PNG")
    return files


def open_rgb(data):
    return Image.open(io.BytesIO(data)).convert("RGB")


def png_bytes(image):
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


# Each case: a fixture, the transform list as Largo's config writes it, torchvision's
# equivalent, and the seed of the generator its random draws come from (torch.manual_seed).
def cases():
    bilinear = T.InterpolationMode.BILINEAR
    norm = dict(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])
    out = []

    def add(name, image, specs, transform, seed=0):
        out.append(dict(name=name, image=image, specs=specs, transform=transform, seed=seed))

    # The validation transform, at ImageNet's size on the large image and at half that on the
    # small ones (the same code paths, smaller expected files).
    add("val256_large_jpg", "large.jpg", [{"name": "Resize", "size": [256]}, {"name": "CenterCrop", "size": [224]}],
        T.Compose([T.Resize(256), T.CenterCrop(224)]))
    for image in ["rgb420.jpg", "rgb444.jpg", "progressive.jpg", "gray.jpg", "cmyk.jpg", "rgb.png", "palette.png",
                  "rgba.png"]:
        add("val128_" + image.replace(".", "_"), image,
            [{"name": "Resize", "size": [128]}, {"name": "CenterCrop", "size": [112]}],
            T.Compose([T.Resize(128), T.CenterCrop(112)]))
    add("val64_large_jpg", "large.jpg", [{"name": "Resize", "size": [64]}, {"name": "CenterCrop", "size": [56]}],
        T.Compose([T.Resize(64), T.CenterCrop(56)]))
    add("resize_hw_bicubic", "rgb420.jpg", [{"name": "Resize", "size": [37, 91], "interpolation": "bicubic"}],
        T.Resize((37, 91), interpolation=T.InterpolationMode.BICUBIC))
    for mode in ["nearest", "box", "hamming", "lanczos"]:
        add("resize_" + mode, "rgb444.jpg", [{"name": "Resize", "size": [61], "interpolation": mode}],
            T.Resize(61, interpolation=T.InterpolationMode(mode)))
    add("centercrop_pad", "gray.png", [{"name": "CenterCrop", "size": [60, 71]}], T.CenterCrop((60, 71)))
    for seed in range(4):
        add(f"train_rrc_flip_{seed}", "rgb420.jpg",
            [{"name": "RandomResizedCrop", "size": [64]}, {"name": "RandomHorizontalFlip"}],
            T.Compose([T.RandomResizedCrop(64, interpolation=bilinear), T.RandomHorizontalFlip()]), seed)
    add("train_large_rrc", "large.jpg",
        [{"name": "RandomResizedCrop", "size": [96], "scale": [0.5, 1.0]}, {"name": "RandomHorizontalFlip"}],
        T.Compose([T.RandomResizedCrop(96, scale=(0.5, 1.0)), T.RandomHorizontalFlip()]), 5)
    # RandomCrop before ToTensor (VISSL's fairness and jigsaw configs): its randint draws,
    # zero padding, pad_if_needed on both sides of the short axis, and no draw when the
    # padded image is the crop (the flip after it then takes the first draw).
    for seed in range(3):
        add(f"randomcrop_{seed}", "rgb.png", [{"name": "RandomCrop", "size": [48]}], T.RandomCrop(48), seed)
    add("randomcrop_pad_if_needed", "rgb.png",
        [{"name": "RandomCrop", "size": [60, 100], "padding": 4, "pad_if_needed": "True"}],
        T.RandomCrop((60, 100), padding=4, pad_if_needed=True), 3)
    add("randomcrop_exact_then_flip", "rgb.png",
        [{"name": "RandomCrop", "size": [70, 90]}, {"name": "RandomHorizontalFlip", "p": 0.5}],
        T.Compose([T.RandomCrop((70, 90)), T.RandomHorizontalFlip(0.5)]), 1)
    add("resize_randomcrop", "large.jpg",
        [{"name": "Resize", "size": [64]}, {"name": "RandomCrop", "size": [56]}],
        T.Compose([T.Resize(64), T.RandomCrop(56)]), 6)
    for seed in range(3):
        add(f"colorjitter_{seed}", "rgb.png",
            [{"name": "ColorJitter", "brightness": 0.4, "contrast": 0.4, "saturation": 0.4, "hue": 0.1}],
            T.ColorJitter(0.4, 0.4, 0.4, 0.1), seed)
    add("colorjitter_ranges", "rgb.png",
        [{"name": "ColorJitter", "brightness": [1.2, 1.6], "contrast": [0.3, 0.6], "hue": [-0.4, -0.2]}],
        T.ColorJitter(brightness=(1.2, 1.6), contrast=(0.3, 0.6), hue=(-0.4, -0.2)), 7)
    add("grayscale", "rgb.png", [{"name": "RandomGrayscale", "p": 1.0}], T.RandomGrayscale(p=1.0))
    add("gaussian_blur", "rgb.png", [{"name": "GaussianBlur", "kernel_size": [9, 5], "sigma": [0.5, 2.0]}],
        T.GaussianBlur((9, 5), sigma=(0.5, 2.0)), 3)
    add("pil_gaussian_blur", "rgb.png",
        [{"name": "ImgPilGaussianBlur", "p": 1.0, "radius_min": 0.5, "radius_max": 2.5}],
        vissl_pil_gaussian_blur(1.0, 0.5, 2.5), 4)
    add("solarize", "rgb.png", [{"name": "ImgPilRandomSolarize", "p": 1.0}], vissl_random_solarize(1.0), 2)
    add("full_train", "rgb444.jpg",
        [{"name": "RandomResizedCrop", "size": [48]}, {"name": "RandomHorizontalFlip"},
         {"name": "ColorJitter", "brightness": 0.4, "contrast": 0.4, "saturation": 0.4, "hue": 0.1},
         {"name": "RandomGrayscale", "p": 0.2}],
        T.Compose([T.RandomResizedCrop(48), T.RandomHorizontalFlip(), T.ColorJitter(0.4, 0.4, 0.4, 0.1),
                   T.RandomGrayscale(0.2)]), 11)
    return out, norm


def vissl_pil_gaussian_blur(p, radius_min, radius_max):
    """VISSL's ImgPilGaussianBlur with its draws taken from torch, as Largo draws them:
    blur when torch.rand(1) <= p, radius = float(torch.empty(1).uniform_(min, max))."""
    def apply(image):
        if not bool(torch.rand(1) <= p):
            return image
        radius = float(torch.empty(1).uniform_(radius_min, radius_max))
        return image.filter(ImageFilter.GaussianBlur(radius=radius))
    return apply


def vissl_random_solarize(prob):
    """VISSL's ImgPilRandomSolarize (RandomApply, threshold in 0..256) with torch draws."""
    def apply(image):
        if prob < torch.rand(1):
            return image
        threshold = int(torch.randint(0, 257, (1,)))
        return ImageOps.solarize(image, threshold)
    return apply


def rrc_boxes():
    """RandomResizedCrop.get_params for many seeds and image sizes (torch.manual_seed(seed))."""
    boxes = []
    settings = [((0.08, 1.0), (3 / 4, 4 / 3)), ((0.5, 0.9), (0.2, 5.0)), ((0.9, 1.0), (2.5, 3.0))]
    sizes = [(375, 500), (500, 375), (224, 224), (50, 400), (13, 7), (1, 1)]
    for seed in range(300):
        height, width = sizes[seed % len(sizes)]
        scale, ratio = settings[seed % len(settings)]
        torch.manual_seed(seed)
        image = Image.new("RGB", (width, height))
        i, j, h, w = T.RandomResizedCrop.get_params(image, scale, ratio)
        boxes.append(dict(seed=seed, height=height, width=width, scale=list(scale), ratio=list(ratio),
                          box=[i, j, h, w]))
    return boxes


def image_folder_order(tmp):
    """The sample order torchvision's ImageFolder gives for a tree of files (relative paths)."""
    files = ["b/z.JPG", "b/a.png", "b/sub/x.jpeg", "b/sub2/y.webp", "b/sub/.hidden.jpg",
             "a/notes.txt", "a/img10.jpg", "a/img2.jpg", "a/Img3.jpg", "a/deep/er/k.png",
             "c_empty_but_nested/more/x.tif", ".hidden_class/q.jpg", "a b/é.jpg", "a b/e.jpg"]
    root = os.path.join(tmp, "tree")
    for relative in files:
        path = os.path.join(root, relative)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(b"x")
    dataset = torchvision.datasets.ImageFolder(root, loader=lambda p: p)
    return dict(files=files, classes=dataset.classes,
                samples=[[os.path.relpath(p, root), c] for p, c in dataset.samples])


def npy_files():
    """What NumPy writes, for the reader (and the writer's byte-for-byte check)."""
    arrays = {
        "paths_unicode.npy": np.array(["/data/a/1.jpg", "/data/é/2.png", ""]),
        "paths_bytes.npy": np.array([b"/x/1.jpg", b"/yy/22.jpg"]),
        "labels_int64.npy": np.array([0, 5, 2, 9], dtype=np.int64),
        "labels_int32_big.npy": np.array([3, 1, 70000], dtype=">i4"),
        "floats_2d.npy": np.arange(6, dtype=np.float32).reshape(2, 3) / 4,
    }
    out = {}
    for name, array in arrays.items():
        buffer = io.BytesIO()
        np.save(buffer, array)
        out[name] = base64.b64encode(buffer.getvalue()).decode()
    return out


def main():
    shutil.rmtree(OUT, ignore_errors=True)
    for sub in ["fixtures", "decoded", "expected"]:
        os.makedirs(os.path.join(OUT, sub))
    files = fixtures()
    for name, data in files.items():
        with open(os.path.join(OUT, "fixtures", name), "wb") as f:
            f.write(data)
        if name in DECODED:
            with open(os.path.join(OUT, "decoded", name.replace(".", "_") + ".png"), "wb") as f:
                f.write(png_bytes(open_rgb(data)))
    case_list, norm = cases()
    entries = []
    for case in case_list:
        torch.manual_seed(case["seed"])
        result = case["transform"](open_rgb(files[case["image"]]))
        with open(os.path.join(OUT, "expected", case["name"] + ".png"), "wb") as f:
            f.write(png_bytes(result))
        entries.append(dict(name=case["name"], image=case["image"], seed=case["seed"], transforms=case["specs"],
                            size=[result.height, result.width]))
    # ToTensor + Normalize on every uint8 value, per channel: the float tail Largo fuses.
    values = torch.arange(256, dtype=torch.uint8).view(1, 1, 256).expand(3, 1, 256).numpy().transpose(1, 2, 0)
    normalized = T.Normalize(**norm)(T.ToTensor()(np.ascontiguousarray(values)))
    with tempfile.TemporaryDirectory() as tmp:
        folder = image_folder_order(tmp)
    baselines = dict(
        generated_by="tests/reference/gen_image_baselines.py (generated; do not edit)",
        versions=dict(torch=torch.__version__, torchvision=torchvision.__version__,
                      pillow=Image.__version__, numpy=np.__version__),
        cases=entries, normalize=norm,
        normalized_values=normalized.reshape(3, 256).tolist(),
        rrc_boxes=rrc_boxes(), image_folder=folder, npy=npy_files())
    with open(os.path.join(OUT, "image_baselines.json"), "w") as f:
        json.dump(baselines, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
