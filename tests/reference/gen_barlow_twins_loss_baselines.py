#!/usr/bin/env python3
"""Reference values of VISSL's barlow_twins_loss (vissl/losses/barlow_twins_loss.py and
SyncNormalizeFunction in vissl/utils/apex_helpers.py), transcribed from its source, in float64.
Writes tests/models/baselines/barlow_twins_loss_baselines.json:

    $LARGO_PYTHON tests/reference/gen_barlow_twins_loss_baselines.py

Each case holds a global batch of `images` images, two views each, as `world_size` ranks see
it: rank r's rows are view 0 of its images, then view 1 (simclr_collator's order). VISSL's
collectives are played out here over the simulated ranks:
  - SyncNormalizeFunction normalises every rank's [2n, d] rows (both views together) with the
    mean and E[x^2] averaged over the ranks, var = E[x^2] - mean^2, eps 1e-5; its backward
    averages mean(dy) and mean(dy * (x - mean)) over the ranks the same way;
  - the cross-correlation a^T b / n is averaged over the ranks by an in-place all_reduce that
    autograd does not see, then divided by the world size: each rank's backward reaches only
    its own a^T b, with the averaged matrix's gradient divided by the world size.
For every rank: its loss (the same on every rank) and the gradient of that loss with respect
to its embeddings, as its own backward computes it. The script checks that the gradients are
the rows of one process's gradient of the same loss on the whole batch (autograd through
plain ops), which is what VISSL's pieces add up to.
"""
import json
import os

import torch

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "models", "baselines",
                   "barlow_twins_loss_baselines.json")
EPS = 1e-5


def off_diagonal(x):
    """BarlowTwinsCriterion._off_diagonal."""
    n, m = x.shape
    assert n == m
    return x.flatten()[:-1].view(n - 1, n + 1)[:, 1:].flatten()


def criterion_after_correlation(correlation, lambda_, scale_loss):
    on_diag = torch.diagonal(correlation).add(-1).pow(2).sum().mul(scale_loss)
    off_diag = off_diagonal(correlation).pow(2).sum().mul(scale_loss)
    return on_diag + lambda_ * off_diag


def vissl_ranks(locals_, lambda_, scale_loss):
    """Each rank's loss and embedding gradient, VISSL's collectives simulated."""
    world = len(locals_)
    mean = torch.stack([x.mean(0) for x in locals_]).mean(0)
    sqr_mean = torch.stack([x.pow(2).mean(0) for x in locals_]).mean(0)
    var = sqr_mean - mean.pow(2)
    normed = [((x - mean) / torch.sqrt(var + EPS)).detach().requires_grad_() for x in locals_]
    rows = locals_[0].shape[0] // 2
    correlations = [torch.mm(z[:rows].T, z[rows:]) / rows for z in normed]
    summed = torch.stack([c.detach() for c in correlations]).sum(0)
    losses, grads_normed = [], []
    for r in range(world):
        # The in-place all_reduce: the value is the sum, the gradient goes to rank r's matrix.
        reduced = (correlations[r] + (summed - correlations[r].detach())) / world
        loss = criterion_after_correlation(reduced, lambda_, scale_loss)
        losses.append(loss.item())
        grads_normed.append(torch.autograd.grad(loss, normed[r])[0])
    mean_dy = torch.stack([dy.mean(0) for dy in grads_normed]).mean(0)
    mean_dy_xmu = torch.stack([(dy * (x.detach() - mean)).mean(0)
                               for dy, x in zip(grads_normed, locals_)]).mean(0)
    gradients = [(dy - mean_dy - (x.detach() - mean) / (var + EPS) * mean_dy_xmu)
                 / torch.sqrt(var + EPS) for dy, x in zip(grads_normed, locals_)]
    return losses, gradients


def one_process_gradient(locals_, lambda_, scale_loss):
    """The same loss on the whole batch through plain autograd: [view 0 of all; view 1 of all]."""
    rows = locals_[0].shape[0] // 2
    a = torch.cat([x[:rows] for x in locals_])
    b = torch.cat([x[rows:] for x in locals_])
    whole = torch.cat([a, b]).detach().requires_grad_()
    mean = whole.mean(0)
    var = whole.pow(2).mean(0) - mean.pow(2)
    z = (whole - mean) / torch.sqrt(var + EPS)
    images = a.shape[0]
    correlation = torch.mm(z[:images].T, z[images:]) / images
    criterion_after_correlation(correlation, lambda_, scale_loss).backward()
    grad = whole.grad
    return [torch.cat([grad[r * rows:(r + 1) * rows], grad[images + r * rows:images + (r + 1) * rows]])
            for r in range(len(locals_))]


def case(name, images, dim, world_size, lambda_, scale_loss, seed):
    generator = torch.Generator().manual_seed(seed)
    views = torch.randn(2, images, dim, generator=generator, dtype=torch.float64)
    views[1] = views[1] * 0.5 + views[0]  # correlated views, as two crops of one image are
    per_rank = images // world_size
    locals_ = [views[:, r * per_rank:(r + 1) * per_rank].reshape(2 * per_rank, dim).clone()
               for r in range(world_size)]
    losses, gradients = vissl_ranks(locals_, lambda_, scale_loss)
    for got, want in zip(gradients, one_process_gradient(locals_, lambda_, scale_loss)):
        assert torch.allclose(got, want, rtol=1e-10, atol=1e-12), "transcription disagrees"
    return {"name": name, "lambda": lambda_, "scale_loss": scale_loss, "world_size": world_size,
            "ranks": [{"embeddings": locals_[r].tolist(), "loss": losses[r],
                       "gradient": gradients[r].tolist()} for r in range(world_size)]}


def main():
    cases = [
        case("one_rank", images=6, dim=5, world_size=1, lambda_=0.0051, scale_loss=0.024, seed=1),
        case("one_rank_lambda_0_5", images=4, dim=3, world_size=1, lambda_=0.5, scale_loss=1.0,
             seed=2),
        case("two_ranks", images=6, dim=5, world_size=2, lambda_=0.0051, scale_loss=0.024,
             seed=1),
    ]
    with open(OUT, "w") as f:
        json.dump({"generator": "tests/reference/gen_barlow_twins_loss_baselines.py",
                   "torch_version": torch.__version__, "cases": cases}, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
