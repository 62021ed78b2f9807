#!/usr/bin/env python3
"""Writes tests/optim/baselines/optim_baselines.json: PyTorch's answers for Largo's optimizer
and learning-rate schedule tests (tests/optim/optimizer_baseline_test.cpp,
tests/optim/lr_schedule_test.cpp).

Run from the repository root with LARGO_PYTHON (scripts/torch_env.sh: the venv of
scripts/install_deps.sh, PyTorch 2.11):
    $LARGO_PYTHON tests/reference/gen_optim_baselines.py

Optimizers: float64 parameters, replayed for NUM_STEPS steps with torch.optim.SGD / Adam /
AdamW / RMSprop (a few cases also in float32, for NUM_STEPS_FLOAT32 steps), and with LAMB, LARC and VISSL's LARS as written from their published algorithms in
tests/reference/reference_optimizers.py (PyTorch 2.11 has none of them).
Everything the C++ test needs to replay the same run is a closed-form formula, evaluated
the same way on both sides (scalar libm calls, then the same tensor ops):
  initial parameter k, flat element i:  0.5 * cos(0.37 * i + k)
  gradient at step t (1-based):         p * 0.05 + sin(0.1 * t + 0.01 * i + 0.5 * k)
  learning rate of a group at step t:   group_lr * (1 - lr_decay_per_step * (t - 1))
The parameters are recorded RECORDS times, evenly spaced (float64 values in the JSON). A case may start some parameters at
zero ("zero_init_params") or give some a zero gradient at every step ("zero_grad_params"),
to reach LARC's, LAMB's and LARS's zero-norm branches.

Gradient clipping: torch.nn.utils.clip_grad_norm_ on the closed-form gradients of a few
steps, scaled up so that most cases clip, for several norm types.

Schedules: the lr that torch.optim.lr_scheduler gives before each of 100 optimizer steps
(10 epochs x 10 iterations), for the schedules that match Largo's cosine, multistep, linear
and composite [linear warm-up, cosine] with update_interval "step".
"""

import json
import math
import os
import warnings

import torch

from reference_optimizers import LAMB, LARC, LARS

