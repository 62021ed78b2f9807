#!/usr/bin/env python3
"""Writes tests/precision/baselines/grad_scaler_baselines.json: the reference answers for
Largo's GradScaler tests (tests/precision/grad_scaler_test.cpp).

Run from the repository root with LARGO_PYTHON (scripts/torch_env.sh: the venv of
scripts/install_deps.sh, PyTorch 2.11):
    $LARGO_PYTHON tests/reference/gen_grad_scaler_baselines.py

1. "pytorch_runs": PyTorch's own GradScaler class (torch.amp.GradScaler("cuda"), formerly
   torch.cuda.amp.GradScaler) drives short training runs on CPU tensors, so no GPU is needed.
   Without CUDA that scaler disables itself, and in torch 1.13, where this script was
   written, its two kernels (_amp_foreach_non_finite_check_and_unscale_, _amp_update_scale_)
   were CUDA-only. So the script (a) constructs the scaler as if CUDA were available, (b)
   multiplies the loss by scaler._scale itself (what scale() does; torch 1.13 asserted a
   CUDA tensor there), (c) drops that CUDA assertion from its per-device copy helper (torch
   2.11's has none), and (d) replaces the two kernels with Python versions of what they
   compute (PyTorch 2.11 has CPU kernels for both; with them the baselines are bit-identical):
     unscale:  found_inf = 1 if any element of any gradient is inf/NaN; grad *= inv_scale
               (inv_scale = float32(1 / float64(scale)), computed by GradScaler itself)
     update:   found_inf: scale = float32(scale * backoff), tracker = 0
               else:      tracker + 1 == interval: scale = float32(scale * growth) if that is
                          finite, tracker = 0; else tracker += 1
   Everything else -- the step/skip decision, the per-step state machine, state_dict -- is
   PyTorch's code. Each run: two float32 parameters (closed-form initial values), loss
   sum over them of 0.5 * ((p + c_t) ** 2).sum() with c_t closed-form, inf or NaN written into one
   gradient element at listed steps, SGD (lr 0.05, no momentum). Recorded per step: whether
   the optimizer stepped, the scale and growth tracker after update(), the unscaled
   gradients of clean steps and the parameters.

2. "rule_sequences": long overflow patterns ("." clean, "X" overflow) through the same
   PyTorch GradScaler (one parameter whose gradient is set to inf on "X"), recording the
   scale and tracker after every update.

3. "hysteresis_sequences": DeepSpeed's dynamic loss scaler options that PyTorch lacks
   (hysteresis, consecutive_hysteresis, min_loss_scale with an error at the minimum, and
   Apex's max_loss_scale). DeepSpeed is not installed here, so these come from the Python
   function hysteresis_rule() below: an independent implementation of the rule as
   documented in ../shared/reference/ANCHORS.md and include/largo/precision/grad_scaler.h.
"""

import json
import math
import os
import warnings

import torch
from torch.amp import GradScaler
from torch.amp import grad_scaler as grad_scaler_module

OUTPUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "precision", "baselines",
                      "grad_scaler_baselines.json")

PARAM_SHAPES = [[3, 4], [5]]
LR = 0.05


# ---- the two CUDA-only kernels, in Python --------------------------------------------------
def unscale_kernel(grads, found_inf, inv_scale):
    for grad in grads:
        if not bool(torch.isfinite(grad).all()):
            found_inf.fill_(1.0)
        grad.mul_(inv_scale)


def update_scale_kernel(scale, growth_tracker, found_inf, growth_factor, backoff_factor,
                        growth_interval):
    # float32 scale times a double factor, rounded back to float32 (as the CUDA kernel).
    if found_inf.item() != 0.0:
        scale.fill_(scale.item() * backoff_factor)
        growth_tracker.fill_(0)
    else:
        successful = int(growth_tracker.item()) + 1
        if successful == growth_interval:
            grown = torch.tensor(scale.item() * growth_factor, dtype=torch.float32)
            if bool(torch.isfinite(grown)):
                scale.copy_(grown)
            growth_tracker.fill_(0)
        else:
            growth_tracker.fill_(successful)
    return scale


torch._amp_foreach_non_finite_check_and_unscale_ = unscale_kernel
torch._amp_update_scale_ = update_scale_kernel


class CpuReplicator(grad_scaler_module._MultiDeviceReplicator):
    """GradScaler's per-device copy helper without its assertion that the tensor is on CUDA."""

    def __init__(self, master_tensor):
        self.master = master_tensor
        self._per_device_tensors = {}


grad_scaler_module._MultiDeviceReplicator = CpuReplicator


def make_scaler(**kwargs):
    real_is_available = torch.cuda.is_available
    torch.cuda.is_available = lambda: True  # so that __init__ keeps the scaler enabled
    try:
        scaler = GradScaler("cuda", **kwargs)
    finally:
        torch.cuda.is_available = real_is_available
    scaler._lazy_init_scale_growth_tracker(torch.device("cpu"))
    return scaler


