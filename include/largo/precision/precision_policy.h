// What a mixed-precision run does, resolved from MODEL.AMP_PARAMS: Apex's opt levels
// (O0-O3, with keep_batchnorm_fp32 / master_weights / loss_scale overrides) or PyTorch's
// autocast + GradScaler, in float16 or bfloat16.
//
//   level  model weights          per-op autocast  BatchNorm                 fp32 masters  loss scale
//   O0     fp32                   no               fp32                      no            none (1.0)
//   O1     fp32                   yes              fp32                      no            dynamic
//   O2     low precision          no               fp32 (keep_batchnorm_fp32) yes           dynamic
//   O3     low precision          no               low unless keep_..._fp32  no            static 1.0
//   (AMP_ARGS keep_batchnorm_fp32, master_weights and loss_scale override the level's column)
//   pytorch (AMP_TYPE): O1's behaviour (autocast + a dynamic GradScaler); AMP_ARGS ignored.
// bfloat16 has float32's exponent range, so a bfloat16 run gets no loss scaling unless
// loss_scale is given explicitly. With O2/O3 the inputs are cast to the low precision before
// the model and the model's output is cast back to float32 (as Apex does), so the loss is
// computed in float32.
//
// The policy is pure data plus validation; precision/mixed_precision.h applies it.
#pragma once

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <optional>
#include <string>

namespace largo::precision {

enum class OptLevel { kO0, kO1, kO2, kO3 };

// "O0" ... "O3".
std::string to_string(OptLevel level);

enum class LossScaling {
  kNone,    // no scaling: fp32 and bf16 runs (gradients are still checked for inf/NaN)
  kStatic,  // a fixed scale (Apex loss_scale: <number>)
  kDynamic, // PyTorch GradScaler / Apex "dynamic"
};

// The options as the config gives them (MODEL.AMP_PARAMS). Unset optionals take the opt
// level's defaults.
struct PrecisionPolicyOptions {
  bool use_amp = false;        // MODEL.AMP_PARAMS.USE_AMP
  std::string amp_type = "apex"; // MODEL.AMP_PARAMS.AMP_TYPE: apex | pytorch
  std::string opt_level = "O1";  // AMP_ARGS.opt_level: O0 | O1 | O2 | O3 (apex only)
  std::optional<bool> keep_batchnorm_fp32; // AMP_ARGS.keep_batchnorm_fp32 (apex, O2/O3)
  std::optional<bool> master_weights;      // AMP_ARGS.master_weights (apex, O2/O3)
  // AMP_ARGS.loss_scale: "dynamic" or a number as text ("128.0"); unset = the level's.
  std::optional<std::string> loss_scale;
  std::string dtype = "float16"; // MODEL.AMP_PARAMS.DTYPE (Largo extension): float16 | bfloat16
};

struct PrecisionPolicy {
  bool enabled = false;            // false: plain fp32 (USE_AMP off, or O0)
  OptLevel opt_level = OptLevel::kO0;
  at::ScalarType low_precision = at::kFloat; // kHalf or kBFloat16 when enabled
  bool autocast = false;           // run the forward under autocast (O1, pytorch)
  bool cast_model = false;         // cast the model's parameters and buffers (O2, O3)
  bool keep_batchnorm_fp32 = true; // with cast_model: BatchNorm stays float32
  bool master_weights = false;     // fp32 master copies that the optimizer updates (O2)
  LossScaling loss_scaling = LossScaling::kNone;
  double static_loss_scale = 1.0;  // for LossScaling::kStatic

  // The dtype the model's floating-point parameters have once the policy is applied.
  at::ScalarType model_dtype() const {
    return cast_model ? low_precision : at::kFloat;
  }
  // "O2 bfloat16, master weights, dynamic loss scale" for logs.
  std::string describe() const;
};

// Resolves and validates the options. Throws ConfigError naming the key and the value:
// an unknown AMP_TYPE, opt_level or DTYPE, or a loss_scale that is neither "dynamic" nor a
// number > 0. keep_batchnorm_fp32 / master_weights override O2's and O3's defaults (O3 with
// both and a dynamic loss scale, VISSL's recommended O3 setting, behaves as O2); with O1 they
// change nothing and a warning says so.
PrecisionPolicy resolve_precision_policy(const PrecisionPolicyOptions& options);

// Throws ConfigError when `device` cannot run `policy`: a device kind other than CPU or CUDA.
// (Both dtypes run on both: libtorch 2.11 has float16 CPU kernels and CPU autocast for
// float16, which 1.13 lacked.)
void check_policy_supported_on(const PrecisionPolicy& policy, const c10::Device& device);

} // namespace largo::precision