NUM_STEPS = 200
NUM_STEPS_FLOAT32 = 20  # float32 cases: four records, every NUM_STEPS_FLOAT32 / 4 steps
RECORDS = 4
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
    # Adam with VISSL's weight decay: torch.optim.Adam's L2 penalty (ClassyVision passes the
    # group's weight_decay to it), amsgrad, and 1 - beta1 >= 0.5, where ATen's lerp takes its
    # other form.
    dict(name="adam_default", type="adam",
         options=dict(betas=[0.9, 0.999], eps=1e-8, amsgrad=False),
         groups=[dict(lr=1e-2, weight_decay=0.0, params=[0, 1])]),
    dict(name="adam_amsgrad_weight_decay", type="adam",
         options=dict(betas=[0.8, 0.99], eps=1e-6, amsgrad=True),
         groups=[dict(lr=1e-2, weight_decay=0.05, params=[0]),
                 dict(lr=5e-3, weight_decay=0.0, params=[1])]),
    dict(name="adam_small_beta1", type="adam",
         options=dict(betas=[0.3, 0.9], eps=1e-8, amsgrad=False),
         groups=[dict(lr=5e-3, weight_decay=1e-2, params=[0, 1])]),
    # RMSprop: torch's defaults; VISSL's (momentum 0.9 and weight decay 1e-4 from its
    # OPTIMIZER defaults); centered with momentum and decay in one group only.
    dict(name="rmsprop_default", type="rmsprop",
         options=dict(alpha=0.99, eps=1e-8, momentum=0.0, centered=False),
         groups=[dict(lr=1e-3, weight_decay=0.0, params=[0, 1])]),
    dict(name="rmsprop_vissl_defaults", type="rmsprop",
         options=dict(alpha=0.99, eps=1e-8, momentum=0.9, centered=False),
         groups=[dict(lr=1e-3, weight_decay=1e-4, params=[0, 1])]),
    dict(name="rmsprop_centered_momentum_weight_decay", type="rmsprop",
         options=dict(alpha=0.9, eps=1e-6, momentum=0.5, centered=True),
         groups=[dict(lr=2e-3, weight_decay=1e-2, params=[0]),
                 dict(lr=1e-3, weight_decay=0.0, params=[1])]),
    # float32 parameters, state and gradients (as training runs them): fewer steps, a
    # tolerance derived from float32's rounding (tests/optim/optimizer_baseline_test.cpp).
    dict(name="adam_amsgrad_weight_decay_float32", type="adam", dtype="float32",
         num_steps=NUM_STEPS_FLOAT32,
         options=dict(betas=[0.8, 0.99], eps=1e-6, amsgrad=True),
         groups=[dict(lr=1e-2, weight_decay=0.05, params=[0]),
                 dict(lr=5e-3, weight_decay=0.0, params=[1])]),
    dict(name="rmsprop_centered_momentum_weight_decay_float32", type="rmsprop", dtype="float32",
         num_steps=NUM_STEPS_FLOAT32,
         options=dict(alpha=0.9, eps=1e-6, momentum=0.5, centered=True),
         groups=[dict(lr=2e-3, weight_decay=1e-2, params=[0]),
                 dict(lr=1e-3, weight_decay=0.0, params=[1])]),
    dict(name="lamb_default", type="lamb", options=dict(betas=[0.9, 0.999], eps=1e-6),
         groups=[dict(lr=1e-2, weight_decay=0.0, params=[0, 1])]),
    dict(name="lamb_weight_decay", type="lamb", options=dict(betas=[0.8, 0.99], eps=1e-8),
         groups=[dict(lr=2e-2, weight_decay=0.1, params=[0]),
                 dict(lr=1e-2, weight_decay=0.0, params=[1])]),
    # LAMB's zero-norm branch: parameter 2 starts at zero (||p|| = 0 at the first step).
    dict(name="lamb_zero_norm", type="lamb", options=dict(betas=[0.9, 0.999], eps=1e-6),
         param_shapes=[[3, 4], [5], [4]], zero_init_params=[2],
         groups=[dict(lr=1e-2, weight_decay=0.01, params=[0, 1, 2])]),
    # LARC (Apex's defaults trust 0.02 and clip, VISSL's 0.001 and no clip; larger trust
    # coefficients here so that the adapted learning rates move the parameters visibly).
    dict(name="larc_sgd_clip", type="larc", inner="sgd",
         options=dict(momentum=0.9, dampening=0.0, nesterov=False),
         larc=dict(trust_coefficient=0.02, clip=True, eps=1e-8),
         groups=[dict(lr=0.1, weight_decay=1e-3, params=[0]),
                 dict(lr=0.05, weight_decay=0.0, params=[1])]),
    dict(name="larc_sgd_scale", type="larc", inner="sgd",
         options=dict(momentum=0.9, dampening=0.0, nesterov=True),
         larc=dict(trust_coefficient=0.5, clip=False, eps=1e-8),
         groups=[dict(lr=0.1, weight_decay=5e-3, params=[0, 1])]),
    # Parameter 2 starts at zero (||p|| = 0 at step 1: left unscaled), parameter 3 never
    # gets a gradient signal (||g|| = 0 at every step: no decay, no scaling, as in Apex).
    dict(name="larc_sgd_zero_norms", type="larc", inner="sgd",
         options=dict(momentum=0.9, dampening=0.0, nesterov=False),
         larc=dict(trust_coefficient=0.02, clip=True, eps=1e-8),
         param_shapes=[[3, 4], [5], [4], [2, 3]], zero_init_params=[2], zero_grad_params=[3],
         groups=[dict(lr=0.1, weight_decay=1e-2, params=[0, 1, 2, 3])]),
    # Parameter 1 excluded from adaptation (exclude_bias_and_norm): decayed, never scaled.
    dict(name="larc_sgd_excluded", type="larc", inner="sgd",
         options=dict(momentum=0.9, dampening=0.0, nesterov=False),
         larc=dict(trust_coefficient=0.02, clip=True, eps=1e-8), excluded_params=[1],
         groups=[dict(lr=0.1, weight_decay=1e-2, params=[0, 1])]),
    dict(name="larc_adamw_scale", type="larc", inner="adamw",
         options=dict(betas=[0.9, 0.999], eps=1e-8, amsgrad=False),
         larc=dict(trust_coefficient=0.1, clip=False, eps=1e-8),
         groups=[dict(lr=1e-2, weight_decay=1e-2, params=[0, 1])]),
    dict(name="larc_lamb_clip", type="larc", inner="lamb",
         options=dict(betas=[0.9, 0.999], eps=1e-6),
         larc=dict(trust_coefficient=0.02, clip=True, eps=1e-8),
         groups=[dict(lr=1e-2, weight_decay=1e-2, params=[0, 1])]),
    # LARS (VISSL's lars): its defaults, every parameter adapted.
    dict(name="lars_default", type="lars",
         options=dict(momentum=0.9, eta=0.001, exclude_bias_and_norm=False),
         groups=[dict(lr=0.1, weight_decay=0.0, params=[0, 1])]),
    # exclude_bias_and_norm: parameter 1 (1-D) keeps q = 1 but is still decayed; a larger eta
    # so that the adapted parameter moves visibly.
    dict(name="lars_excluded_weight_decay", type="lars",
         options=dict(momentum=0.9, eta=0.02, exclude_bias_and_norm=True),
         groups=[dict(lr=0.1, weight_decay=1e-3, params=[0]),
                 dict(lr=0.05, weight_decay=1e-2, params=[1])]),
    # The where() branches: parameter 2 starts at zero (||p|| = 0 at step 1: q = 1); parameter
    # 3 has a zero gradient and, in a group without decay, ||dp|| = 0 at every step (q = 1,
    # not eta ||p|| / 0); parameter 4 is zero with a zero gradient (q = 1, not 0 / 0); parameter
    # 1 has a zero gradient but decay, so dp = wd p and q = eta / wd.
    dict(name="lars_zero_norms", type="lars",
         options=dict(momentum=0.9, eta=0.02, exclude_bias_and_norm=False),
         param_shapes=[[3, 4], [5], [4], [2, 3], [3]], zero_init_params=[2, 4],
         zero_grad_params=[1, 3, 4],
         groups=[dict(lr=0.1, weight_decay=1e-2, params=[0, 1, 2]),
                 dict(lr=0.1, weight_decay=0.0, params=[3, 4])]),
]


