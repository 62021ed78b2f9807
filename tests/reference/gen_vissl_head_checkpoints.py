#!/usr/bin/env python3
"""VISSL checkpoints of the self-supervised recipes in tests/train/trainer_self_supervised_test.cpp,
for its test that MODEL.WEIGHTS_INIT loads every head type from VISSL's names. Run with
LARGO_PYTHON (scripts/torch_env.sh: the venv of scripts/install_deps.sh, PyTorch 2.11); the
test does, at run time:

  $LARGO_PYTHON tests/reference/gen_vissl_head_checkpoints.py DIR

For each case it writes into DIR:
  <case>.torch           a checkpoint in VISSL's layout (vissl/utils/checkpoint.py with
                         BaseSSLMultiInputOutputModel.get_classy_state):
                           {"type": "consolidated", "phase_idx": ..., "iteration": ...,
                            "classy_state_dict": {"base_model": {
                               "model": {"trunk": trunk.state_dict(), "heads": heads.state_dict()},
                               "meta": {"trunk": {}, "heads": []}}, ...}}
                         the trunk a ResNet-18 named as VISSL's resnet trunk names it
                         ("_feature_blocks." + torchvision's names, fc left out), the heads a
                         torch.nn.ModuleList built as VISSL's head classes build theirs
                         (vissl/models/heads/swav_prototypes_head.py, mlp.py, dino_head.py): same modules,
                         same order, same attribute names, random values.
  <case>_expected.torch  {Largo's name: tensor} of every head parameter and buffer: the same
                         modules put into one flat torch.nn.Sequential the way Largo builds its
                         head (an mlp chain's layers one after another; a swav_head as element
                         0), named by PyTorch itself, "head." + the Sequential's names.

Cases (the dims are the test's):
  swav          swav_head, dims [512, 64, 16], use_bn, num_clusters [10, 6]
  simclr        mlp [512, 64] with ReLU (skip_last_layer_relu_bn False), mlp [64, 16]
  barlow_twins  VISSL's Barlow Twins projection, small: mlp [512, 32] and [32, 32] with
                BatchNorm and ReLU and no bias, mlp [32, 16] without bias
  dino          dino_head, in_dim 512, hidden_dim 32, bottleneck_dim 8, num_clusters [16],
                use_bn, normalize_last_layer False (weight_g trained)
"""

import os
import sys

import torch
import torchvision
from torch import nn


class VisslMlp(nn.Module):
    """VISSL's mlp head (vissl/models/heads/mlp.py): its layers in `clf`."""

    def __init__(self, dims, use_bn=False, use_relu=False, use_bias=True,
                 skip_last_layer_relu_bn=True):
        super().__init__()
        layers = []
        for i in range(len(dims) - 1):
            layers.append(nn.Linear(dims[i], dims[i + 1], bias=use_bias))
            if i == len(dims) - 2 and skip_last_layer_relu_bn:
                break
            if use_bn:
                layers.append(nn.BatchNorm1d(dims[i + 1]))
            if use_relu:
                layers.append(nn.ReLU(inplace=True))
        self.clf = nn.Sequential(*layers)


class VisslSwavHead(nn.Module):
    """VISSL's swav_head (vissl/models/heads/swav_prototypes_head.py): `projection_head`,
    then `prototypes<j>` (Linear without bias) per cluster set."""

    def __init__(self, dims, use_bn, num_clusters):
        super().__init__()
        layers = []
        for i in range(len(dims) - 1):
            layers.append(nn.Linear(dims[i], dims[i + 1]))
            if i == len(dims) - 2:  # skip_last_bn (VISSL's default)
                break
            if use_bn:
                layers.append(nn.BatchNorm1d(dims[i + 1]))
            layers.append(nn.ReLU(inplace=True))
        self.projection_head = nn.Sequential(*layers)
        for j, k in enumerate(num_clusters):
            self.add_module(f"prototypes{j}", nn.Linear(dims[-1], k, bias=False))


class VisslDinoHead(nn.Module):
    """VISSL's dino_head (vissl/models/heads/dino_head.py) with num_layers 3: `mlp` (Linear,
    BatchNorm1d with use_bn, GELU, twice, then Linear to the bottleneck), then `prototypes0`,
    a Linear without bias under torch.nn.utils.weight_norm (weight_g, weight_v)."""

    def __init__(self, in_dim, hidden_dim, bottleneck_dim, num_clusters, use_bn):
        super().__init__()
        layers = []
        for i, width in enumerate([in_dim, hidden_dim]):
            layers.append(nn.Linear(width, hidden_dim))
            if use_bn:
                layers.append(nn.BatchNorm1d(hidden_dim))
            layers.append(nn.GELU())
        layers.append(nn.Linear(hidden_dim, bottleneck_dim))
        self.mlp = nn.Sequential(*layers)
        self.prototypes0 = nn.utils.weight_norm(nn.Linear(bottleneck_dim, num_clusters, bias=False))


def randomize(module):
    """Random values everywhere, BatchNorm statistics included, so that a tensor loaded into
    the wrong parameter shows."""
    with torch.no_grad():
        for tensor in list(module.parameters()) + list(module.buffers()):
            if tensor.is_floating_point():
                tensor.uniform_(0.5, 1.5)


def cases():
    return {
        "swav": [VisslSwavHead([512, 64, 16], use_bn=True, num_clusters=[10, 6])],
        "simclr": [VisslMlp([512, 64], use_relu=True, skip_last_layer_relu_bn=False),
                   VisslMlp([64, 16])],
        "barlow_twins": [
            VisslMlp([512, 32], use_bn=True, use_relu=True, use_bias=False,
                     skip_last_layer_relu_bn=False),
            VisslMlp([32, 32], use_bn=True, use_relu=True, use_bias=False,
                     skip_last_layer_relu_bn=False),
            VisslMlp([32, 16], use_bias=False)],
        "dino": [VisslDinoHead(512, 32, 8, 16, use_bn=True)],
    }


def largo_head(heads):
    """The same modules as Largo's one flat head Sequential."""
    if isinstance(heads[0], (VisslSwavHead, VisslDinoHead)):
        return nn.Sequential(heads[0])
    return nn.Sequential(*[layer for head in heads for layer in head.clf])


def vissl_checkpoint(trunk, heads):
    model_state = {"model": {"trunk": trunk.state_dict(), "heads": heads.state_dict()},
                   "meta": {"trunk": {}, "heads": []}}
    return {"type": "consolidated", "phase_idx": 3, "iteration": 400,
            "classy_state_dict": {"base_model": model_state, "train_phase_idx": 3}}


def main():
    directory = sys.argv[1]
    torch.manual_seed(0)
    resnet = torchvision.models.resnet18()
    randomize(resnet)
    trunk = nn.Module()  # VISSL's resnet trunk: torchvision's modules under _feature_blocks
    trunk._feature_blocks = nn.ModuleDict(
        (name, module) for name, module in resnet.named_children() if name != "fc")
    for name, head_list in cases().items():
        heads = nn.ModuleList(head_list)
        randomize(heads)
        checkpoint = vissl_checkpoint(trunk, heads)
        torch.save(checkpoint, os.path.join(directory, f"{name}.torch"))
        expected = {f"head.{k}": v for k, v in largo_head(head_list).state_dict().items()}
        torch.save(expected, os.path.join(directory, f"{name}_expected.torch"))


if __name__ == "__main__":
    main()
