// Gradient clipping by global norm (MODEL.GRAD_CLIP), torch.nn.utils.clip_grad_norm_'s
// semantics, written so that sharded gradients contribute partial norms:
//   1. each rank computes its local partial over the gradients it holds: the sum of |g|^p
//      (sum of squares for p = 2) or, for p = inf, the largest |g|;
//   2. the PartialNormReducer (tensor_norms.h) completes it across ranks (SUM, or MAX for
//      inf); unsharded, none is needed;
//   3. total = partial^(1/p); when max_norm / (total + 1e-6) < 1, every gradient is
//      multiplied by that factor (as PyTorch; a non-finite total scales by 0 or NaN too).
// Order in a step: backward → loss scaler's unscale (the gradients must be unscaled) →
// clip_grad_norm → optimizer step (LARC included). Collective: the reducer's, once.
#pragma once

#include <largo/optim/tensor_norms.h>

#include <ATen/ATen.h>

#include <vector>

namespace largo::optim {

// Clips the gradients of `params` (parameters without a gradient are skipped) and returns
// the total norm before clipping. CPU float32/float64 gradients take one multi-threaded
// pass to measure and one to scale; others take ATen ops. Throws ConfigError naming
// MODEL.GRAD_CLIP.MAX_NORM / NORM_TYPE for max_norm <= 0 or norm_type <= 0.
double clip_grad_norm(
    const std::vector<at::Tensor>& params,
    double max_norm,
    double norm_type = 2.0,
    const PartialNormReducer& reducer = {});

// Step 1 alone: this rank's partial (sum of |g|^p, or max |g| for inf) over the gradients
// of `params`, a 1-element float64 tensor on their device.
at::Tensor local_grad_norm_partial(const std::vector<at::Tensor>& params, double norm_type);

} // namespace largo::optim
