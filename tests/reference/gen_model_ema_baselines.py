#!/usr/bin/env python3
"""Writes tests/optim/baselines/model_ema_baselines.json: VISSL's exponential moving average
of a model (HOOKS.EMA_MODEL) over a sequence of model states, for
tests/optim/model_ema_test.cpp.

Run from the repository root with LARGO_PYTHON (scripts/torch_env.sh: the venv of
scripts/install_deps.sh, PyTorch 2.11):
    $LARGO_PYTHON tests/reference/gen_model_ema_baselines.py

The update is VISSL's, written from vissl/utils/ema_model.py (ModelEmaV2) and
vissl/hooks/ema_hooks.py (EmaHook) at 09270ed:
  - the EMA model is a float32 model that starts as a copy of the base model (set());
  - on_update runs after each optimizer step, before the iteration counter is incremented:
    it returns unless iteration % UPDATE_ITER == 0; if task.where (steps done / total steps)
    is below WARMUP it copies the model (set), else for each state_dict entry:
        ema = DECAY * ema + (1 - DECAY) * model     (float32 entries)
        ema = model                                  (other dtypes: num_batches_tracked)
The model states are random: a float32 weight and bias, a float32 BatchNorm running_var, an
int64 num_batches_tracked, and a bfloat16 weight (a model cast to low precision; VISSL's EMA
copy of it stays float32). Every value is written exactly (float32 and bfloat16 values are
doubles exactly).
"""

import json
import os

import torch

OUTPUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "optim", "baselines",
                      "model_ema_baselines.json")

CASES = [
    {"name": "every_step", "decay": 0.9, "update_iter": 1, "warmup": 0.2, "total_steps": 10},
    {"name": "every_third_step", "decay": 0.99, "update_iter": 3, "warmup": 0.05,
     "total_steps": 12},
]


def model_state(generator, step):
    return {
        "trunk.0.weight": torch.randn(2, 3, generator=generator),
        "trunk.0.bias": torch.randn(3, generator=generator),
        "trunk.1.running_var": torch.rand(3, generator=generator) + 0.5,
        "trunk.1.num_batches_tracked": torch.tensor(step, dtype=torch.int64),
        "head.0.weight": torch.randn(2, 2, generator=generator).to(torch.bfloat16),
    }


class VisslEma:
    """ModelEmaV2's _update / update / set over a state dict."""

    def __init__(self, state, decay):
        self.decay = decay
        # build_model(...) gives a float32 model; set(base_model) copies into it.
        self.ema = {k: (v.clone().float() if v.is_floating_point() else v.clone())
                    for k, v in state.items()}

    def _update(self, state, update_fn):
        for key, ema_params in self.ema.items():
            model_params = state[key]
            if ema_params.dtype != torch.float32:
                value = model_params
            else:
                value = update_fn(ema_params, model_params)
            ema_params.copy_(value)

    def update(self, state):
        self._update(state, lambda e, m: self.decay * e + (1.0 - self.decay) * m)

    def set(self, state):
        self._update(state, lambda e, m: m)


def to_json(tensor):
    return {"dtype": str(tensor.dtype).replace("torch.", ""), "shape": list(tensor.shape),
            "values": [float(x) for x in tensor.double().flatten().tolist()]}


def run_case(case):
    generator = torch.Generator().manual_seed(1234)
    initial = model_state(generator, 0)
    ema = VisslEma(initial, case["decay"])
    steps = []
    for iteration in range(case["total_steps"]):
        state = model_state(generator, iteration + 1)  # the model after this step
        updated = False
        if iteration % case["update_iter"] == 0:
            where = iteration / case["total_steps"]
            if where < case["warmup"]:
                ema.set(state)
            else:
                ema.update(state)
            updated = True
        steps.append({
            "model": {k: to_json(v) for k, v in state.items()},
            "updated": updated,
            "ema": {k: to_json(v) for k, v in ema.ema.items()},
        })
    return dict(case, initial={k: to_json(v) for k, v in initial.items()},
                order=list(initial.keys()), steps=steps)


def main():
    baselines = {"generated_by": "tests/reference/gen_model_ema_baselines.py",
                 "torch_version": torch.__version__,
                 "cases": [run_case(case) for case in CASES]}
    os.makedirs(os.path.dirname(OUTPUT), exist_ok=True)
    with open(OUTPUT, "w") as f:
        json.dump(baselines, f)
        f.write("\n")
    print(f"wrote {OUTPUT}")


if __name__ == "__main__":
    main()
