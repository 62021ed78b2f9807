#!/usr/bin/env python3
"""Writes tests/train/baselines/classification_loss_baselines.json: VISSL's
cross_entropy_multiple_output_single_target (vissl/losses/
cross_entropy_multiple_output_single_target.py at 09270ed: for each output,
normalize?(output) / temperature, then torch's cross_entropy with the class weights and
ignore_index, summed over the outputs) on fixed float64 logits, with the loss and its
gradient with respect to every output, for tests/train/classification_loss_test.cpp.

Run from the repository root with LARGO_PYTHON (scripts/torch_env.sh: the venv of
scripts/install_deps.sh, PyTorch 2.11):
    $LARGO_PYTHON tests/reference/gen_classification_loss_baselines.py
"""

import json
import os

import torch
import torch.nn.functional as F

OUTPUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "train", "baselines",
                      "classification_loss_baselines.json")

CASES = [
    {"name": "plain", "temperature": 1.0, "normalize_output": False, "weight": None},
    {"name": "temperature", "temperature": 0.1, "normalize_output": False, "weight": None},
    {"name": "normalized", "temperature": 0.2, "normalize_output": True, "weight": None},
    {"name": "weighted", "temperature": 1.0, "normalize_output": False,
     "weight": [0.5, 1.0, 2.0, 1.5, 0.25]},
    {"name": "all", "temperature": 0.5, "normalize_output": True,
     "weight": [1.0, 3.0, 0.5, 2.0, 1.0]},
]


def vissl_loss(outputs, target, case):
    weight = torch.tensor(case["weight"], dtype=torch.float64) if case["weight"] else None
    loss = 0
    for pred in outputs:
        if case["normalize_output"]:
            pred = F.normalize(pred, dim=1, p=2)
        loss += F.cross_entropy(pred / case["temperature"], target, weight=weight,
                                ignore_index=-1)
    return loss


def main():
    generator = torch.Generator().manual_seed(7)
    outputs = [torch.randn(6, 5, generator=generator, dtype=torch.float64) * 3 for _ in range(2)]
    target = torch.tensor([0, 3, -1, 4, 1, 3])  # one ignored sample
    results = []
    for case in CASES:
        leaves = [o.clone().requires_grad_() for o in outputs]
        loss = vissl_loss(leaves, target, case)
        loss.backward()
        results.append(dict(case, loss=loss.item(),
                            grads=[leaf.grad.flatten().tolist() for leaf in leaves]))
    baselines = {"generated_by": "tests/reference/gen_classification_loss_baselines.py",
                 "outputs": [o.flatten().tolist() for o in outputs], "shape": [6, 5],
                 "target": target.tolist(), "cases": results}
    os.makedirs(os.path.dirname(OUTPUT), exist_ok=True)
    with open(OUTPUT, "w") as f:
        json.dump(baselines, f)
        f.write("\n")
    print(f"wrote {OUTPUT}")


if __name__ == "__main__":
    main()
