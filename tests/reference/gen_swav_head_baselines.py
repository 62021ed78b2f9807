#!/usr/bin/env python3
"""Reference outputs of VISSL's swav_head (SwAVPrototypesHead), transcribed from
vissl/models/heads/swav_prototypes_head.py, and of its prototype normalisation (VISSL's
NormalizePrototypesHook, vissl/hooks/swav_hooks.py). Writes
tests/models/baselines/swav_head_baselines.json:

    $LARGO_PYTHON tests/reference/gen_swav_head_baselines.py

Each case: the head's arguments, its parameters and buffers by VISSL's names, the input
features, the outputs of one forward in training mode (BatchNorm uses the batch's
statistics and updates its running ones), the running statistics after it, and the
prototypes after normalisation. Everything in float64.
"""
import json
import os

import torch
import torch.nn as nn

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "models", "baselines",
                   "swav_head_baselines.json")


class SwAVPrototypesHead(nn.Module):
    """VISSL's SwAVPrototypesHead without weight-normalised prototypes (not in Largo)."""

    def __init__(self, dims, use_bn, num_clusters, use_bias=True, return_embeddings=True,
                 skip_last_bn=True, normalize_feats=True, activation_name="ReLU",
                 eps=1e-5, momentum=0.1):
        super().__init__()
        self.normalize_feats = normalize_feats
        layers = []
        last_dim = dims[0]
        for i, dim in enumerate(dims[1:]):
            layers.append(nn.Linear(last_dim, dim, bias=use_bias))
            if (i == len(dims) - 2) and skip_last_bn:
                break
            if use_bn:
                layers.append(nn.BatchNorm1d(dim, eps=eps, momentum=momentum))
            if activation_name == "ReLU":
                layers.append(nn.ReLU(inplace=True))
            if activation_name == "GELU":
                layers.append(nn.GELU())
            last_dim = dim
        self.projection_head = nn.Sequential(*layers)
        self.nmb_heads = len(num_clusters)
        for i, k in enumerate(num_clusters):
            self.add_module("prototypes" + str(i), nn.Linear(dims[-1], k, bias=False))
        self.return_embeddings = return_embeddings

    def forward(self, batch):
        batch = self.projection_head(batch)
        if self.normalize_feats:
            batch = nn.functional.normalize(batch, dim=1, p=2)
        out = []
        if self.return_embeddings:
            out.append(batch)
        for i in range(self.nmb_heads):
            out.append(getattr(self, "prototypes" + str(i))(batch))
        return out


def normalize_prototypes(head):
    """NormalizePrototypesHook.on_forward."""
    with torch.no_grad():
        for j in range(head.nmb_heads):
            module = getattr(head, "prototypes" + str(j))
            w = module.weight.data.clone()
            w = nn.functional.normalize(w, dim=1, p=2)
            module.weight.copy_(w)


CASES = [
    ("swav_default", dict(dims=[8, 12, 6], use_bn=True, num_clusters=[5])),
    ("two_prototype_sets_no_embeddings",
     dict(dims=[8, 6], use_bn=False, num_clusters=[5, 7], return_embeddings=False)),
    ("gelu_last_bn_unnormalized",
     dict(dims=[8, 10, 6], use_bn=True, num_clusters=[4], skip_last_bn=False,
          normalize_feats=False, activation_name="GELU", use_bias=False, eps=1e-3,
          momentum=0.2)),
    ("projection_only", dict(dims=[8, 12, 6], use_bn=False, num_clusters=[])),
]


def tensors(module, kind):
    items = module.named_parameters() if kind == "parameters" else module.named_buffers()
    return {name: t.detach().reshape(-1).tolist() for name, t in items
            if not name.endswith("num_batches_tracked")}


def main():
    torch.manual_seed(0)
    cases = []
    for name, args in CASES:
        head = SwAVPrototypesHead(**args).double()
        with torch.no_grad():  # give BatchNorm's affine parameters values other than 1 and 0
            for n, p in head.named_parameters():
                if "projection_head" in n and p.dim() == 1:
                    p.uniform_(0.5, 1.5)
        parameters = tensors(head, "parameters")
        buffers = tensors(head, "buffers")
        features = torch.randn(6, args["dims"][0], dtype=torch.float64)
        head.train()
        outputs = head(features)
        running = tensors(head, "buffers")
        normalize_prototypes(head)
        cases.append({
            "name": name,
            "args": args,
            "parameters": parameters,
            "buffers": buffers,
            "features": features.tolist(),
            "outputs": [o.detach().tolist() for o in outputs],
            "buffers_after": running,
            "normalized_prototypes": {n: t for n, t in tensors(head, "parameters").items()
                                      if n.startswith("prototypes")},
        })
    with open(OUT, "w") as f:
        json.dump({"generated_by": "tests/reference/gen_swav_head_baselines.py",
                   "torch": torch.__version__, "cases": cases}, f, indent=1)
    print(f"wrote {len(cases)} cases to {os.path.normpath(OUT)}")


if __name__ == "__main__":
    main()