def make_torch_optimizer(kind, opts, groups):
    if kind == "sgd":
        return torch.optim.SGD(groups, lr=0.1, momentum=opts["momentum"],
                               dampening=opts["dampening"], nesterov=opts["nesterov"])
    if kind == "adamw":
        return torch.optim.AdamW(groups, lr=0.1, betas=tuple(opts["betas"]), eps=opts["eps"],
                                 amsgrad=opts["amsgrad"])
    if kind == "adam":
        return torch.optim.Adam(groups, lr=0.1, betas=tuple(opts["betas"]), eps=opts["eps"],
                                amsgrad=opts["amsgrad"])
    if kind == "rmsprop":
        return torch.optim.RMSprop(groups, lr=0.1, alpha=opts["alpha"], eps=opts["eps"],
                                   momentum=opts["momentum"], centered=opts["centered"])
    if kind == "lamb":
        return LAMB(groups, lr=0.1, betas=tuple(opts["betas"]), eps=opts["eps"])
    if kind == "lars":
        return LARS(groups, lr=0.1, momentum=opts["momentum"], eta=opts["eta"],
                    exclude_bias_and_norm=opts["exclude_bias_and_norm"])
    raise ValueError(kind)


def run_optimizer_case(case):
    shapes = case.get("param_shapes", PARAM_SHAPES)
    zero_init = case.get("zero_init_params", [])
    zero_grad = case.get("zero_grad_params", [])
    dtype = getattr(torch, case.get("dtype", "float64"))
    num_steps = case.get("num_steps", NUM_STEPS)
    record_every = num_steps // RECORDS
    # Computed in float64, then rounded to the case's dtype (the C++ test does the same).
    params = [(torch.zeros(shape, dtype=torch.float64) if k in zero_init
               else initial_param(k, shape)).to(dtype).requires_grad_()
              for k, shape in enumerate(shapes)]
    groups = [dict(params=[params[k] for k in g["params"]], lr=g["lr"],
                   weight_decay=g["weight_decay"]) for g in case["groups"]]
    if case["type"] == "larc":
        inner = make_torch_optimizer(case["inner"], case["options"], groups)
        optimizer = LARC(inner, excluded=[params[k] for k in case.get("excluded_params", [])],
                         **case["larc"])
    else:
        optimizer = make_torch_optimizer(case["type"], case["options"], groups)
    records = []
    for step in range(1, num_steps + 1):
        for group, spec in zip(optimizer.param_groups, case["groups"]):
            group["lr"] = spec["lr"] * (1.0 - LR_DECAY_PER_STEP * (step - 1))
        for k, p in enumerate(params):
            p.grad = (torch.zeros_like(p) if k in zero_grad
                      else p.detach() * 0.05 + sin_term(step, k, shapes[k]).to(dtype))
        optimizer.step()
        if step % record_every == 0:
            records.append(dict(step=step,
                                params=[p.detach().double().reshape(-1).tolist() for p in params]))
    initial = [0.0 if k in zero_init else initial_param(k, shape).to(dtype)
               for k, shape in enumerate(shapes)]
    moved = max(float((p.detach() - i).abs().max()) for p, i in zip(params, initial))
    print(f"{case['name']:28} largest change of a parameter over the run: {moved:.3g}")
    return dict(case, param_shapes=shapes, num_steps=num_steps, dtype=case.get("dtype", "float64"),
                lr_decay_per_step=LR_DECAY_PER_STEP, records=records)


