#!/usr/bin/env python3
"""Reference values of VISSL's DeepCluster v2 (vissl/losses/deepclusterv2_loss.py and
vissl/hooks/deepclusterv2_hooks.py), transcribed from its formulas, with its collectives played
out over simulated ranks. Writes tests/models/baselines/deepclusterv2_baselines.json:

    $LARGO_PYTHON tests/reference/gen_deepclusterv2_baselines.py

Cases:
  loss_*   float64 embeddings, normalised centroids of several heads and targets with some
           -100 (ignored): DeepClusterV2Loss.forward's value (without its memory update) and
           its gradient with respect to the (un-normalised) embeddings.
  train_*  a tiny model (Linear, Tanh, Linear), float32, trained with VISSL's order at 1 and 2
           ranks: InitMemoryHook (one pass over epoch 0's batches filling each rank's banks),
           then per epoch ClusterMemoryHook (the distributed k-means of cluster_memory: initial
           centroids from rank 0's bank by torch.randperm of a generator seeded with
           kmeans_seed + epoch, counts and sums summed over the ranks, the assignments and
           indexes gathered in rank order) and per step the loss of each rank's batch, its
           memory update, the gradients averaged over the ranks (DDP) and an SGD step. The
           batches follow a DistributedSampler (its padding, rank r taking every world-th
           index) with drop_last, so some images are in no bank and stay at -100.
"""
import json
import math
import os

import torch
import torch.nn.functional as F

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "models", "baselines",
                   "deepclusterv2_baselines.json")


def deepclusterv2_loss(output, targets, centroids, temperature):
    """DeepClusterV2Loss.forward's loss; targets[i] is assignments[i][idx]."""
    output = F.normalize(output, dim=1, p=2)
    loss = 0
    for i, c in enumerate(centroids):
        scores = torch.mm(output, c.t()) / temperature
        loss += F.cross_entropy(scores, targets[i], ignore_index=-100)
    return loss / len(centroids)


def loss_case(name, m, d, num_clusters, temperature, seed):
    g = torch.Generator().manual_seed(seed)
    output = (torch.randn(m, d, generator=g, dtype=torch.float64) * 2).requires_grad_()
    centroids = [F.normalize(torch.randn(k, d, generator=g, dtype=torch.float64), dim=1)
                 for k in num_clusters]
    targets = torch.stack([torch.randint(0, k, (m,), generator=g) for k in num_clusters])
    targets[0, 1] = -100
    targets[-1, 0] = -100
    loss = deepclusterv2_loss(output, targets, centroids, temperature)
    loss.backward()
    return {"name": name, "temperature": temperature, "embeddings": output.detach().tolist(),
            "centroids": [c.tolist() for c in centroids], "targets": targets.tolist(),
            "loss": loss.item(), "gradient": output.grad.tolist()}


class SimulatedMemory:
    """DeepClusterV2Loss's buffers on each of `world` ranks, and cluster_memory over them."""

    def __init__(self, world, size, crops_for_mb, num_crops, d, num_clusters, num_samples,
                 kmeans_iters):
        self.crops_for_mb, self.num_crops = crops_for_mb, num_crops
        self.num_clusters, self.kmeans_iters, self.d = num_clusters, kmeans_iters, d
        self.embeddings = [torch.zeros(len(crops_for_mb), size, d) for _ in range(world)]
        self.index = [torch.zeros(size).long() for _ in range(world)]
        self.assignments = -100 * torch.ones(len(num_clusters), num_samples).long()
        self.centroids = [torch.rand(k, d) for k in num_clusters]
        self.start_idx = [0] * world

    def update_memory_bank(self, rank, emb, idx):
        """update_memory_bank (and init_memory's fill: the same rows from a start index)."""
        n = len(idx) // self.num_crops
        idx = idx[:n]
        s = self.start_idx[rank]
        self.index[rank][s:s + n] = idx
        for i, crop_idx in enumerate(self.crops_for_mb):
            self.embeddings[rank][i][s:s + n] = emb[crop_idx * n:(crop_idx + 1) * n]
        self.start_idx[rank] += n

    def cluster_memory(self, generator):
        world = len(self.embeddings)
        self.start_idx = [0] * world
        j = 0
        with torch.no_grad():
            for i_k, k in enumerate(self.num_clusters):
                random_idx = torch.randperm(len(self.embeddings[0][j]), generator=generator)[:k]
                assert len(random_idx) >= k, "please reduce the number of centroids"
                centroids = self.embeddings[0][j][random_idx]  # dist.broadcast from rank 0
                for n_iter in range(self.kmeans_iters + 1):
                    assignments = [torch.mm(self.embeddings[r][j], centroids.t()).max(dim=1)[1]
                                   for r in range(world)]
                    if n_iter == self.kmeans_iters:
                        break
                    rank_counts, rank_sums = [], []
                    for r in range(world):
                        counts = torch.zeros(k).int()
                        emb_sums = torch.zeros(k, self.d)
                        for c in range(k):  # get_indices_sparse's rows of cluster c
                            rows = torch.nonzero(assignments[r] == c).flatten()
                            if len(rows) > 0:
                                emb_sums[c] = torch.sum(self.embeddings[r][j][rows], dim=0)
                                counts[c] = len(rows)
                        rank_counts.append(counts)
                        rank_sums.append(emb_sums)
                    counts = sum(rank_counts[1:], rank_counts[0])  # all_reduce_sum
                    emb_sums = sum(rank_sums[1:], rank_sums[0])
                    mask = counts > 0
                    centroids[mask] = emb_sums[mask] / counts[mask].unsqueeze(1)
                    centroids = F.normalize(centroids, dim=1, p=2)
                self.centroids[i_k].copy_(centroids)
                assignments_all = torch.cat(assignments)  # gather_from_all
                indexes_all = torch.cat(self.index)
                self.assignments[i_k] = -100
                self.assignments[i_k][indexes_all] = assignments_all
                j = (j + 1) % len(self.embeddings[0])


