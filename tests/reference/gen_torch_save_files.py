#!/usr/bin/env python3
"""Writes the torch files that tests/checkpoint/torch_file_test.cpp reads with Largo.

Usage: $LARGO_PYTHON tests/reference/gen_torch_save_files.py OUT_DIR [LARGO_CHECKPOINT]
(LARGO_PYTHON from scripts/torch_env.sh: the venv of scripts/install_deps.sh, PyTorch 2.11)

What Python's torch.save writes is the format users hand to Largo: a module's state_dict
(an OrderedDict with _metadata), dicts of tensors of every dtype, views sharing one storage,
integers beyond 32 bits, one-item dicts (pickled with SETITEM), pickle protocol 4. For each
file, OUT_DIR/<name>.json lists what the test must find (dtype, shape and values of each
tensor, the scalars). LARGO_CHECKPOINT, when given, is loaded and saved again as
OUT_DIR/resaved.torch, the round trip a user makes to inspect or edit a checkpoint. Files
Largo must refuse with a clear message are written too: the pre-1.6 format, a numpy scalar,
a TorchScript module.
"""
import json
import os
import sys

import numpy as np
import torch


class TinyNet(torch.nn.Module):
    """The same names as TinyNet in the C++ test: fc (Linear 4 -> 3), bn (BatchNorm1d 3)."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)
        self.bn = torch.nn.BatchNorm1d(3)


def describe(value):
    """What the C++ test checks for one value."""
    if isinstance(value, torch.Tensor):
        return {"tensor": True, "dtype": str(value.dtype).replace("torch.", ""),
                "shape": list(value.shape),
                "values": value.detach().double().flatten().tolist()}
    if isinstance(value, dict):
        return {"dict": {k: describe(v) for k, v in value.items()}}
    if isinstance(value, (list, tuple)):
        return {"list": [describe(v) for v in value]}
    return {"scalar": value}


def save(out_dir, name, value, **kwargs):
    torch.save(value, os.path.join(out_dir, name + ".pt"), **kwargs)
    with open(os.path.join(out_dir, name + ".json"), "w") as f:
        json.dump(describe(value), f)


def main():
    out_dir = sys.argv[1]
    os.makedirs(out_dir, exist_ok=True)
    torch.manual_seed(0)
    net = TinyNet()
    net.bn.running_mean.copy_(torch.tensor([0.5, -0.25, 2.0]))
    net.bn.num_batches_tracked.fill_(7)
    save(out_dir, "state_dict", net.state_dict())

    base = torch.arange(12, dtype=torch.float32).reshape(3, 4) / 8
    mixed = {
        "float32": base,
        "view": base.t()[1:],            # shares base's storage, non-contiguous
        "float64": torch.linspace(-1, 1, 5, dtype=torch.float64),
        "float16": torch.tensor([0.5, -2.0], dtype=torch.float16),
        "bfloat16": torch.tensor([1.5, 3.0], dtype=torch.bfloat16),
        "int64": torch.tensor([2**40, -3], dtype=torch.int64),
        "int32": torch.tensor([-7, 9], dtype=torch.int32),
        "uint8": torch.tensor([0, 255], dtype=torch.uint8),
        "bool": torch.tensor([True, False]),
        "scalar_tensor": torch.tensor(4.25),
        "parameter": torch.nn.Parameter(torch.ones(2)),
        "epoch": 3,
        "big": 2**40,
        "negative": -5,
        "most_negative": -2**63,
        "rate": 0.125,
        "name": "résumé",
        "flag": True,
        "nothing": None,
        "milestones": [30, 60, 90],
        "names": ["a", "b"],
        "pair": (1, 2.5),
        "one_item": {"only": 1},         # a one-item dict: SETITEM, not SETITEMS
        "empty": {},
        "nested": {"inner": {"t": torch.full((2,), 6.0)}},
    }
    save(out_dir, "mixed", mixed)
    save(out_dir, "protocol4", {"w": base, "step": 11, "one": {"x": 1}}, pickle_protocol=4)

    # Files Largo refuses, each for a reason its message must give.
    torch.save({"w": base}, os.path.join(out_dir, "legacy.pt"),
               _use_new_zipfile_serialization=False)
    torch.save({"acc": np.float64(0.5)}, os.path.join(out_dir, "numpy_scalar.pt"))
    torch.jit.save(torch.jit.script(torch.nn.Linear(2, 2)), os.path.join(out_dir, "script.pt"))

    if len(sys.argv) > 2:
        # Largo writes with torch::pickle_save, whose typed dicts and lists go through
        # torch.jit._pickle.restore_type_tag / build_intlist, globals that PyTorch >= 2.6's
        # default torch.load (weights_only=True) refuses: load it as a trusted file.
        state = torch.load(sys.argv[2], weights_only=False)
        torch.save(state, os.path.join(out_dir, "resaved.torch"))


if __name__ == "__main__":
    main()
