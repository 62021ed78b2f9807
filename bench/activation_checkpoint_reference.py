#!/usr/bin/env python3
"""PyTorch reference for bench/activation_checkpoint_bench.cpp.

The same model (the same blocks as Largo's trunk, the same ops), batch, image size and
threads; the trunk runs through torch.utils.checkpoint.checkpoint_sequential with the given
number of segments (0: the plain model). Prints the same JSON line.

Usage: activation_checkpoint_reference.py MODEL --splits N [--batch B] [--image S]
                                          [--threads T] [--warmup W] [--steps K]

A step is zero_grad(set_to_none=False) -> forward -> cross-entropy -> backward, as on the
Largo side. PyTorch 2.11's checkpoint_sequential uses the reentrant checkpoint by default,
which gives the first segment's parameters no gradient when the segment's input does not
require grad; so with 2+ segments the images get requires_grad=True (the usual workaround),
which costs one extra input-gradient of the first conv/patch projection. The run checks that
every parameter received a gradient.

Memory: Python cannot replace PyTorch's CPU allocator, but that allocator reports every
allocation and free (with its size) to the profiler. One more step is run under
torch.profiler with profile_memory=True; the [memory] events, in time order, are summed
(allocations positive, frees negative) and the peak of that running sum is the peak bytes
allocated during the step above those live before it: the figure the Largo side measures
with its counting allocator. Timing runs before, without the profiler.
"""
import argparse
import json
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint
import torchvision

# Keep in sync with the defaults in activation_checkpoint_bench.cpp.
DEFAULTS = {"resnet50": {"batch": 8, "image": 112}, "vit": {"batch": 8, "image": 48}}


class Flatten(nn.Module):
    def forward(self, x):
        return x.flatten(1)


def resnet50_blocks():
    """Largo's ResNet-50 trunk blocks from torchvision's ResNet-50 (the same layers): stem
    (conv1, bn1, ReLU, max pool), the 16 Bottlenecks, global average pool + flatten."""
    net = torchvision.models.resnet50(num_classes=10)
    blocks = [nn.Sequential(net.conv1, net.bn1, net.relu, net.maxpool)]
    for layer in (net.layer1, net.layer2, net.layer3, net.layer4):
        blocks.extend(layer)
    blocks.append(nn.Sequential(net.avgpool, Flatten()))
    return blocks, net.fc


class VitPatchEmbedding(nn.Module):
    """Mirrors largo::models::VitPatchEmbeddingImpl (src/largo/models/vit.cpp)."""

    def __init__(self, image, patch, dim):
        super().__init__()
        self.conv_proj = nn.Conv2d(3, dim, patch, stride=patch)
        self.class_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embedding = nn.Parameter(torch.zeros(1, (image // patch) ** 2 + 1, dim))
        nn.init.trunc_normal_(self.class_token, std=0.02)
        nn.init.trunc_normal_(self.pos_embedding, std=0.02)

    def forward(self, x):
        x = self.conv_proj(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.class_token.expand(x.size(0), -1, -1), x], 1)
        x = x + self.pos_embedding
        return torch.dropout(x, 0.0, self.training)


class VitEncoderLayer(nn.Module):
    """Mirrors largo::models::VitEncoderLayerImpl: pre-LayerNorm attention and MLP blocks."""

    def __init__(self, dim, heads, mlp_dim):
        super().__init__()
        self.dim, self.heads = dim, heads
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.fc1 = nn.Linear(dim, mlp_dim)
        self.fc2 = nn.Linear(mlp_dim, dim)

    def attention(self, x):
        b, t, _ = x.shape
        head_dim = self.dim // self.heads
        qkv = self.qkv(x).reshape(b, t, 3, self.heads, head_dim).permute(2, 0, 3, 1, 4)
        # Largo's kernel (at::scaled_dot_product_attention, dropout 0): its memory, not a
        # matmul-softmax-matmul's, which holds the attention weights for the backward.
        out = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2])
        out = out.transpose(1, 2).reshape(b, t, self.dim)
        return torch.dropout(self.proj(out), 0.0, self.training)

    def forward(self, x):
        x = x + self.attention(self.norm1(x))
        hidden = F.gelu(self.fc1(self.norm2(x)))
        hidden = torch.dropout(hidden, 0.0, self.training)
        hidden = torch.dropout(self.fc2(hidden), 0.0, self.training)
        return x + hidden


