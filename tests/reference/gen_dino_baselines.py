#!/usr/bin/env python3
"""Reference values of VISSL's DINO, transcribed from its code (VISSL is not installed here):
vissl/models/heads/dino_head.py (DINOHead), vissl/losses/dino_loss.py (DINOLoss.forward and
update_center), vissl/hooks/dino_hooks.py (the teacher temperature schedule) and
vissl/hooks/hook_utils.py (MomentumTeacherInLossHook: the cosine momentum and the EMA update).
Writes tests/models/baselines/dino_baselines.json:

    $LARGO_PYTHON tests/reference/gen_dino_baselines.py

Cases:
  head_*         a DINOHead built under torch.manual_seed (its initial state, which the C++ head
                 must reproduce from the same seed), a float32 batch, the scores, and the
                 gradients of sum(scores * weights) with respect to the input and weight_v.
  loss_one_rank  DINOLoss over several iterations at world size 1: the teacher temperature of
                 each iteration (the float32 linspace warm-up, then the max), the loss, the
                 center after it, and the student's gradient at the last iteration.
  loss_two_ranks the same at world size 2, each rank with its own rows: the all-reduce of
                 update_center simulated by summing both ranks' batch sums.
  teacher_temperature  the schedule of VISSL's defaults (0.04 to 0.07 over 37500 iterations, of
                 375300) at iterations around both ends and the middle of the float32 linspace.
  momentum       the cosine teacher momentum at several iterations.
  ema            one EMA update of a teacher head from a student head.
"""
import copy
import json
import math
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "models", "baselines",
                   "dino_baselines.json")


# vissl/models/model_helpers.py: trunc_normal_ with its default absolute bounds a=-2, b=2.
def trunc_normal_(tensor, mean=0.0, std=1.0, a=-2.0, b=2.0):
    def norm_cdf(x):
        return (1.0 + math.erf(x / math.sqrt(2.0))) / 2.0

    with torch.no_grad():
        low = norm_cdf((a - mean) / std)
        high = norm_cdf((b - mean) / std)
        tensor.uniform_(2 * low - 1, 2 * high - 1)
        tensor.erfinv_()
        tensor.mul_(std * math.sqrt(2.0))
        tensor.add_(mean)
        tensor.clamp_(min=a, max=b)
        return tensor


# vissl/models/heads/dino_head.py: DINOHead (model_config and the one-entry num_clusters list
# dropped).
class DINOHead(nn.Module):
    def __init__(self, in_dim, num_clusters, use_bn=False, normalize_last_layer=True,
                 num_layers=3, hidden_dim=2048, bottleneck_dim=256):
        super().__init__()
        if num_layers == 1:
            self.mlp = nn.Linear(in_dim, bottleneck_dim)
        else:
            layers = [nn.Linear(in_dim, hidden_dim)]
            if use_bn:
                layers.append(nn.BatchNorm1d(hidden_dim))
            layers.append(nn.GELU())
            for _ in range(num_layers - 2):
                layers.append(nn.Linear(hidden_dim, hidden_dim))
                if use_bn:
                    layers.append(nn.BatchNorm1d(hidden_dim))
                layers.append(nn.GELU())
            layers.append(nn.Linear(hidden_dim, bottleneck_dim))
            self.mlp = nn.Sequential(*layers)
        self.apply(self._init_weights)
        self.prototypes0 = nn.utils.weight_norm(
            nn.Linear(bottleneck_dim, num_clusters, bias=False))
        self.prototypes0.weight_g.data.fill_(1)
        if normalize_last_layer:
            self.prototypes0.weight_g.requires_grad = False

    def _init_weights(self, m):
        if isinstance(m, nn.Linear):
            trunc_normal_(m.weight, std=0.02)
            if m.bias is not None:
                nn.init.constant_(m.bias, 0)

    def forward(self, x):
        x = self.mlp(x)
        x = nn.functional.normalize(x, dim=-1, p=2)
        return self.prototypes0(x)


def state_of(module):
    return {k: v.detach().tolist() for k, v in module.state_dict().items()}


def head_case(name, seed, batch, **options):
    torch.manual_seed(seed)
    head = DINOHead(**options)
    initial = state_of(head)
    g = torch.Generator().manual_seed(seed + 100)
    x = torch.randn(batch, options["in_dim"], generator=g).requires_grad_()
    weights = torch.randn(batch, options["num_clusters"], generator=g)
    scores = head(x)
    (scores * weights).sum().backward()
    return {"name": name, "seed": seed, "options": options, "initial": initial,
            "input": x.detach().tolist(), "weights": weights.tolist(),
            "scores": scores.detach().tolist(), "input_gradient": x.grad.tolist(),
            "weight_v_gradient": head.prototypes0.weight_v.grad.tolist(),
            "final_state": state_of(head)}  # BatchNorm's running statistics after the forward


# vissl/hooks/dino_hooks.py: DINOHook.update_teacher_temperature's schedule.
def teacher_temp_schedule(t_min, t_max, warmup_iters, max_iteration):
    return torch.cat((torch.linspace(t_min, t_max, warmup_iters),
                      torch.ones(max(0, max_iteration - warmup_iters)) * t_max))


# vissl/losses/dino_loss.py: DINOLoss.forward up to update_center.
def dino_loss(student_output, teacher_output, center, teacher_temp, student_temp, num_crops,
              num_teacher_crops):
    student_out = student_output / student_temp
    student_out = student_out.chunk(num_crops)
    teacher_out = F.softmax((teacher_output - center) / teacher_temp, dim=-1)
    teacher_out = teacher_out.detach().chunk(num_teacher_crops)
    total_loss = 0
    n_loss_terms = 0
    for iq, q in enumerate(teacher_out):
        for v in range(len(student_out)):
            if v == iq:
                continue
            loss = torch.sum(-q * F.log_softmax(student_out[v], dim=-1), dim=-1)
            total_loss += loss.mean()
            n_loss_terms += 1
    total_loss /= n_loss_terms
    return total_loss


