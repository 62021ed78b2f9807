"""LAMB, LARC and LARS in PyTorch, written from their published algorithms: the references
that Largo's LAMB, LARC and LARS are tested (tests/reference/gen_optim_baselines.py) and
benchmarked (bench/optimizer_step_reference.py) against. PyTorch 2.11 has none of them.

LAMB: You et al., "Large Batch Optimization for Deep Learning: Training BERT in 76 minutes"
(ICLR 2020), Algorithm 2, with Adam's bias correction and decoupled weight decay:
    m = b1 m + (1 - b1) g;   v = b2 v + (1 - b2) g^2
    u = (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps) + wd p
    r = ||p|| / ||u|| if both are non-zero else 1;   p -= lr r u

LARC: NVIDIA Apex's apex.parallel.LARC (the one VISSL uses), step for step.

LARS: VISSL's _LARS (vissl/optimizers/lars.py, from the Barlow Twins code), step for step:
    dp = g + wd p;   unless excluded (exclude_bias_and_norm and p.ndim == 1):
    q = eta ||p|| / ||dp|| if both are > 0 else 1;   dp = q dp
    mu = momentum mu + dp;   p -= lr mu
"""

import torch


class LAMB(torch.optim.Optimizer):
    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.0,
                 foreach=False):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
        self.foreach = foreach

    def _moments(self, group):
        params, grads, exp_avgs, exp_avg_sqs, steps = [], [], [], [], []
        for p in group["params"]:
            if p.grad is None:
                continue
            state = self.state[p]
            if not state:
                state["step"] = torch.tensor(0.0)
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["step"] += 1
            params.append(p)
            grads.append(p.grad)
            exp_avgs.append(state["exp_avg"])
            exp_avg_sqs.append(state["exp_avg_sq"])
            steps.append(state["step"].item())
        return params, grads, exp_avgs, exp_avg_sqs, steps

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            eps, wd, lr = group["eps"], group["weight_decay"], group["lr"]
            params, grads, exp_avgs, exp_avg_sqs, steps = self._moments(group)
            if not params:
                continue
            bc1 = [1 - beta1 ** t for t in steps]
            bc2 = [1 - beta2 ** t for t in steps]
            if self.foreach:
                torch._foreach_mul_(exp_avgs, beta1)
                torch._foreach_add_(exp_avgs, grads, alpha=1 - beta1)
                torch._foreach_mul_(exp_avg_sqs, beta2)
                torch._foreach_addcmul_(exp_avg_sqs, grads, grads, 1 - beta2)
                denoms = torch._foreach_div(exp_avg_sqs, bc2)
                torch._foreach_sqrt_(denoms)
                torch._foreach_add_(denoms, eps)
                updates = torch._foreach_div(exp_avgs, bc1)
                torch._foreach_div_(updates, denoms)
                if wd != 0:
                    torch._foreach_add_(updates, params, alpha=wd)
                w_norms = torch._foreach_norm(params)
                u_norms = torch._foreach_norm(updates)
                ratios = [(w / u).item() if w > 0 and u > 0 else 1.0
                          for w, u in zip(w_norms, u_norms)]
                torch._foreach_mul_(updates, [-lr * r for r in ratios])
                torch._foreach_add_(params, updates)
                continue
            for i, p in enumerate(params):
                exp_avgs[i].mul_(beta1).add_(grads[i], alpha=1 - beta1)
                exp_avg_sqs[i].mul_(beta2).addcmul_(grads[i], grads[i], value=1 - beta2)
                update = (exp_avgs[i] / bc1[i]) / ((exp_avg_sqs[i] / bc2[i]).sqrt().add_(eps))
                if wd != 0:
                    update.add_(p, alpha=wd)
                w_norm, u_norm = p.norm(), update.norm()
                ratio = (w_norm / u_norm).item() if w_norm > 0 and u_norm > 0 else 1.0
                p.add_(update, alpha=-lr * ratio)


