// Loss scaling for float16 training: PyTorch's GradScaler semantics, with DeepSpeed's
// optional hysteresis and minimum scale, Apex's optional maximum, or a static scale.
//
// One step, in this order (checked; a call out of order throws largo::Error):
//   loss' = scaler.scale(loss); loss'.backward();
//   scaler.unscale_(grads);        // grads *= 1/scale (computed in fp64, applied in fp32)
//                                  // and found_inf = any inf/NaN among them
//   clip / LARC on the unscaled grads;
//   scaler.step([&] { optimizer.step(); });  // skipped when found_inf
//   scaler.update();               // adjusts the scale for the next step
//
// unscale_ takes the gradient tensors explicitly, so a sharded optimizer passes only its
// shard's gradients. Collective: when `found_inf_reducer` is set, unscale_ calls it (an
// all-reduce with max over every rank) so all ranks see the same found_inf and skip together;
// every rank must then call unscale_ once per step, in the same order as its other
// collectives. No other call communicates.
//
// update() rule (dynamic scaling). With the defaults (hysteresis 1, no min/max) it is
// PyTorch's:
//   found_inf:  growth_tracker = 0;
//               if hysteresis_left > 1: hysteresis_left -= 1   (scale kept: DeepSpeed)
//               else: scale *= backoff_factor, clamped to min_loss_scale; if the scale was
//                     already at min_loss_scale, throw TrainingError (no endless skipping)
//   clean:      growth_tracker += 1 (consecutive_hysteresis: hysteresis_left = hysteresis);
//               at growth_interval: scale = min(scale * growth_factor, max_loss_scale) unless
//               that is not finite in float32; growth_tracker = 0; hysteresis_left = hysteresis
// The scale is held as a float32 value, as PyTorch holds it in a float32 tensor; products
// are formed in double and rounded to float32, as PyTorch's update kernel does. A scale that
// reaches 0 (possible only without a minimum) also throws TrainingError.
#pragma once

#include <largo/comm/process_group.h>

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>

#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <vector>

namespace largo::precision {

// Reduces `found_inf` (a float32 tensor of one element, 0 or 1, on the gradients' device)
// with max over all ranks, in place. Unset: a single process.
using FoundInfReducer = std::function<void(at::Tensor& found_inf)>;

// The reducer for a process group: an all-reduce with max over its ranks (a collective).
FoundInfReducer found_inf_all_reduce(std::shared_ptr<comm::ProcessGroup> group);

struct GradScalerOptions {
  bool enabled = true;     // false: every call is a pass-through (scale 1, never skips)
  bool dynamic = true;     // false: a static scale of init_scale that update() never changes
  double init_scale = 65536.0; // 2^16
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000; // clean steps before the scale grows
  // DeepSpeed: overflows tolerated before the scale backs off (1: back off on every overflow,
  // PyTorch). The count resets when the scale grows, or after every clean step with
  // consecutive_hysteresis.
  int64_t hysteresis = 1;
  bool consecutive_hysteresis = false;
  // The scale never backs off below this; an overflow at this scale throws TrainingError.
  // 0: no minimum (PyTorch).
  double min_loss_scale = 0.0;
  // The scale never grows above this (Apex: 2^24). Infinity: no maximum (PyTorch).
  double max_loss_scale = std::numeric_limits<double>::infinity();
  FoundInfReducer found_inf_reducer;
};

// found_inf over `grads` (undefined tensors are skipped): a float32 tensor [1] on the first
// defined gradient's device (CPU when there is none), 1 when any element is inf or NaN.
// On CUDA one fused kernel checks every gradient. Not collective; reduce it yourself when
// ranks hold different gradients.
at::Tensor non_finite_flag(const std::vector<at::Tensor>& grads);

class GradScaler {
 public:
  // Throws OptionError naming the option (GradScalerOptions::growth_factor, ...) for an
  // init_scale that is not a finite number > 0, growth_factor <= 1, backoff_factor outside
  // (0, 1), growth_interval or hysteresis < 1, or min_loss_scale > init_scale > max_loss_scale.
  explicit GradScaler(GradScalerOptions options = {});

  // loss * scale (in float32, or the loss's dtype if wider); the loss itself when disabled.
  at::Tensor scale(const at::Tensor& loss) const;

  // Divides every gradient in place by the scale and records whether any is inf/NaN
  // (checked before dividing, as PyTorch does). Once per step, before clipping. Collective
  // when a found_inf_reducer is set. found_inf_elsewhere counts as an inf gradient (e.g. a
  // non-finite loss seen on this rank), so that it, too, is agreed on by every rank.
  void unscale_(const std::vector<at::Tensor>& grads, bool found_inf_elsewhere = false);

  // Runs optimizer_step unless unscale_ found an inf/NaN; returns whether it ran.
  // Requires unscale_ this step. Reads found_inf to the host (one device sync).
  bool step(const std::function<void()>& optimizer_step);

  // Adjusts the scale from this step's found_inf (see the rule above) and starts the next
  // step. Throws TrainingError when the scale cannot back off any further.
  void update();

  // Whether this step's unscale_ found an inf/NaN (false before unscale_).
  bool found_inf() const;

  double get_scale() const {
    return options_.enabled ? static_cast<double>(scale_) : 1.0;
  }
  int64_t growth_tracker() const {
    return growth_tracker_;
  }
  int64_t hysteresis_left() const {
    return hysteresis_left_;
  }
  bool is_enabled() const {
    return options_.enabled;
  }
  const GradScalerOptions& options() const {
    return options_;
  }

  // {"scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker"} as in
  // PyTorch, plus "hysteresis", "hysteresis_left", "min_loss_scale", "max_loss_scale",
  // "dynamic". Empty dict when disabled (as PyTorch).
  c10::IValue state_dict() const;
  // Restores the scale, growth tracker and hysteresis count bit-exactly. The configured
  // factors, interval and limits are kept (a differing saved value is logged as a warning).
  // Throws CheckpointError for a malformed dict. An empty dict leaves the scaler as it is.
  void load_state_dict(const c10::IValue& state);

 private:
  enum class Stage { kReady, kUnscaled, kStepped };

  GradScalerOptions options_;
  float scale_;
  int64_t growth_tracker_ = 0;
  int64_t hysteresis_left_;
  Stage stage_ = Stage::kReady;
  at::Tensor found_inf_; // this step's flag, [1] float32; undefined before unscale_
  bool found_inf_host_ = false;
};

} // namespace largo::precision
