#!/usr/bin/env python3
"""Weights files for tests/checkpoint/weights_init_test.cpp (MODEL.WEIGHTS_INIT). Run with
LARGO_PYTHON (scripts/torch_env.sh: the venv of scripts/install_deps.sh, PyTorch 2.11):

  $LARGO_PYTHON tests/reference/gen_weights_init_files.py
      rewrites tests/checkpoint/baselines/torchvision_resnet_names.json: the state_dict names
      and shapes of torchvision's ResNet-18 and ResNet-50 (checked in, small)
  $LARGO_PYTHON tests/reference/gen_weights_init_files.py --files DIR
      writes into DIR (the test does this at run time; the files are ~45 MB):
        torchvision_resnet18.pth  torch.save(model.state_dict()) of a torchvision ResNet-18
                                  with random weights and BatchNorm statistics
        vissl_resnet18.torch      the same weights in VISSL's checkpoint layout:
                                  {"classy_state_dict": {"base_model": {"model": {
                                     "trunk": {"_feature_blocks.<name>": ...},
                                     "heads": {"0.clf.0.weight": fc.weight, ...}}}}, ...}
        reference.json            an input batch and the model's eval-mode logits for it
"""

import argparse
import json
import os

import torch
import torchvision

NAMES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "checkpoint",
                     "baselines", "torchvision_resnet_names.json")


def write_names():
    names = {}
    for depth in (18, 50):
        model = getattr(torchvision.models, f"resnet{depth}")()
        names[f"resnet{depth}"] = [[k, list(v.shape)] for k, v in model.state_dict().items()]
    with open(NAMES, "w") as f:
        json.dump({"generated_by": "tests/reference/gen_weights_init_files.py",
                   "torchvision_version": torchvision.__version__, "names": names}, f)
        f.write("\n")
    print(f"wrote {NAMES}")


def write_files(directory):
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=10)
    with torch.no_grad():  # statistics that matter in eval mode
        for module in model.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                module.running_mean.uniform_(-0.2, 0.2)
                module.running_var.uniform_(0.5, 1.5)
                module.weight.uniform_(0.5, 1.5)
                module.bias.uniform_(-0.2, 0.2)
                module.num_batches_tracked.fill_(7)
    model.eval()
    state = model.state_dict()  # an OrderedDict, as users save it
    torch.save(state, os.path.join(directory, "torchvision_resnet18.pth"))
    trunk = {f"_feature_blocks.{k}": v for k, v in state.items() if not k.startswith("fc.")}
    heads = {"0.clf.0.weight": state["fc.weight"], "0.clf.0.bias": state["fc.bias"]}
    vissl = {"phase_idx": 3, "iteration": 400, "type": "consolidated",
             "classy_state_dict": {"base_model": {"model": {"trunk": trunk, "heads": heads},
                                                  "meta": {}},
                                   "train_phase_idx": 3}}
    torch.save(vissl, os.path.join(directory, "vissl_resnet18.torch"))
    images = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits = model(images)
    with open(os.path.join(directory, "reference.json"), "w") as f:
        json.dump({"images": images.flatten().tolist(), "logits": logits.flatten().tolist()}, f)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--files", help="write the weights files into this directory")
    args = parser.parse_args()
    if args.files:
        write_files(args.files)
    else:
        write_names()


if __name__ == "__main__":
    main()
