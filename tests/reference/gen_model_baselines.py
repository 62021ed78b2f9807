#!/usr/bin/env python3
"""Writes tests/models/baselines/model_baselines.json: torchvision's answers for Largo's
model zoo tests (tests/models/torchvision_parity_test.cpp).

Run from the repository root with LARGO_PYTHON (scripts/torch_env.sh: the venv of
scripts/install_deps.sh, PyTorch 2.11, torchvision 0.26):
    $LARGO_PYTHON tests/reference/gen_model_baselines.py

Two kinds of cases:
  "structure": torchvision resnet18 / resnet50 with 1000 classes: every parameter and
      buffer in state_dict order, with its shape and the name Largo gives it; the C++ test
      requires the same sequence of names and shapes and the same parameter count.
  "numeric": small models in eval mode whose every tensor is set to a closed form, and
      their output for a closed-form input. With u(k, i) = splitmix64(k * 2^32 + i) / 2^64,
      a uniform number in [0, 1) computed with exact integer arithmetic on both sides:
      tensor k of the list (state_dict order), flat element i:
          offset_k + scale_k * (2 u(k, i) - 1)            (float64 -> float32)
      input, flat element i:  2 u(INPUT_KEY, i) - 1
      The C++ test sets Largo's tensors the same way through the name map and compares
      outputs. ResNet-18 "cifar" is torchvision's resnet18 with conv1 = 3x3 stride 1 and
      no max pool (Largo's "cifar" stem); the ViT case uses torchvision's
      VisionTransformer, whose attention always has a qkv bias (Largo's qkv_bias = true).
"""

import json
import math
import os

import numpy as np
import torch
import torch.nn as nn
import torchvision
from torchvision.models.vision_transformer import VisionTransformer

OUTPUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "models", "baselines",
                      "model_baselines.json")

RESNET_STAGES = {18: [2, 2, 2, 2], 34: [3, 4, 6, 3], 50: [3, 4, 6, 3]}


def resnet_largo_name(name, depth):
    """torchvision resnet name -> Largo name (trunk.<block>.*, head.0.*)."""
    parts = name.split(".")
    if parts[0] in ("conv1", "bn1"):
        return "trunk.0." + name
    if parts[0] == "fc":
        return "head.0." + parts[1]
    assert parts[0].startswith("layer"), name
    stage = int(parts[0][len("layer"):]) - 1
    block = 1 + sum(RESNET_STAGES[depth][:stage]) + int(parts[1])
    return f"trunk.{block}." + ".".join(parts[2:])


def vit_largo_name(name, num_layers):
    """torchvision VisionTransformer name -> Largo name."""
    fixed = {
        "class_token": "trunk.0.class_token",
        "conv_proj.weight": "trunk.0.conv_proj.weight",
        "conv_proj.bias": "trunk.0.conv_proj.bias",
        "encoder.pos_embedding": "trunk.0.pos_embedding",
        "encoder.ln.weight": f"trunk.{num_layers + 1}.norm.weight",
        "encoder.ln.bias": f"trunk.{num_layers + 1}.norm.bias",
        "heads.head.weight": "head.0.weight",
        "heads.head.bias": "head.0.bias",
    }
    if name in fixed:
        return fixed[name]
    prefix = "encoder.layers.encoder_layer_"
    assert name.startswith(prefix), name
    layer, rest = name[len(prefix):].split(".", 1)
    inner = {
        "ln_1.weight": "norm1.weight", "ln_1.bias": "norm1.bias",
        "self_attention.in_proj_weight": "qkv.weight", "self_attention.in_proj_bias": "qkv.bias",
        "self_attention.out_proj.weight": "proj.weight",
        "self_attention.out_proj.bias": "proj.bias",
        "ln_2.weight": "norm2.weight", "ln_2.bias": "norm2.bias",
        "mlp.0.weight": "fc1.weight", "mlp.0.bias": "fc1.bias",
        "mlp.3.weight": "fc2.weight", "mlp.3.bias": "fc2.bias",
    }[rest]
    return f"trunk.{int(layer) + 1}.{inner}"


INPUT_KEY = 1000003


def splitmix64(x):
    """splitmix64 finalizer on a uint64 numpy array (wrapping arithmetic, as in C++)."""
    with np.errstate(over="ignore"):
        z = x + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def uniform_pm1(key, numel):
    """2 u - 1 in [-1, 1) as float64, u = top 53 bits of splitmix64(key * 2^32 + i)."""
    x = (np.uint64(key) << np.uint64(32)) + np.arange(numel, dtype=np.uint64)
    u = (splitmix64(x) >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))
    return 2.0 * u - 1.0


