#!/usr/bin/env python3
"""Reference values of the learning-rate schedules VISSL adds to ClassyVision's:
polynomial and step_with_fixed_gamma (ClassyVision / fvcore), cosine_warm_restart and
inverse_sqrt (VISSL's vissl/optimizers/param_scheduler/). Written from those sources in
float64 Python; the schedules need no PyTorch. Writes
tests/optim/baselines/vissl_schedule_baselines.json:

    $LARGO_PYTHON tests/reference/gen_vissl_schedule_baselines.py

Each case evaluates its schedule at where = t / 100, t = 0..99 (10 epochs of 10 steps,
update_interval "step"), the points Largo's where_for() gives for those steps.
"""
import bisect
import json
import math
import os

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "optim", "baselines",
                   "vissl_schedule_baselines.json")
# ClassyVision's nudge of `where` before it becomes an index.
WHERE_EPSILON = 1e-6


def polynomial(o, where):
    return o["base_value"] * (1.0 - where) ** o["power"]


def step_with_fixed_gamma(o, where):
    values = [o["base_value"] * o["gamma"] ** i for i in range(o["num_decays"] + 1)]
    return values[int((where + WHERE_EPSILON) * len(values))]


def arange(start, stop, step):
    """numpy.arange's values for floats: ceil((stop - start) / step) of start + i * step."""
    count = max(0, math.ceil((stop - start) / step))
    return [start + i * step for i in range(count)]


def cosine_warm_restart(o, where):
    length, start, end = o["restart_interval_length"], o["start_value"], o["end_value"]
    full = o["wave_type"] == "full"
    restarts = [0.0] + arange(length, 1.0, 2 * length if full else length)
    peaks = []
    for index, restart in enumerate(restarts):
        if o["is_adaptive"]:
            at = length + restart if full else restart
            peaks.append(end + 0.5 * (start - end) * (1 + math.cos(math.pi * at)))
        else:
            peaks.append(start * o["lr_multiplier"] ** index)
    peak = peaks[max(bisect.bisect(restarts, where) - 1, 0)]
    phase = where / length if full else (where % length) / length
    return end + 0.5 * (peak - end) * (1 + math.cos(math.pi * phase))


def inverse_sqrt(o, where):
    factor = o["start_value"]
    if o["warmup_interval_length"] > 0.0:
        factor = o["start_value"] * o["warmup_interval_length"] ** 0.5
    return factor * where ** -0.5 if where > 0.0 else factor


def restart(wave_type, length, multiplier=1.0, adaptive=False):
    return {"name": "cosine_warm_restart", "start_value": 0.4, "end_value": 0.004,
            "restart_interval_length": length, "wave_type": wave_type,
            "lr_multiplier": multiplier, "is_adaptive": adaptive}


CASES = [
    ("polynomial_power_2", polynomial, {"name": "polynomial", "base_value": 0.1, "power": 2.0}),
    ("polynomial_power_0_9", polynomial,
     {"name": "polynomial", "base_value": 0.3, "power": 0.9}),
    ("step_with_fixed_gamma", step_with_fixed_gamma,
     {"name": "step_with_fixed_gamma", "base_value": 0.1, "num_decays": 3, "gamma": 0.1}),
    ("step_with_fixed_gamma_5", step_with_fixed_gamma,
     {"name": "step_with_fixed_gamma", "base_value": 1.6, "num_decays": 4, "gamma": 0.5}),
    ("cosine_warm_restart_half", cosine_warm_restart, restart("half", 0.25, 0.5)),
    ("cosine_warm_restart_half_uneven", cosine_warm_restart, restart("half", 0.3, 0.8)),
    ("cosine_warm_restart_full", cosine_warm_restart, restart("full", 0.2, 0.7)),
    ("cosine_warm_restart_half_adaptive", cosine_warm_restart, restart("half", 0.3, 1.0, True)),
    ("cosine_warm_restart_full_adaptive", cosine_warm_restart, restart("full", 0.15, 1.0, True)),
    ("inverse_sqrt", inverse_sqrt,
     {"name": "inverse_sqrt", "start_value": 4.8, "warmup_interval_length": 0.1}),
    ("inverse_sqrt_no_warmup", inverse_sqrt,
     {"name": "inverse_sqrt", "start_value": 0.5, "warmup_interval_length": 0.0}),
]


def main():
    cases = []
    for name, schedule, options in CASES:
        options = dict(options, update_interval="step")
        values = [schedule(options, t / 100) for t in range(100)]
        cases.append({"name": name, "options": options, "num_epochs": 10,
                      "iterations_per_epoch": 10, "lrs": values})
    with open(OUT, "w") as f:
        json.dump({"generator": "tests/reference/gen_vissl_schedule_baselines.py",
                   "schedules": cases}, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
