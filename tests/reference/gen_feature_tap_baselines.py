#!/usr/bin/env python3
"""Writes tests/models/baselines/feature_tap_baselines.json (GENERATED FILE, do not edit): the
features VISSL's linear evaluation taps inside a RegNet and a ViT trunk, for
tests/models/feature_taps_test.cpp.

Run from the repository root with LARGO_PYTHON (scripts/torch_env.sh: the venv of
scripts/install_deps.sh, PyTorch 2.11, torchvision 0.26):
    $LARGO_PYTHON tests/reference/gen_feature_tap_baselines.py

The models are torchvision's, with every tensor set to the closed form of
gen_model_baselines.py (splitmix64 uniforms, the same scales; Largo's test sets its tensors the
same way through the name maps), in eval mode, on a closed-form input [2, 3, 32, 32]:
  "regnet": torchvision's RegNet class with a small RegNetY (gen_regnet_baselines.py's SMALL:
      four stages [8, 16, 32, 64] of [1, 1, 3, 1] blocks), which is ClassyVision's RegNet
      module for module. Its features as VISSL's regnet trunk names them: its _feature_blocks
      are conv1 = the stem, res2 .. res5 = trunk_output.block1 .. block4, avgpool =
      AdaptiveAvgPool2d((1, 1)), flatten = Flatten(1), run in order (model_helpers.
      get_trunk_forward_outputs).
  "vit_token" / "vit_gap": torchvision's VisionTransformer (2 or 3 layers), with and without
      the class token (Largo's CLASSIFIER token / gap; VISSL's USE_CLASS_TOKEN), its layers
      run one by one: VISSL's get_intermediate_features applies the final norm to every
      layer's output and takes lastCLS, blkCLS<i>, concatCLS<n>, lastPOOL, concatPOOL<n>,
      stridePOOL_<count>[_<stride>], lastBLK, concatBLK<n> from those (vit_features below is
      that function's selection, with the model's layers: 3, so stridePOOL_2 takes layers 2
      and 0 and stridePOOL_5_1 the 3 there are).
      Without a class token the positional embedding has one row per patch.
Each feature is stored flat with its shape.
"""

import json
import math
import os
import sys

import torch
import torch.nn as nn
from torchvision.models.vision_transformer import VisionTransformer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_model_baselines import (INPUT_KEY, closed_form, scale_and_offset,  # noqa: E402
                                 uniform_pm1, vit_largo_name)
from gen_regnet_baselines import SMALL, classy_stages, torchvision_regnet  # noqa: E402

OUTPUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "models", "baselines",
                      "feature_tap_baselines.json")
INPUT_SHAPE = (2, 3, 32, 32)


def set_closed_form(model, skip=(), to_largo=None):
    """Every float tensor of state_dict to its closed form; the list the C++ test replays
    (with Largo's name where given; the RegNet's the test maps with
    regnet_name_from_torchvision)."""
    tensors = []
    with torch.no_grad():
        for k, (name, tensor) in enumerate(model.state_dict().items()):
            if name.endswith("num_batches_tracked") or name in skip:
                continue
            scale, offset = scale_and_offset(name, tensor)
            tensor.copy_(closed_form(k, tensor.numel(), scale, offset).view(tensor.shape))
            tensors.append({"torchvision_name": name, "shape": list(tensor.shape), "k": k,
                            "scale": scale, "offset": offset})
            if to_largo:
                tensors[-1]["largo_name"] = to_largo(name)
    return tensors


def closed_form_input():
    x = torch.from_numpy(uniform_pm1(INPUT_KEY, math.prod(INPUT_SHAPE))).to(torch.float32)
    return x.view(INPUT_SHAPE)


def regnet_features(model, x):
    """VISSL's regnet trunk: its feature blocks in order, each output kept by name."""
    blocks = [("conv1", model.stem)]
    for _, stage in model.trunk_output.named_children():
        blocks.append((f"res{len(blocks) + 1}", stage))
    blocks += [("avgpool", nn.AdaptiveAvgPool2d((1, 1))), ("flatten", nn.Flatten(1))]
    features = {}
    for name, block in blocks:
        x = block(x)
        features[name] = x
    return features


def vit_interms(model, x, class_token):
    """VISSL's prepare_tokens and per-layer norm: [the final norm of each layer's output]."""
    x = model._process_input(x)  # conv_proj -> [b, n, d]
    if class_token:
        x = torch.cat([model.class_token.expand(x.shape[0], -1, -1), x], dim=1)
    x = x + model.encoder.pos_embedding
    interms = []
    for layer in model.encoder.layers:
        x = layer(x)
        interms.append(model.encoder.ln(x))
    return interms