class VitFinalNorm(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.norm = nn.LayerNorm(dim, eps=1e-6)

    def forward(self, x):
        return self.norm(x).select(1, 0)


def vit_blocks(image):
    dim, heads, mlp_dim, layers, patch = 192, 3, 768, 6, 8
    blocks = [VitPatchEmbedding(image, patch, dim)]
    blocks += [VitEncoderLayer(dim, heads, mlp_dim) for _ in range(layers)]
    blocks.append(VitFinalNorm(dim))
    return blocks, nn.Linear(dim, 10)


def build_benchmark(model_name, batch, image):
    """The benchmark's seeded inputs and model: images, labels, the trunk blocks, the head and
    the model (trunk of the blocks, then the head) in train mode."""
    torch.manual_seed(0)
    images = torch.randn(batch, 3, image, image)
    labels = torch.randint(0, 10, (batch,), dtype=torch.long)
    blocks, head = resnet50_blocks() if model_name == "resnet50" else vit_blocks(image)
    model = nn.Sequential(nn.Sequential(*blocks), head)
    model.train()
    return images, labels, blocks, head, model


def peak_bytes_of(step):
    """Runs step() under the profiler; the peak of the running sum of allocated bytes."""
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True
    ) as prof:
        step()
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    events.sort(key=lambda e: e.start_ns())  # stable: equal times keep the recorded order
    current = peak = 0
    for event in events:
        current += event.nbytes()
        peak = max(peak, current)
    return peak


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model", choices=sorted(DEFAULTS))
    parser.add_argument("--splits", type=int, required=True)
    parser.add_argument("--batch", type=int)
    parser.add_argument("--image", type=int)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--steps", type=int, default=2)
    args = parser.parse_args()
    batch = args.batch or DEFAULTS[args.model]["batch"]
    image = args.image or DEFAULTS[args.model]["image"]

    torch.set_num_threads(args.threads)
    images, labels, blocks, head, model = build_benchmark(args.model, batch, image)
    trunk = model[0]
    if args.splits >= 2:
        images.requires_grad_(True)

    last_loss = 0.0

    def one_step():
        nonlocal last_loss
        model.zero_grad(set_to_none=False)
        if args.splits == 0:
            logits = model(images)
        else:
            logits = head(torch.utils.checkpoint.checkpoint_sequential(trunk, args.splits, images, use_reentrant=True))
        loss = F.cross_entropy(logits, labels)
        last_loss = loss.item()
        loss.backward()

    for _ in range(args.warmup):
        one_step()
    missing = [n for n, p in model.named_parameters() if p.grad is None]
    if missing:
        raise SystemExit(f"parameters without a gradient: {missing[:5]} ...")
    start = time.perf_counter()
    cpu_start = time.process_time()  # CPU time of all threads, like std::clock() in C++
    for _ in range(args.steps):
        one_step()
    ms_per_step = (time.perf_counter() - start) * 1000.0 / args.steps
    cpu_ms_per_step = (time.process_time() - cpu_start) * 1000.0 / args.steps
    peak = peak_bytes_of(one_step)

    print(json.dumps({
        "impl": "pytorch",
        "model": args.model,
        "splits": args.splits,
        "batch": batch,
        "image": image,
        "threads": args.threads,
        "steps": args.steps,
        "num_parameters": sum(p.numel() for p in model.parameters()),
        "num_blocks": len(blocks),
        "peak_activation_bytes": peak,
        "ms_per_step": ms_per_step,
        "cpu_ms_per_step": cpu_ms_per_step,
        "loss": last_loss,
    }))


if __name__ == "__main__":
    main()
