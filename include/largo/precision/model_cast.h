// Casting a model to a low precision for Apex O2/O3: every floating-point parameter and
// buffer becomes `dtype`, except in BatchNorm modules when keep_batchnorm_fp32 (their weight,
// bias and running statistics stay float32: the statistics are sums over the batch, which
// lose too much in 8 bits of mantissa). Integer buffers (num_batches_tracked) are untouched.
// Parameters keep their identity (set_data), so references held elsewhere stay valid.
#pragma once

#include <torch/nn/module.h>

#include <c10/core/ScalarType.h>

#include <functional>

namespace largo::precision {

// BatchNorm1d/2d/3d (the modules keep_batchnorm_fp32 keeps in float32).
bool is_batchnorm(const torch::nn::Module& module);

struct ModelCastOptions {
  at::ScalarType dtype = at::kBFloat16;
  bool keep_batchnorm_fp32 = true;
  // Which modules count as BatchNorm; empty means is_batchnorm(). Set it for norm modules
  // of your own (e.g. a synchronized BatchNorm).
  std::function<bool(const torch::nn::Module&)> is_batchnorm;
};

void cast_model(torch::nn::Module& model, const ModelCastOptions& options);

} // namespace largo::precision