def tiny_model(d_in, d_hidden, d):
    return torch.nn.Sequential(torch.nn.Linear(d_in, d_hidden), torch.nn.Tanh(),
                               torch.nn.Linear(d_hidden, d))


def epoch_batches(num_samples, world, batch, epoch, seed):
    """DistributedSampler(shuffle, drop_last=False) order, each rank's DataLoader dropping its
    last partial batch: batches[rank][step] = sample indexes."""
    order = torch.randperm(num_samples, generator=torch.Generator().manual_seed(seed + epoch))
    order = order.tolist()
    per_rank = math.ceil(num_samples / world)
    order += order[:per_rank * world - num_samples]  # the sampler's padding
    ranks = [order[r::world] for r in range(world)]
    steps = per_rank // batch
    return [[ranks[r][s * batch:(s + 1) * batch] for s in range(steps)] for r in range(world)]


def train_case(name, world, batch, num_samples, num_crops, crops_for_mb, num_clusters,
               kmeans_iters, temperature, lr, epochs, seed, kmeans_seed):
    d_in, d_hidden, d = 6, 5, 4
    torch.manual_seed(seed)
    model = tiny_model(d_in, d_hidden, d)
    initial = {k: v.detach().clone() for k, v in model.state_dict().items()}
    g = torch.Generator().manual_seed(seed + 1)
    images = torch.randn(num_samples, d_in, generator=g)
    # crop c of image i: a fixed perturbation of it (the same in every epoch)
    crops = images.unsqueeze(0) + 0.3 * torch.randn(num_crops, num_samples, d_in, generator=g)
    size = math.ceil(num_samples / world)
    size -= size % batch  # DROP_LAST
    memory = SimulatedMemory(world, size, crops_for_mb, num_crops, d, num_clusters,
                             num_samples, kmeans_iters)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)

    def inputs(idx):  # multicrop_collator: crop-major
        return torch.cat([crops[c][idx] for c in range(num_crops)])

    batches = [epoch_batches(num_samples, world, batch, e, seed) for e in range(epochs)]
    with torch.no_grad():  # InitMemoryHook.on_start: init_memory over epoch 0's batches
        for r in range(world):
            for idx in batches[0][r]:
                emb = F.normalize(model(inputs(idx)), dim=1, p=2)
                memory.update_memory_bank(r, emb, torch.tensor(idx * num_crops))
    initial_memory = [m.clone() for m in memory.embeddings]
    memory.start_idx = [0] * world
    losses, clusterings = [], []
    for epoch in range(epochs):
        memory.cluster_memory(torch.Generator().manual_seed(kmeans_seed + epoch))
        clusterings.append({"centroids": [c.tolist() for c in memory.centroids],
                            "assignments": memory.assignments.tolist()})
        for step in range(len(batches[epoch][0])):
            optimizer.zero_grad()
            rank_losses = []
            for r in range(world):
                idx = torch.tensor(batches[epoch][r][step] * num_crops)  # labels per crop
                output = model(inputs(batches[epoch][r][step]))
                targets = [memory.assignments[i][idx] for i in range(len(num_clusters))]
                loss = deepclusterv2_loss(output, targets, memory.centroids, temperature)
                memory.update_memory_bank(r, F.normalize(output, dim=1, p=2).detach(), idx)
                (loss / world).backward()  # DDP: the ranks' gradients averaged
                rank_losses.append(loss.item())
            losses.append(rank_losses)
            optimizer.step()
    return {"name": name, "world_size": world, "batch_size": batch, "num_samples": num_samples,
            "num_crops": num_crops, "crops_for_mb": crops_for_mb, "num_clusters": num_clusters,
            "kmeans_iters": kmeans_iters, "temperature": temperature, "lr": lr,
            "epochs": epochs, "kmeans_seed": kmeans_seed, "memory_size_per_rank": size,
            "initial": {k: v.tolist() for k, v in initial.items()},
            "crops": crops.tolist(), "batches": batches,
            "initial_memory": [m.tolist() for m in initial_memory],
            "clusterings": clusterings, "losses": losses,
            "final": {k: v.detach().tolist() for k, v in model.named_parameters()},
            "final_memory": [m.tolist() for m in memory.embeddings],
            "final_memory_index": [m.tolist() for m in memory.index]}


def main():
    train = dict(batch=3, num_samples=13, num_crops=2, crops_for_mb=[0, 1],
                 num_clusters=[3, 2, 4], kmeans_iters=3, temperature=0.1, lr=0.2, epochs=3,
                 seed=5, kmeans_seed=17)
    cases = [
        loss_case("loss_three_heads", m=8, d=5, num_clusters=[4, 3, 6], temperature=0.1,
                  seed=1),
        loss_case("loss_one_head", m=6, d=3, num_clusters=[5], temperature=0.5, seed=2),
        train_case("train_one_rank", world=1, **train),
        train_case("train_two_ranks", world=2, **train),
    ]
    with open(OUT, "w") as f:
        json.dump({"generator": "tests/reference/gen_deepclusterv2_baselines.py",
                   "torch_version": torch.__version__, "cases": cases}, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