def scale_and_offset(name, tensor):
    """Magnitudes that keep activations O(1) and input-dependent through the network."""
    leaf = name.split(".")[-1]
    if leaf == "running_var":
        return 0.25, 1.25  # in [1, 1.5)
    if leaf == "running_mean":
        return 0.1, 0.0
    if tensor.dim() == 1:
        # The only 1-D weights in these models are BatchNorm/LayerNorm scales.
        return (0.2, 1.0) if leaf == "weight" else (0.1, 0.0)
    if name in ("class_token", "encoder.pos_embedding"):
        return 0.5, 0.0
    fan_in = tensor.numel() // tensor.shape[0]
    return math.sqrt(6.0 / fan_in), 0.0  # He-uniform: variance 2 / fan_in


def closed_form(k, numel, scale, offset):
    return torch.from_numpy(offset + scale * uniform_pm1(k, numel)).to(torch.float32)


def structure_case(depth, model):
    params = [[n, list(p.shape), resnet_largo_name(n, depth)] for n, p in model.named_parameters()]
    buffers = [[n, list(b.shape), resnet_largo_name(n, depth)] for n, b in model.named_buffers()]
    return {
        "name": f"resnet{depth}",
        "depth": depth,
        "num_classes": 1000,
        "num_parameters": sum(p.numel() for p in model.parameters()),
        "parameters": params,
        "buffers": buffers,
    }


def numeric_case(name, model, to_largo, input_shape, extra):
    model.eval()
    tensors = []
    with torch.no_grad():
        for k, (tv_name, tensor) in enumerate(model.state_dict().items()):
            if tv_name.endswith("num_batches_tracked"):
                continue  # unused in eval mode
            scale, offset = scale_and_offset(tv_name, tensor)
            tensor.copy_(closed_form(k, tensor.numel(), scale, offset).view(tensor.shape))
            tensors.append({"torchvision_name": tv_name, "largo_name": to_largo(tv_name),
                            "shape": list(tensor.shape), "k": k, "scale": scale,
                            "offset": offset})
        numel = math.prod(input_shape)
        x = torch.from_numpy(uniform_pm1(INPUT_KEY, numel)).to(torch.float32)
        output = model(x.view(input_shape))
    case = {"name": name, "input_key": INPUT_KEY, "input_shape": list(input_shape),
            "tensors": tensors,
            "output_shape": list(output.shape),
            "output": [float(v) for v in output.flatten()]}
    case.update(extra)
    return case


def main():
    torch.set_num_threads(1)
    torch.manual_seed(0)
    structures = [
        structure_case(18, torchvision.models.resnet18(num_classes=1000)),
        structure_case(50, torchvision.models.resnet50(num_classes=1000)),
    ]

    resnet18_cifar = torchvision.models.resnet18(num_classes=10)
    resnet18_cifar.conv1 = nn.Conv2d(3, 64, kernel_size=3, stride=1, padding=1, bias=False)
    resnet18_cifar.maxpool = nn.Identity()
    vit_args = dict(image_size=32, patch_size=8, num_layers=2, num_heads=4, hidden_dim=64,
                    mlp_dim=128, num_classes=10)
    numerics = [
        numeric_case("resnet18_imagenet_stem", torchvision.models.resnet18(num_classes=10),
                     lambda n: resnet_largo_name(n, 18), (2, 3, 64, 64),
                     {"depth": 18, "stem": "imagenet", "num_classes": 10}),
        numeric_case("resnet18_cifar_stem", resnet18_cifar,
                     lambda n: resnet_largo_name(n, 18), (2, 3, 32, 32),
                     {"depth": 18, "stem": "cifar", "num_classes": 10}),
        numeric_case("resnet50_imagenet_stem", torchvision.models.resnet50(num_classes=10),
                     lambda n: resnet_largo_name(n, 50), (2, 3, 64, 64),
                     {"depth": 50, "stem": "imagenet", "num_classes": 10}),
        numeric_case("vit", VisionTransformer(**vit_args),
                     lambda n: vit_largo_name(n, vit_args["num_layers"]), (2, 3, 32, 32),
                     {"vit": vit_args}),
    ]

    baselines = {
        "_generated_by": "tests/reference/gen_model_baselines.py",
        "_note": "GENERATED FILE, do not edit. Regenerate with "
                 "$LARGO_PYTHON tests/reference/gen_model_baselines.py",
        "torch_version": torch.__version__,
        "torchvision_version": torchvision.__version__,
        "structure": structures,
        "numeric": numerics,
    }
    os.makedirs(os.path.dirname(OUTPUT), exist_ok=True)
    with open(OUTPUT, "w") as f:
        json.dump(baselines, f, indent=1)
        f.write("\n")
    print(f"wrote {os.path.normpath(OUTPUT)}")


if __name__ == "__main__":
    main()