def flat(values, shape):
    return torch.tensor(values, dtype=torch.float32).reshape(shape)


def initial_param(k, shape):
    n = math.prod(shape)
    return flat([0.5 * math.cos(0.37 * i + k) for i in range(n)], shape)


def coefficient(step, k, shape):
    n = math.prod(shape)
    return flat([math.sin(0.1 * step + 0.01 * i + 0.5 * k) for i in range(n)], shape)


def pytorch_run(name, scaler_kwargs, num_steps, inject):
    """inject: {step: (param index, flat element, "inf" | "nan" | "-inf")}."""
    params = [initial_param(k, s).requires_grad_(True) for k, s in enumerate(PARAM_SHAPES)]
    optimizer = torch.optim.SGD(params, lr=LR)
    scaler = make_scaler(**scaler_kwargs)
    # Record whether GradScaler.step really called optimizer.step().
    ran = []
    real_step = optimizer.step
    optimizer.step = lambda *args, **kwargs: (ran.append(True), real_step(*args, **kwargs))[1]
    steps = []
    for step in range(num_steps):
        optimizer.zero_grad(set_to_none=True)
        # One path from the loss to each parameter (q is used twice, but q * q's two
        # gradients are equal and their sum exact), so autograd's accumulation order cannot
        # change the rounding: gradient = scale * (p + c).
        loss = 0
        for k, p in enumerate(params):
            q = p + coefficient(step, k, p.shape)
            loss = loss + 0.5 * (q * q).sum()
        (loss * scaler._scale).backward()  # scaler.scale(loss) without its CUDA assert
        if step in inject:
            k, i, value = inject[step]
            params[k].grad.view(-1)[i] = float(value)
        scaler_before = scaler.get_scale()
        scaler.unscale_(optimizer)
        grads = [p.grad.detach().clone() for p in params]
        ran.clear()
        scaler.step(optimizer)
        stepped = bool(ran)
        scaler.update()
        record = {
            "step": step,
            "stepped": stepped,
            "scale_before": scaler_before,
            "scale_after": scaler.get_scale(),
            "growth_tracker_after": int(scaler._get_growth_tracker()),
            "params": [p.detach().reshape(-1).tolist() for p in params],
        }
        if stepped:
            record["unscaled_grads"] = [g.reshape(-1).tolist() for g in grads]
        steps.append(record)
    state = scaler.state_dict()
    return {
        "name": name,
        "scaler": scaler_kwargs,
        "lr": LR,
        "param_shapes": PARAM_SHAPES,
        "num_steps": num_steps,
        "inject": [{"step": s, "param": k, "element": i, "value": v}
                   for s, (k, i, v) in sorted(inject.items())],
        "steps": steps,
        "state_dict": {"scale": state["scale"], "growth_factor": state["growth_factor"],
                       "backoff_factor": state["backoff_factor"],
                       "growth_interval": state["growth_interval"],
                       "_growth_tracker": state["_growth_tracker"]},
    }


def pattern(length, period_a, period_b, burst_every=0, burst_length=0):
    """A deterministic overflow pattern with isolated overflows and bursts."""
    marks = []
    for i in range(length):
        overflow = (i % period_a == period_a - 1) or (i % period_b == 3)
        if burst_every and i % burst_every < burst_length and i >= burst_every:
            overflow = True
        marks.append("X" if overflow else ".")
    return "".join(marks)


def rule_sequence(name, scaler_kwargs, overflows):
    param = torch.zeros(1, requires_grad=True)
    optimizer = torch.optim.SGD([param], lr=0.0)
    scaler = make_scaler(**scaler_kwargs)
    scales, trackers = [], []
    for mark in overflows:
        optimizer.zero_grad(set_to_none=True)
        (param.sum() * scaler._scale).backward()
        if mark == "X":
            param.grad.fill_(float("inf"))
        scaler.unscale_(optimizer)
        scaler.step(optimizer)
        scaler.update()
        scales.append(scaler.get_scale())
        trackers.append(int(scaler._get_growth_tracker()))
    return {"name": name, "scaler": scaler_kwargs, "overflows": overflows, "scales": scales,
            "growth_trackers": trackers}


