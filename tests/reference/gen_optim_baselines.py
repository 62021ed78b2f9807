#!/usr/bin/python3
"""Writes tests/optim/baselines/optim_baselines.json: PyTorch's answers for Largo's optimizer
and learning-rate schedule tests (tests/optim/optimizer_baseline_test.cpp,
tests/optim/lr_schedule_test.cpp).

Run with Debian's Python and torch 1.13 from the repository root:
    /usr/bin/python3 tests/reference/gen_optim_baselines.py

Optimizers: float64 parameters, replayed for NUM_STEPS steps with torch.optim.SGD / AdamW.
Everything the C++ test needs to replay the same run is a closed-form formula, evaluated
the same way on both sides (scalar libm calls, then the same tensor ops):
  initial parameter k, flat element i:  0.5 * cos(0.37 * i + k)
  gradient at step t (1-based):         p * 0.05 + sin(0.1 * t + 0.01 * i + 0.5 * k)
  learning rate of a group at step t:   group_lr * (1 - lr_decay_per_step * (t - 1))
The parameters are recorded every RECORD_EVERY steps.

Schedules: the lr that torch.optim.lr_scheduler gives before each of 100 optimizer steps
(10 epochs x 10 iterations), for the schedules that match Largo's cosine, multistep, linear
and composite [linear warm-up, cosine] with update_interval "step".
"""

import json
import math
import os
import warnings

import torch

NUM_STEPS = 200
RECORD_EVERY = 50
PARAM_SHAPES = [[3, 4], [5]]
LR_DECAY_PER_STEP = 0.002

OUTPUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "optim", "baselines",
                      "optim_baselines.json")


def flat_tensor(values, shape):
    return torch.tensor(values, dtype=torch.float64).reshape(shape)


def initial_param(k, shape):
    n = math.prod(shape)
    return flat_tensor([0.5 * math.cos(0.37 * i + k) for i in range(n)], shape)


def sin_term(step, k, shape):
    n = math.prod(shape)
    return flat_tensor([math.sin(0.1 * step + 0.01 * i + 0.5 * k) for i in range(n)], shape)


OPTIMIZER_CASES = [
    dict(name="sgd_plain", type="sgd", options=dict(momentum=0.0, dampening=0.0, nesterov=False),
         groups=[dict(lr=0.1, weight_decay=0.0, params=[0, 1])]),
    dict(name="sgd_momentum_weight_decay", type="sgd",
         options=dict(momentum=0.9, dampening=0.0, nesterov=False),
         groups=[dict(lr=0.1, weight_decay=1e-3, params=[0]),
                 dict(lr=0.05, weight_decay=0.0, params=[1])]),
    dict(name="sgd_nesterov", type="sgd", options=dict(momentum=0.9, dampening=0.0, nesterov=True),
         groups=[dict(lr=0.05, weight_decay=1e-4, params=[0, 1])]),
    dict(name="sgd_dampening", type="sgd", options=dict(momentum=0.8, dampening=0.3, nesterov=False),
         groups=[dict(lr=0.1, weight_decay=0.0, params=[0, 1])]),
    dict(name="adamw_default", type="adamw",
         options=dict(betas=[0.9, 0.999], eps=1e-8, amsgrad=False),
         groups=[dict(lr=1e-2, weight_decay=0.0, params=[0, 1])]),
    dict(name="adamw_amsgrad_weight_decay", type="adamw",
         options=dict(betas=[0.8, 0.99], eps=1e-6, amsgrad=True),
         groups=[dict(lr=1e-2, weight_decay=0.05, params=[0]),
                 dict(lr=5e-3, weight_decay=0.0, params=[1])]),
]


def run_optimizer_case(case):
    params = [initial_param(k, shape).requires_grad_() for k, shape in enumerate(PARAM_SHAPES)]
    groups = [dict(params=[params[k] for k in g["params"]], lr=g["lr"],
                   weight_decay=g["weight_decay"]) for g in case["groups"]]
    opts = case["options"]
    if case["type"] == "sgd":
        optimizer = torch.optim.SGD(groups, lr=0.1, momentum=opts["momentum"],
                                    dampening=opts["dampening"], nesterov=opts["nesterov"])
    else:
        optimizer = torch.optim.AdamW(groups, lr=0.1, betas=tuple(opts["betas"]), eps=opts["eps"],
                                      amsgrad=opts["amsgrad"])
    records = []
    for step in range(1, NUM_STEPS + 1):
        for group, spec in zip(optimizer.param_groups, case["groups"]):
            group["lr"] = spec["lr"] * (1.0 - LR_DECAY_PER_STEP * (step - 1))
        for k, p in enumerate(params):
            p.grad = p.detach() * 0.05 + sin_term(step, k, PARAM_SHAPES[k])
        optimizer.step()
        if step % RECORD_EVERY == 0:
            records.append(dict(step=step,
                                params=[p.detach().reshape(-1).tolist() for p in params]))
    return dict(case, param_shapes=PARAM_SHAPES, num_steps=NUM_STEPS,
                lr_decay_per_step=LR_DECAY_PER_STEP, records=records)


