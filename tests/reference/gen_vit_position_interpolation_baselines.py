#!/usr/bin/env python3
"""Writes tests/models/baselines/vit_position_interpolation_baselines.json (GENERATED FILE, do
not edit): the positional embedding VISSL's ViT adds to an input of another size than the one
it was built for, for tests/models/vit_position_interpolation_test.cpp.

Run from the repository root with LARGO_PYTHON (scripts/torch_env.sh: PyTorch 2.11):
    $LARGO_PYTHON tests/reference/gen_vit_position_interpolation_baselines.py

interpolate below transcribes VisionTransformer.interpolate_pos_encoding of
vissl/models/trunks/vision_transformer.py (with a class token): the class row apart, the patch
rows as a [1, d, h, w] map of the BUILT grid, F.interpolate with scale_factor
sqrt(npatch / nembed), mode bicubic (align_corners and recompute_scale_factor unset), back to
[1, n, d] with the class row first.

Each case stores the embedding it starts from (a formula, as float32: its exact values are in
the file, so the test needs no formula) and the result, both flat:
  4x4 -> 2x2 and 4x4 -> 3x3   shrinking by 1/2 and 3/4
  4x4 -> 6x6                  growing (1.5)
  14x14 -> 6x6                VISSL's DINO: IMAGE_SIZE 224, patch 16, 96 px local crops
"""

import json
import math
import os

import torch
import torch.nn.functional as F

OUTPUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "models", "baselines",
                      "vit_position_interpolation_baselines.json")
DIM = 8


def interpolate(pos_embed, feat_map_size, npatch):
    nembed = pos_embed.shape[1] - 1
    class_emb = pos_embed[:, 0]
    pos_embed = pos_embed[:, 1:]
    dim = pos_embed.shape[-1]
    height, width = feat_map_size
    scale_factor = math.sqrt(npatch / nembed)
    pos_embed = pos_embed.reshape(1, height, width, dim).permute(0, 3, 1, 2)
    pos_embed = F.interpolate(pos_embed, scale_factor=scale_factor, mode="bicubic")
    pos_embed = pos_embed.permute(0, 2, 3, 1).view(1, -1, dim)
    return torch.cat((class_emb.unsqueeze(0), pos_embed), dim=1)


def embedding(grid):
    """[1, 1 + grid^2, DIM]: a smooth, non-separable function of the token and the channel, so
    that every output mixes distinct values."""
    token = torch.arange(1 + grid * grid, dtype=torch.float64).reshape(1, -1, 1)
    channel = torch.arange(DIM, dtype=torch.float64).reshape(1, 1, -1)
    return torch.sin(0.37 * token + 0.11 * channel * (1 + 0.05 * token)).float()


def case(built_grid, input_grid):
    pos_embed = embedding(built_grid)
    out = interpolate(pos_embed, (built_grid, built_grid), input_grid * input_grid)
    assert out.shape == (1, 1 + input_grid * input_grid, DIM), out.shape
    return {
        "name": f"grid{built_grid}_to_{input_grid}",
        "dim": DIM,
        "built_grid": built_grid,
        "input_grid": input_grid,
        "pos_embedding": pos_embed.flatten().tolist(),
        "expected": out.flatten().tolist(),
    }


def main():
    torch.set_num_threads(1)
    cases = [case(4, 2), case(4, 3), case(4, 6), case(14, 6)]
    baselines = {
        "_generated_by": "tests/reference/gen_vit_position_interpolation_baselines.py",
        "_note": "GENERATED FILE, do not edit. Regenerate with "
                 "$LARGO_PYTHON tests/reference/gen_vit_position_interpolation_baselines.py",
        "torch_version": torch.__version__,
        "cases": cases,
    }
    with open(OUTPUT, "w") as f:
        json.dump(baselines, f, indent=1)
        f.write("\n")
    print(f"wrote {os.path.normpath(OUTPUT)}")


if __name__ == "__main__":
    main()