CLIP_SHAPES = [[3, 4], [5], [2, 2, 2]]
CLIP_CASES = [
    dict(name="l2", norm_type=2.0, max_norm=1.0, grad_scale=3.0),
    dict(name="l1", norm_type=1.0, max_norm=2.0, grad_scale=1.0),
    dict(name="inf", norm_type=float("inf"), max_norm=0.5, grad_scale=1.0),
    dict(name="l3", norm_type=3.0, max_norm=1.5, grad_scale=2.0),
    dict(name="l2_no_clip", norm_type=2.0, max_norm=100.0, grad_scale=1.0),
]


def clip_cases():
    cases = []
    for case in CLIP_CASES:
        step = 7
        grads = [(initial_param(k, shape) * 0.05 + sin_term(step, k, shape)) * case["grad_scale"]
                 for k, shape in enumerate(CLIP_SHAPES)]
        params = [torch.zeros(shape, dtype=torch.float64, requires_grad=True)
                  for shape in CLIP_SHAPES]
        for p, g in zip(params, grads):
            p.grad = g.clone()
        total = torch.nn.utils.clip_grad_norm_(params, case["max_norm"], case["norm_type"])
        cases.append(dict(case, norm_type="inf" if case["norm_type"] == float("inf")
                          else case["norm_type"], step=step, param_shapes=CLIP_SHAPES,
                          total_norm=float(total),
                          clipped=[p.grad.reshape(-1).tolist() for p in params]))
    return cases


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
                 "$LARGO_PYTHON tests/reference/gen_optim_baselines.py",
        "torch_version": torch.__version__,
        "optimizers": [run_optimizer_case(case) for case in OPTIMIZER_CASES],
        "schedules": schedule_cases(),
        "clipping": clip_cases(),
    }
    os.makedirs(os.path.dirname(OUTPUT), exist_ok=True)
    with open(OUTPUT, "w") as f:
        json.dump(baselines, f, indent=1)
        f.write("\n")
    print(f"wrote {os.path.normpath(OUTPUT)}")


if __name__ == "__main__":
    main()