NUM_EPOCHS = 10
ITERATIONS_PER_EPOCH = 10
BASE_LR = 0.4


def cosine_closed_form(start, end, where):
    return end + 0.5 * (start - end) * (1 + math.cos(math.pi * where))


def schedule_cases():
    total = NUM_EPOCHS * ITERATIONS_PER_EPOCH
    gamma = 0.1

    def make(name, build_scheduler, options, closed_form):
        param = torch.zeros(1, requires_grad=True)
        optimizer = torch.optim.SGD([param], lr=BASE_LR)
        scheduler = build_scheduler(optimizer)
        lrs = []
        for _ in range(total):
            lrs.append(optimizer.param_groups[0]["lr"])
            optimizer.step()
            scheduler.step()
        # Sanity check that the torch scheduler is the schedule Largo claims to match.
        worst = max(abs(lr - closed_form(t)) for t, lr in enumerate(lrs))
        assert worst < 1e-12, f"{name}: torch differs from the closed form by {worst}"
        options = dict(options, update_interval="step")
        return dict(name=name, options=options, num_epochs=NUM_EPOCHS,
                    iterations_per_epoch=ITERATIONS_PER_EPOCH, lrs=lrs)

    end_cosine = 0.001
    warmup_steps = 10
    return [
        make("cosine",
             lambda opt: torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=total,
                                                                    eta_min=end_cosine),
             dict(name="cosine", start_value=BASE_LR, end_value=end_cosine),
             lambda t: cosine_closed_form(BASE_LR, end_cosine, t / total)),
        make("multistep",
             lambda opt: torch.optim.lr_scheduler.MultiStepLR(opt, milestones=[30, 60, 90],
                                                              gamma=gamma),
             dict(name="multistep", values=[BASE_LR * gamma**i for i in range(4)],
                  milestones=[3, 6, 9], num_epochs=NUM_EPOCHS),
             lambda t: BASE_LR * gamma**(t // 30)),
        make("linear",
             lambda opt: torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.25, end_factor=1.0,
                                                           total_iters=total),
             dict(name="linear", start_value=BASE_LR * 0.25, end_value=BASE_LR),
             lambda t: BASE_LR * 0.25 + (BASE_LR - BASE_LR * 0.25) * t / total),
        make("warmup_cosine",
             lambda opt: torch.optim.lr_scheduler.SequentialLR(
                 opt,
                 [torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.1, end_factor=1.0,
                                                    total_iters=warmup_steps),
                  torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=total - warmup_steps)],
                 milestones=[warmup_steps]),
             dict(name="composite",
                  schedulers=[dict(name="linear", start_value=BASE_LR * 0.1, end_value=BASE_LR),
                              dict(name="cosine", start_value=BASE_LR, end_value=0.0)],
                  lengths=[warmup_steps / total, 1 - warmup_steps / total],
                  interval_scaling=["rescaled", "rescaled"]),
             lambda t: (BASE_LR * 0.1 + (BASE_LR - BASE_LR * 0.1) * t / warmup_steps
                        if t < warmup_steps else
                        cosine_closed_form(BASE_LR, 0.0, (t - warmup_steps) / (total - warmup_steps)))),
    ]


def main():
    torch.set_num_threads(1)
    # SequentialLR steps its sub-schedulers with an explicit epoch and warns about it.
    warnings.filterwarnings("ignore", message="The epoch parameter")
    baselines = {
        "_generated_by": "tests/reference/gen_optim_baselines.py",
        "_note": "GENERATED FILE, do not edit. Regenerate with "
                 "/usr/bin/python3 tests/reference/gen_optim_baselines.py",
        "torch_version": torch.__version__,
        "optimizers": [run_optimizer_case(case) for case in OPTIMIZER_CASES],
        "schedules": schedule_cases(),
    }
    os.makedirs(os.path.dirname(OUTPUT), exist_ok=True)
    with open(OUTPUT, "w") as f:
        json.dump(baselines, f, indent=1)
        f.write("\n")
    print(f"wrote {os.path.normpath(OUTPUT)}")


if __name__ == "__main__":
    main()