class LARC:
    """apex.parallel.LARC around `optimizer`. `excluded` holds parameters that are not
    adapted (Largo's exclude_bias_and_norm): their weight decay is folded, never scaled.
    foreach=True computes the norms and applies decay and scaling with _foreach ops (the
    same decisions; a faster reference for the benchmark)."""

    def __init__(self, optimizer, trust_coefficient=0.02, clip=True, eps=1e-8, excluded=(),
                 foreach=False):
        self.optim = optimizer
        self.trust_coefficient = trust_coefficient
        self.clip = clip
        self.eps = eps
        self.excluded = {id(p) for p in excluded}
        self.foreach = foreach

    @property
    def param_groups(self):
        return self.optim.param_groups

    def _adaptive_lr(self, param_norm, grad_norm, weight_decay, lr):
        adaptive_lr = self.trust_coefficient * (param_norm) / (
            grad_norm + param_norm * weight_decay + self.eps)
        if self.clip:
            adaptive_lr = min(adaptive_lr / lr, 1)
        return adaptive_lr

    @torch.no_grad()
    def step(self):
        weight_decays = []
        for group in self.optim.param_groups:
            weight_decay = group["weight_decay"] if "weight_decay" in group else 0
            weight_decays.append(weight_decay)
            group["weight_decay"] = 0
            params = [p for p in group["params"] if p.grad is not None]
            if self.foreach:
                self._foreach_adapt(params, weight_decay, group["lr"])
                continue
            for p in params:
                if id(p) in self.excluded:
                    p.grad.data += weight_decay * p.data
                    continue
                param_norm = torch.norm(p.data)
                grad_norm = torch.norm(p.grad.data)
                if param_norm != 0 and grad_norm != 0:
                    adaptive_lr = self._adaptive_lr(param_norm, grad_norm, weight_decay,
                                                    group["lr"])
                    p.grad.data += weight_decay * p.data
                    p.grad.data *= adaptive_lr
        self.optim.step()
        for i, group in enumerate(self.optim.param_groups):
            group["weight_decay"] = weight_decays[i]

    def _foreach_adapt(self, params, weight_decay, lr):
        if not params:
            return
        grads = [p.grad for p in params]
        param_norms = torch._foreach_norm(params)
        grad_norms = torch._foreach_norm(grads)
        decayed, decayed_grads, scaled_grads, scales = [], [], [], []
        for p, g, pn, gn in zip(params, grads, param_norms, grad_norms):
            if id(p) in self.excluded:
                decayed.append(p)
                decayed_grads.append(g)
            elif pn != 0 and gn != 0:
                decayed.append(p)
                decayed_grads.append(g)
                scaled_grads.append(g)
                scales.append(float(self._adaptive_lr(pn, gn, weight_decay, lr)))
        if weight_decay != 0 and decayed:
            torch._foreach_add_(decayed_grads, torch._foreach_mul(decayed, weight_decay))
        if scaled_grads:
            torch._foreach_mul_(scaled_grads, scales)


class LARS(torch.optim.Optimizer):
    """VISSL's _LARS, its step() copied as written (torch.where for the zero-norm branches)."""

    def __init__(self, params, lr=0.1, momentum=0.9, weight_decay=0.0, eta=0.001,
                 exclude_bias_and_norm=False):
        super().__init__(params, dict(lr=lr, weight_decay=weight_decay, momentum=momentum,
                                      eta=eta, exclude=exclude_bias_and_norm))

    @torch.no_grad()
    def step(self):
        for g in self.param_groups:
            for p in g["params"]:
                dp = p.grad
                if dp is None:
                    continue
                dp = dp.add(p, alpha=g["weight_decay"])
                if not g["exclude"] or p.ndim != 1:
                    param_norm = torch.norm(p)
                    update_norm = torch.norm(dp)
                    one = torch.ones_like(param_norm)
                    q = torch.where(
                        param_norm > 0.0,
                        torch.where(update_norm > 0, (g["eta"] * param_norm / update_norm), one),
                        one)
                    dp = dp.mul(q)
                param_state = self.state[p]
                if "mu" not in param_state:
                    param_state["mu"] = torch.zeros_like(p)
                mu = param_state["mu"]
                mu.mul_(g["momentum"]).add_(dp)
                p.add_(mu, alpha=-g["lr"])
