#!/usr/bin/env python3
"""Reference values of VISSL's simclr_info_nce_loss (vissl/losses/simclr_info_nce_loss.py),
transcribed from its source: the positive and negative masks it precomputes per rank, the
gathered embeddings, exp(similarity / T) and -mean(log(pos / (pos + neg))), in float64.
Writes tests/models/baselines/simclr_loss_baselines.json:

    $LARGO_PYTHON tests/reference/gen_simclr_loss_baselines.py

Each case holds a global batch of `images` images, two views each, as `world_size` ranks see
it: rank r's rows are view 0 of its images, then view 1 (VISSL's simclr_collator order). For
every rank: its loss, and the gradient of the sum of all ranks' losses with respect to its
embeddings (what VISSL's GatherLayer gives each rank before data parallelism averages).
"""
import json
import os

import numpy as np
import torch

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "models", "baselines",
                   "simclr_loss_baselines.json")
NUM_POS = 2


def vissl_masks(rank, world_size, local_rows):
    """SimclrInfoNCECriterion.precompute_pos_neg_mask for one rank."""
    total = local_rows * world_size
    images = local_rows // NUM_POS
    pos_mask = torch.zeros(local_rows, total, dtype=torch.float64)
    neg_mask = torch.zeros(local_rows, total, dtype=torch.float64)
    all_indices = np.arange(total)
    pos_members = images * np.arange(NUM_POS)
    orig_members = torch.arange(images)
    for anchor in range(NUM_POS):
        for img_idx in range(images):
            delete_inds = local_rows * rank + img_idx + pos_members
            neg_inds = torch.tensor(np.delete(all_indices, delete_inds)).long()
            neg_mask[anchor * images + img_idx, neg_inds] = 1
        for pos in np.delete(np.arange(NUM_POS), anchor):
            pos_inds = local_rows * rank + pos * images + orig_members
            pos_mask[torch.arange(anchor * images, (anchor + 1) * images), pos_inds] = 1
    return pos_mask, neg_mask


def vissl_loss(local, gathered, rank, world_size, temperature):
    """SimclrInfoNCECriterion.forward."""
    pos_mask, neg_mask = vissl_masks(rank, world_size, local.shape[0])
    similarity = torch.exp(torch.mm(local, gathered.t()) / temperature)
    pos = torch.sum(similarity * pos_mask, 1)
    neg = torch.sum(similarity * neg_mask, 1)
    return -(torch.mean(torch.log(pos / (pos + neg))))


def case(name, images, dim, world_size, temperature, normalize, seed):
    generator = torch.Generator().manual_seed(seed)
    views = torch.randn(NUM_POS, images, dim, generator=generator, dtype=torch.float64)
    if normalize:  # what SimCLR's head does before the loss
        views = torch.nn.functional.normalize(views, dim=2)
    per_rank = images // world_size
    locals_ = []
    for rank in range(world_size):
        part = views[:, rank * per_rank:(rank + 1) * per_rank]  # [2, n, d]
        locals_.append(part.reshape(NUM_POS * per_rank, dim).clone().requires_grad_())
    gathered = torch.cat(locals_)
    losses = [vissl_loss(locals_[r], gathered, r, world_size, temperature)
              for r in range(world_size)]
    torch.stack(losses).sum().backward()
    return {"name": name, "temperature": temperature, "world_size": world_size,
            "ranks": [{"embeddings": locals_[r].detach().tolist(),
                       "loss": losses[r].item(),
                       "gradient_of_sum": locals_[r].grad.tolist()}
                      for r in range(world_size)]}


def main():
    cases = [
        case("one_rank_t0_1", images=6, dim=8, world_size=1, temperature=0.1, normalize=True,
             seed=1),
        case("one_rank_t0_5_unnormalised", images=4, dim=5, world_size=1, temperature=0.5,
             normalize=False, seed=2),
        case("two_ranks_t0_1", images=6, dim=8, world_size=2, temperature=0.1, normalize=True,
             seed=1),
    ]
    with open(OUT, "w") as f:
        json.dump({"generator": "tests/reference/gen_simclr_loss_baselines.py",
                   "torch_version": torch.__version__, "cases": cases}, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
