#!/usr/bin/env python3
"""Writes the RegNet baselines (GENERATED FILES, do not edit):

  tests/models/baselines/regnet_baselines.json        for tests/models/regnet_test.cpp
  tests/checkpoint/baselines/torchvision_regnet_small.pth
  tests/checkpoint/baselines/torchvision_regnet_small_reference.pth
                                                       for tests/checkpoint/weights_init_test.cpp

Run from the repository root with LARGO_PYTHON (scripts/torch_env.sh: the venv of
scripts/install_deps.sh, PyTorch 2.11, torchvision 0.26):
    $LARGO_PYTHON tests/reference/gen_regnet_baselines.py

regnet_baselines.json:
  "presets": for each ClassyVision preset (VISSL's MODEL.TRUNK.REGNET.name), the stage
      widths, depths and group widths of ClassyVision's formula (RegNetParams.
      get_expanded_params: float64 numpy, round half to even), written out below from its
      definition; the parameter count of torchvision's RegNet class built with exactly those
      stages and 1000 classes; and, where torchvision has the preset, the stages and the
      parameter count of torchvision's own constructor (regnet_y_400mf(), ...), which
      computes the widths in float32 and rounds with _make_divisible (its BlockParams with the
      preset's values, as the constructor passes them): for regnet_y_800mf,
      regnet_y_8gf and regnet_x_400mf those differ from ClassyVision's.
  "regnet_y_400mf_state_dict": torchvision regnet_y_400mf's state_dict names and shapes, in
      order (the C++ test maps every one onto Largo's model).

torchvision_regnet_small.pth: torch.save(model.state_dict()) of torchvision's RegNet class
  with a small RegNetY (SMALL below; the same stages by ClassyVision's and torchvision's
  formulas), 10 classes, random weights (seed 0) and random BatchNorm statistics. ~100 KB.
torchvision_regnet_small_reference.pth: {"images": [2, 3, 64, 64] float32,
  "logits_float32": the model's eval-mode logits in float32,
  "logits_float64": the same model and images converted to float64}.
"""

import math
import os

import numpy as np
import torch
import torchvision
from torchvision.models.regnet import BlockParams, RegNet

HERE = os.path.dirname(os.path.abspath(__file__))
MODELS_JSON = os.path.join(HERE, "..", "models", "baselines", "regnet_baselines.json")
CHECKPOINT_DIR = os.path.join(HERE, "..", "checkpoint", "baselines")

# ClassyVision's presets: depth, w_0, w_a, w_m, group_width, use_se.
PRESETS = {
    "regnet_y_400mf": (16, 48, 27.89, 2.09, 8, True),
    "regnet_y_800mf": (14, 56, 38.84, 2.4, 16, True),
    "regnet_y_1.6gf": (27, 48, 20.71, 2.65, 24, True),
    "regnet_y_3.2gf": (21, 80, 42.63, 2.66, 24, True),
    "regnet_y_8gf": (17, 192, 76.82, 2.19, 56, True),
    "regnet_y_16gf": (18, 200, 106.23, 2.48, 112, True),
    "regnet_y_32gf": (20, 232, 115.89, 2.53, 232, True),
    "regnet_y_64gf": (20, 352, 147.48, 2.4, 328, True),
    "regnet_y_128gf": (27, 456, 160.83, 2.52, 264, True),
    "regnet_y_256gf": (27, 640, 124.47, 2.04, 848, True),
    "regnet_x_400mf": (22, 24, 24.48, 2.54, 16, False),
    "regnet_x_800mf": (16, 56, 35.73, 2.28, 16, False),
    "regnet_x_1.6gf": (18, 80, 34.01, 2.25, 24, False),
    "regnet_x_3.2gf": (25, 88, 26.31, 2.25, 48, False),
    "regnet_x_8gf": (23, 80, 49.56, 2.88, 120, False),
    "regnet_x_16gf": (22, 216, 55.59, 2.1, 128, False),
    "regnet_x_32gf": (23, 320, 69.86, 2.0, 168, False),
}

# The parity model: MODEL.TRUNK.REGNET {depth: 6, w_0: 8, w_a: 8, w_m: 2,
# group_width: 4, stem_width: 8}, SE ratio 0.25: four stages [8, 16, 32, 64] of [1, 1, 3, 1]
# blocks, grouped 3x3 convs (2 to 16 groups).
SMALL = {"depth": 6, "w_0": 8, "w_a": 8.0, "w_m": 2.0, "group_width": 4, "stem_width": 8}


