#include <largo/precision/precision_policy.h>

#include <largo/core/config.h>
#include <largo/core/error.h>

#include <ATen/ATen.h>
#include <torch/version.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <charconv>
#include <cmath>
#include <vector>

namespace largo::precision {
namespace {

OptLevel parse_opt_level(const std::string& text) {
  if (text == "O0") {
    return OptLevel::kO0;
  }
  if (text == "O1") {
    return OptLevel::kO1;
  }
  if (text == "O2") {
    return OptLevel::kO2;
  }
  if (text == "O3") {
    return OptLevel::kO3;
  }
  throw OptionError(
      "PrecisionPolicyOptions::opt_level", text, "O0, O1, O2 or O3 (the letter O, as in Apex)");
}

std::optional<double> parse_number(const std::string& text) {
  double value = 0.0;
  const char* end = text.data() + text.size();
  auto [ptr, error] = std::from_chars(text.data(), end, value);
  if (error != std::errc() || ptr != end) {
    return std::nullopt;
  }
  return value;
}

const char* dtype_name(at::ScalarType dtype) {
  return dtype == at::kHalf ? "float16" : dtype == at::kBFloat16 ? "bfloat16" : "float32";
}

} // namespace

std::string to_string(OptLevel level) {
  switch (level) {
    case OptLevel::kO0:
      return "O0";
    case OptLevel::kO1:
      return "O1";
    case OptLevel::kO2:
      return "O2";
    case OptLevel::kO3:
      return "O3";
  }
  return "?";
}

std::string PrecisionPolicy::describe() const {
  if (!enabled) {
    return "float32 (mixed precision off)";
  }
  std::string text = fmt::format("{} {}", to_string(opt_level), dtype_name(low_precision));
  if (autocast) {
    text += ", autocast";
  }
  if (cast_model) {
    text += keep_batchnorm_fp32 ? ", model cast (BatchNorm float32)" : ", model cast";
  }
  if (master_weights) {
    text += ", float32 master weights";
  }
  switch (loss_scaling) {
    case LossScaling::kNone:
      text += ", no loss scaling";
      break;
    case LossScaling::kStatic:
      text += fmt::format(", static loss scale {}", static_loss_scale);
      break;
    case LossScaling::kDynamic:
      text += ", dynamic loss scale";
      break;
  }
  return text;
}

PrecisionPolicy resolve_precision_policy(const PrecisionPolicyOptions& options) {
  PrecisionPolicy policy;
  if (options.amp_type != "apex" && options.amp_type != "pytorch") {
    throw OptionError("PrecisionPolicyOptions::amp_type", options.amp_type, "apex or pytorch");
  }
  at::ScalarType low_precision = at::kFloat;
  if (options.dtype == "float16") {
    low_precision = at::kHalf;
  } else if (options.dtype == "bfloat16") {
    low_precision = at::kBFloat16;
  } else {
    throw OptionError("PrecisionPolicyOptions::dtype", options.dtype, "float16 or bfloat16");
  }
  // Validated even when AMP is off, so a typo does not wait for the day it is switched on.
  const OptLevel level = parse_opt_level(options.opt_level);
  std::optional<double> static_scale;
  bool dynamic_requested = false;
  if (options.loss_scale) {
    if (*options.loss_scale == "dynamic") {
      dynamic_requested = true;
    } else {
      static_scale = parse_number(*options.loss_scale);
      if (!static_scale || !(*static_scale > 0) || !std::isfinite(*static_scale) ||
          !std::isfinite(static_cast<float>(*static_scale))) {
        throw OptionError(
            "PrecisionPolicyOptions::loss_scale",
            *options.loss_scale,
            "\"dynamic\" or a number > 0 that float32 can hold");
      }
    }
  }
  if (!options.use_amp) {
    return policy;
  }

  policy.low_precision = low_precision;
  if (options.amp_type == "pytorch") {
    // torch.autocast + torch.cuda.amp.GradScaler; VISSL ignores AMP_ARGS in this mode.
    policy.enabled = true;
    policy.opt_level = OptLevel::kO1;
    policy.autocast = true;
    policy.loss_scaling = low_precision == at::kHalf ? LossScaling::kDynamic : LossScaling::kNone;
    return policy;
  }

  policy.opt_level = level;
  if (level == OptLevel::kO0) {
    return policy; // Apex O0: pure float32
  }
  policy.enabled = true;
  policy.autocast = level == OptLevel::kO1;
  policy.cast_model = level == OptLevel::kO2 || level == OptLevel::kO3;
  policy.keep_batchnorm_fp32 = level != OptLevel::kO3;
  policy.master_weights = level == OptLevel::kO2;
  // Apex's defaults: dynamic for O1/O2, a static 1.0 for O3. bfloat16 needs no scaling, so
  // its default is none; an explicit loss_scale is honoured for both dtypes.
  policy.loss_scaling = level == OptLevel::kO3 ? LossScaling::kStatic : LossScaling::kDynamic;
  if (low_precision == at::kBFloat16) {
    policy.loss_scaling = LossScaling::kNone;
  }
  // Apex's property overrides. They change nothing under O1 (the model stays float32).
  if (level == OptLevel::kO1 && (options.keep_batchnorm_fp32 || options.master_weights)) {
    spdlog::warn("Apex's keep_batchnorm_fp32 and master_weights have no effect with opt_level "
                 "O1, which keeps the model in float32");
  } else {
    if (options.keep_batchnorm_fp32) {
      policy.keep_batchnorm_fp32 = *options.keep_batchnorm_fp32;
    }
    if (options.master_weights) {
      // O3 + master_weights (VISSL's recommended O3 setting) is O2 with the O3 name.
      policy.master_weights = *options.master_weights;
    }
  }
  if (dynamic_requested) {
    policy.loss_scaling = LossScaling::kDynamic;
  } else if (static_scale) {
    policy.loss_scaling = LossScaling::kStatic;
    policy.static_loss_scale = *static_scale;
  }
  return policy;
}

void check_policy_supported_on(const PrecisionPolicy& policy, const c10::Device& device) {
  if (!policy.enabled) {
    return;
  }
  if (!device.is_cpu() && !device.is_cuda()) {
    throw ConfigError(fmt::format("mixed precision runs on the CPU or CUDA devices; got device {}",
                                  device.str()));
  }
}

} // namespace largo::precision