def vit_features(interms, names):
    """VISSL's get_intermediate_features, its selection of the features from interms."""
    def avg_pool(x):  # FeatAvgPool: AdaptiveAvgPool1d(1) over the tokens
        return nn.AdaptiveAvgPool1d(1)(x.permute((0, 2, 1))).squeeze(-1)

    output = {}
    for name in names:
        if name.startswith("blkCLS"):
            output[name] = interms[int(name.replace("blkCLS", ""))][:, 0]
        elif name.startswith("concatCLS"):
            v = int(name.replace("concatCLS", ""))
            output[name] = torch.cat([x[:, 0] for x in interms[-v:]], dim=-1)
        elif name == "lastCLS":
            output[name] = interms[-1][:, 0]
        elif name == "lastPOOL":
            output[name] = avg_pool(interms[-1])
        elif name.startswith("concatPOOL"):
            v = int(name.replace("concatPOOL", ""))
            output[name] = torch.cat([avg_pool(x) for x in interms[-v:]], dim=-1)
        elif name == "lastBLK":
            output[name] = interms[-1]
        elif name.startswith("concatBLK"):
            v = int(name.replace("concatBLK", ""))
            output[name] = torch.cat(interms[-v:], dim=-1)
        elif name.startswith("stridePOOL"):
            parts = [int(s) for s in name.replace("stridePOOL_", "").split("_")]
            if len(parts) == 2:
                count, stride = parts
            else:
                count = parts[0]
                stride, r = divmod(len(interms), count)
                stride = stride + 1 if r else stride
            output[name] = torch.cat([avg_pool(x) for x in interms[::-stride][:count]], dim=-1)
    return output


def as_json(features):
    return {name: {"shape": list(value.shape), "values": [float(v) for v in value.flatten()]}
            for name, value in features.items()}


def regnet_case():
    stages = classy_stages(SMALL["depth"], SMALL["w_0"], SMALL["w_a"], SMALL["w_m"],
                           SMALL["group_width"])
    model = torchvision_regnet(*stages, use_se=True, num_classes=10,
                               stem_width=SMALL["stem_width"]).eval()
    tensors = set_closed_form(model)
    with torch.no_grad():
        features = regnet_features(model, closed_form_input())
    return {"name": "regnet", "regnet": SMALL, "input_key": INPUT_KEY,
            "input_shape": list(INPUT_SHAPE), "tensors": tensors, "features": as_json(features)}


def vit_case(name, class_token, names):
    args = dict(image_size=32, patch_size=8, num_layers=3, num_heads=4, hidden_dim=32,
                mlp_dim=64, num_classes=10)
    model = VisionTransformer(**args).eval()
    skip = ()
    if not class_token:
        patches = (args["image_size"] // args["patch_size"]) ** 2
        model.encoder.pos_embedding = nn.Parameter(torch.zeros(1, patches, args["hidden_dim"]))
        skip = ("class_token",)
    tensors = set_closed_form(model, skip, lambda n: vit_largo_name(n, args["num_layers"]))
    with torch.no_grad():
        features = vit_features(vit_interms(model, closed_form_input(), class_token), names)
    return {"name": name, "vit": args, "classifier": "token" if class_token else "gap",
            "input_key": INPUT_KEY, "input_shape": list(INPUT_SHAPE), "tensors": tensors,
            "features": as_json(features)}


def main():
    torch.set_num_threads(1)
    torch.manual_seed(0)
    cases = [
        regnet_case(),
        vit_case("vit_token", True, ["lastCLS", "blkCLS0", "blkCLS1", "concatCLS2",
                                     "concatCLS3", "lastBLK", "concatBLK2"]),
        vit_case("vit_gap", False, ["lastPOOL", "concatPOOL2", "concatPOOL3", "stridePOOL_2",
                                    "stridePOOL_2_1", "stridePOOL_5_1", "lastBLK",
                                    "concatBLK3"]),
    ]
    baselines = {
        "_generated_by": "tests/reference/gen_feature_tap_baselines.py",
        "_note": "GENERATED FILE, do not edit. Regenerate with "
                 "$LARGO_PYTHON tests/reference/gen_feature_tap_baselines.py",
        "torch_version": torch.__version__,
        "cases": cases,
    }
    with open(OUTPUT, "w") as f:
        json.dump(baselines, f, indent=1)
        f.write("\n")
    print(f"wrote {os.path.normpath(OUTPUT)}")


if __name__ == "__main__":
    main()