def classy_stages(depth, w_0, w_a, w_m, group_width, bottleneck_multiplier=1.0):
    """ClassyVision's get_expanded_params: (widths, depths, group widths)."""
    ramp = np.arange(depth) * w_a + w_0
    capacity = np.round(np.log(ramp / w_0) / np.log(w_m))
    block_widths = (np.round(w_0 * np.power(w_m, capacity) / 8) * 8).astype(int).tolist()
    widths, depths = [], []
    for width in block_widths:  # a stage is a run of equal widths
        if widths and widths[-1] == width:
            depths[-1] += 1
        else:
            widths.append(width)
            depths.append(1)
    bottlenecks = [int(w * bottleneck_multiplier) for w in widths]
    groups = [min(group_width, b) for b in bottlenecks]
    bottlenecks = [int(round(b / g) * g) for b, g in zip(bottlenecks, groups)]
    widths = [int(b / bottleneck_multiplier) for b in bottlenecks]
    return widths, depths, groups


def torchvision_regnet(widths, depths, groups, use_se, num_classes, stem_width=32):
    params = BlockParams(depths=depths, widths=widths, group_widths=groups,
                         bottleneck_multipliers=[1.0] * len(widths), strides=[2] * len(widths),
                         se_ratio=0.25 if use_se else None)
    return RegNet(params, num_classes=num_classes, stem_width=stem_width)


def preset_entries():
    entries = []
    for name, (depth, w_0, w_a, w_m, group_width, use_se) in PRESETS.items():
        widths, depths, groups = classy_stages(depth, w_0, w_a, w_m, group_width)
        with torch.device("meta"):
            model = torchvision_regnet(widths, depths, groups, use_se, 1000)
        entry = {"name": name, "widths": widths, "depths": depths, "group_widths": groups,
                 "num_parameters": sum(p.numel() for p in model.parameters())}
        if hasattr(torchvision.models, name.replace(".", "_")):
            # What torchvision's constructor (regnet_y_400mf(), ...) builds, on the meta
            # device (its widths are computed on the CPU first).
            tv = BlockParams.from_init_params(depth=depth, w_0=w_0, w_a=w_a, w_m=w_m,
                                              group_width=group_width,
                                              se_ratio=0.25 if use_se else None)
            with torch.device("meta"):
                tv_model = RegNet(tv, num_classes=1000)
            entry["torchvision"] = {
                "widths": tv.widths, "depths": tv.depths, "group_widths": tv.group_widths,
                "num_parameters": sum(p.numel() for p in tv_model.parameters())}
        entries.append(entry)
        print(f"{name:16} {entry['num_parameters']:>12,} parameters, widths {widths}, "
              f"torchvision {entry.get('torchvision', {}).get('widths')}")
    return entries


def write_models_json():
    import json
    model = torchvision.models.regnet_y_400mf()
    names = [[k, list(v.shape)] for k, v in model.state_dict().items()]
    with open(MODELS_JSON, "w") as f:
        json.dump({"_generated_by": "tests/reference/gen_regnet_baselines.py",
                   "_note": "GENERATED FILE, do not edit",
                   "torch_version": torch.__version__,
                   "torchvision_version": torchvision.__version__,
                   "presets": preset_entries(),
                   "regnet_y_400mf_state_dict": names}, f, indent=1)
        f.write("\n")
    print(f"wrote {MODELS_JSON}")


def write_parity_files():
    stages = classy_stages(SMALL["depth"], SMALL["w_0"], SMALL["w_a"], SMALL["w_m"],
                           SMALL["group_width"])
    tv = BlockParams.from_init_params(depth=SMALL["depth"], w_0=SMALL["w_0"], w_a=SMALL["w_a"],
                                      w_m=SMALL["w_m"], group_width=SMALL["group_width"])
    assert (tv.widths, tv.depths, tv.group_widths) == stages, (stages, tv.widths)
    torch.manual_seed(0)
    model = torchvision_regnet(*stages, use_se=True, num_classes=10,
                               stem_width=SMALL["stem_width"])
    with torch.no_grad():  # statistics and affine values that matter in eval mode
        for module in model.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                module.running_mean.uniform_(-0.2, 0.2)
                module.running_var.uniform_(0.5, 1.5)
                module.weight.uniform_(0.5, 1.5)
                module.bias.uniform_(-0.2, 0.2)
                module.num_batches_tracked.fill_(7)
            if isinstance(module, torch.nn.Linear):  # torchvision's N(0, 0.01) is tiny
                module.weight.normal_(0.0, 0.1)
                module.bias.uniform_(-0.1, 0.1)
    model.eval()
    torch.save(model.state_dict(), os.path.join(CHECKPOINT_DIR, "torchvision_regnet_small.pth"))
    images = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits32 = model(images)
        logits64 = model.double()(images.double())
    torch.save({"images": images, "logits_float32": logits32, "logits_float64": logits64},
               os.path.join(CHECKPOINT_DIR, "torchvision_regnet_small_reference.pth"))
    print(f"stages {stages}: {sum(p.numel() for p in model.parameters())} parameters; "
          f"logits {logits64.flatten()[:4].tolist()} ...")


def main():
    torch.set_num_threads(1)
    write_models_json()
    write_parity_files()


if __name__ == "__main__":
    main()