def hysteresis_rule(overflows, init_scale, growth_factor, backoff_factor, growth_interval,
                    hysteresis, consecutive_hysteresis, min_loss_scale, max_loss_scale):
    """DeepSpeed's dynamic loss scaling rule (with Apex's maximum), independently written.
    Returns per-update (scale, hysteresis_left, growth_tracker) and the index of the update
    that raises (the scale already at its minimum), or None."""
    f32 = lambda x: float(torch.tensor(x, dtype=torch.float32))
    scale, tracker, left = f32(init_scale), 0, hysteresis
    scales, lefts, trackers = [], [], []
    for index, mark in enumerate(overflows):
        if mark == "X":
            tracker = 0
            if left > 1:
                left -= 1
            else:
                if min_loss_scale > 0 and scale <= min_loss_scale:
                    return scales, lefts, trackers, index
                scale = f32(max(scale * backoff_factor, min_loss_scale))
        else:
            if consecutive_hysteresis:
                left = hysteresis
            tracker += 1
            if tracker >= growth_interval:
                grown = f32(min(scale * growth_factor, max_loss_scale))
                if math.isfinite(grown):
                    scale = grown
                tracker = 0
                left = hysteresis
        scales.append(scale)
        lefts.append(left)
        trackers.append(tracker)
    return scales, lefts, trackers, None


def hysteresis_sequence(name, overflows, **options):
    scales, lefts, trackers, error_at = hysteresis_rule(overflows, **options)
    return {"name": name, "options": options, "overflows": overflows, "scales": scales,
            "hysteresis_left": lefts, "growth_trackers": trackers, "error_at": error_at}


def main():
    warnings.simplefilter("ignore")
    runs = [
        pytorch_run("defaults_with_inf_and_nan", {"init_scale": 2.0 ** 16, "growth_interval": 4},
                    24, {2: (0, 5, "inf"), 3: (1, 0, "nan"), 11: (0, 0, "-inf")}),
        # A scale that is not a power of two: 1 / scale is not exact, so the unscaled
        # gradients depend on computing the reciprocal in float64 and applying it in float32.
        pytorch_run("odd_scale_and_factors",
                    {"init_scale": 1000.0, "growth_factor": 3.0, "backoff_factor": 0.25,
                     "growth_interval": 3},
                    20, {4: (1, 2, "nan"), 5: (0, 11, "inf"), 14: (1, 4, "inf")}),
    ]
    rules = [
        rule_sequence("growth_and_backoff", {"init_scale": 2.0 ** 16, "growth_interval": 5},
                      pattern(200, 13, 29, burst_every=70, burst_length=6)),
        rule_sequence("growth_saturates_at_float32_max",
                      {"init_scale": 2.0 ** 125, "growth_interval": 1}, "." * 6 + "X" + "." * 4),
        rule_sequence("odd_factors", {"init_scale": 3.0, "growth_factor": 1.5,
                                      "backoff_factor": 0.3, "growth_interval": 2},
                      pattern(60, 7, 11)),
    ]
    base = {"init_scale": 2.0 ** 10, "growth_factor": 2.0, "backoff_factor": 0.5,
            "growth_interval": 4, "hysteresis": 1, "consecutive_hysteresis": False,
            "min_loss_scale": 0.0, "max_loss_scale": float("inf")}
    hysteresis = [
        hysteresis_sequence("hysteresis_2", pattern(120, 9, 17, burst_every=40, burst_length=4),
                            **{**base, "hysteresis": 2}),
        hysteresis_sequence("hysteresis_3_consecutive",
                            pattern(120, 9, 17, burst_every=40, burst_length=5),
                            **{**base, "hysteresis": 3, "consecutive_hysteresis": True}),
        hysteresis_sequence("min_scale_clamps_then_errors", "..XX.X.XXXXXXXXXXXX....",
                            **{**base, "init_scale": 64.0, "min_loss_scale": 3.0}),
        hysteresis_sequence("min_scale_with_hysteresis", "X.XXXXXXXXXXXXXXXX",
                            **{**base, "init_scale": 16.0, "hysteresis": 2,
                               "min_loss_scale": 1.0}),
        hysteresis_sequence("apex_max_scale", "." * 40 + "X" + "." * 12,
                            **{**base, "init_scale": 2.0 ** 20, "growth_interval": 3,
                               "max_loss_scale": 2.0 ** 24}),
    ]
    for sequence in hysteresis:
        # JSON has no infinity; the C++ side reads null as "no maximum".
        if math.isinf(sequence["options"]["max_loss_scale"]):
            sequence["options"]["max_loss_scale"] = None
    baselines = {
        "_generated_by": "tests/reference/gen_grad_scaler_baselines.py",
        "_note": "GENERATED FILE, do not edit. Regenerate with "
                 "$LARGO_PYTHON tests/reference/gen_grad_scaler_baselines.py",
        "torch_version": torch.__version__,
        "pytorch_runs": runs,
        "rule_sequences": rules,
        "hysteresis_sequences": hysteresis,
    }
    os.makedirs(os.path.dirname(OUTPUT), exist_ok=True)
    with open(OUTPUT, "w") as out:
        json.dump(baselines, out, indent=1)
        out.write("\n")
    print(f"wrote {os.path.normpath(OUTPUT)}")


if __name__ == "__main__":
    main()