# DINOLoss.update_center with dist.all_reduce done by hand over the ranks' teacher outputs.
def update_center(center, teacher_outputs, ema_center):
    batch_center = sum(torch.sum(t, dim=0, keepdim=True) for t in teacher_outputs)
    batch_center = batch_center / (len(teacher_outputs[0]) * len(teacher_outputs))
    return center * ema_center + batch_center * (1 - ema_center)


def loss_case(name, world_size, iterations, n_per_rank, seed):
    options = {"student_temp": 0.1, "teacher_temp_min": 0.04, "teacher_temp_max": 0.07,
               "teacher_temp_warmup_iters": 3, "center_momentum": 0.9, "num_crops": 4,
               "crops_for_teacher": [0, 1], "output_dim": 6}
    num_teacher = len(options["crops_for_teacher"])
    schedule = teacher_temp_schedule(options["teacher_temp_min"], options["teacher_temp_max"],
                                     options["teacher_temp_warmup_iters"], iterations)
    g = torch.Generator().manual_seed(seed)
    center = torch.zeros(1, options["output_dim"])
    steps = []
    for iteration in range(iterations):
        teacher_temp = schedule[iteration].item()
        # Scores of the size a head gives (|s| <= 1 for unit rows and features) scaled to 3,
        # with a per-iteration offset so the center has something to follow.
        students = [torch.randn(options["num_crops"] * n_per_rank, options["output_dim"],
                                generator=g).requires_grad_() for _ in range(world_size)]
        teachers = [torch.randn(num_teacher * n_per_rank, options["output_dim"], generator=g)
                    * 3 + iteration for _ in range(world_size)]
        losses = []
        for student, teacher in zip(students, teachers):
            loss = dino_loss(student, teacher, center, teacher_temp, options["student_temp"],
                             options["num_crops"], num_teacher)
            loss.backward()
            losses.append(loss.item())
        center = update_center(center, teachers, options["center_momentum"])
        steps.append({"student": torch.cat([s.detach() for s in students]).tolist(),
                      "teacher": torch.cat(teachers).tolist(), "teacher_temp": teacher_temp,
                      "losses": losses, "center": center.tolist(),
                      "student_gradient": torch.cat([s.grad for s in students]).tolist()})
    return {"name": name, "world_size": world_size, "n_per_rank": n_per_rank,
            "options": options, "steps": steps}


# vissl/hooks/hook_utils.py: update_momentum_network's cosine schedule.
def teacher_momentum(init_teacher_momentum, iteration, max_iteration):
    return 1 - 0.5 * (1 - init_teacher_momentum) * (
        math.cos(math.pi * iteration / max_iteration) + 1)


def teacher_temperature_case():
    t_min, t_max, warmup, max_iteration = 0.04, 0.07, 37500, 375300
    schedule = teacher_temp_schedule(t_min, t_max, warmup, max_iteration)
    iterations = [0, 1, 2, 18748, 18749, 18750, 18751, 37498, 37499, 37500, 375299]
    return {"name": "teacher_temperature", "teacher_temp_min": t_min, "teacher_temp_max": t_max,
            "teacher_temp_warmup_iters": warmup,
            "points": [{"iteration": i, "teacher_temp": schedule[i].item()} for i in iterations]}


def momentum_case():
    points = [(0.996, i, 10) for i in range(11)] + [(0.996, 1250, 375300), (0.9, 7, 13),
                                                     (1.0, 3, 5), (0.0, 2, 4)]
    return {"name": "momentum", "points": [
        {"base": b, "iteration": i, "max_iteration": n, "momentum": teacher_momentum(b, i, n)}
        for b, i, n in points]}


def ema_case():
    options = {"in_dim": 5, "num_clusters": 7, "use_bn": True, "normalize_last_layer": True,
               "num_layers": 3, "hidden_dim": 6, "bottleneck_dim": 4}
    torch.manual_seed(5)
    student = DINOHead(**options)
    torch.manual_seed(6)
    teacher = DINOHead(**options)
    initial_teacher = state_of(teacher)
    m = teacher_momentum(0.996, 3, 10)
    with torch.no_grad():
        for param_q, param_k in zip(student.parameters(), teacher.parameters()):
            param_k.data.mul_(m).add_((1 - m) * param_q.detach().data)
    return {"name": "ema", "options": options, "momentum": m, "student": state_of(student),
            "teacher": initial_teacher, "updated_teacher": state_of(teacher)}


def main():
    cases = [
        head_case("head_three_layers", seed=1, batch=5, in_dim=6, num_clusters=7,
                  num_layers=3, hidden_dim=8, bottleneck_dim=5),
        head_case("head_bn_trained_norm", seed=2, batch=5, in_dim=6, num_clusters=7,
                  use_bn=True, normalize_last_layer=False, num_layers=2, hidden_dim=8,
                  bottleneck_dim=5),
        head_case("head_one_layer", seed=3, batch=4, in_dim=6, num_clusters=9, num_layers=1,
                  bottleneck_dim=5),
        loss_case("loss_one_rank", world_size=1, iterations=5, n_per_rank=3, seed=11),
        loss_case("loss_two_ranks", world_size=2, iterations=4, n_per_rank=2, seed=12),
        teacher_temperature_case(),
        momentum_case(),
        ema_case(),
    ]
    with open(OUT, "w") as f:
        json.dump({"generator": "tests/reference/gen_dino_baselines.py",
                   "torch_version": torch.__version__, "cases": cases}, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
