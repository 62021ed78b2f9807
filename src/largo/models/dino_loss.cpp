#include <largo/models/dino_loss.h>

#include <largo/core/error.h>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>

namespace largo::models {
namespace {

bool positive_finite(double value) {
  return value > 0.0 && std::isfinite(value);
}

std::string dino_option(const char* field) {
  return fmt::format("DinoLossOptions::{}", field);
}

void check_dino_shapes(
    const at::Tensor& student, const at::Tensor& teacher, const DinoLossOptions& options) {
  const auto teacher_crops = static_cast<int64_t>(options.crops_for_teacher.size());
  const bool fits =
      student.dim() == 2 && teacher.dim() == 2 && student.size(1) == options.output_dim &&
      teacher.size(1) == options.output_dim && student.size(0) % options.num_crops == 0 &&
      teacher.size(0) % teacher_crops == 0 &&
      student.size(0) / options.num_crops == teacher.size(0) / teacher_crops;
  if (!fits) {
    throw Error(fmt::format(
        "dino_loss: student [{}] and teacher [{}] given; expected [{} crops x n, {}] and "
        "[{} crops x n, {}]",
        fmt::join(student.sizes(), ", "),
        fmt::join(teacher.sizes(), ", "),
        options.num_crops,
        options.output_dim,
        teacher_crops,
        options.output_dim));
  }
}

} // namespace

void validate_dino_loss_options(const DinoLossOptions& options) {
  const auto number = [](double value) { return fmt::format("{}", value); };
  require_option(
      positive_finite(options.student_temp),
      dino_option("student_temp"),
      number(options.student_temp),
      "a number > 0");
  require_option(
      positive_finite(options.teacher_temp_min),
      dino_option("teacher_temp_min"),
      number(options.teacher_temp_min),
      "a number > 0");
  require_option(
      positive_finite(options.teacher_temp_max),
      dino_option("teacher_temp_max"),
      number(options.teacher_temp_max),
      "a number > 0");
  require_option(
      options.teacher_temp_warmup_iters >= 0,
      dino_option("teacher_temp_warmup_iters"),
      std::to_string(options.teacher_temp_warmup_iters),
      "an integer >= 0");
  require_option(
      options.center_momentum >= 0.0 && options.center_momentum <= 1.0,
      dino_option("center_momentum"),
      number(options.center_momentum),
      "a number in [0, 1]");
  require_option(
      options.num_crops >= 2,
      dino_option("num_crops"),
      std::to_string(options.num_crops),
      "an integer >= 2");
  const auto teacher_crops = static_cast<int64_t>(options.crops_for_teacher.size());
  require_option(
      teacher_crops >= 1 && teacher_crops <= options.num_crops,
      dino_option("crops_for_teacher"),
      fmt::format("[{}]", fmt::join(options.crops_for_teacher, ", ")),
      fmt::format("1 to num_crops ({}) crop indices", options.num_crops));
  require_option(
      options.output_dim > 0,
      dino_option("output_dim"),
      std::to_string(options.output_dim),
      "an integer > 0");
}

namespace {

// The whole float32 linspace, as VISSL builds it: each value depends on the step count.
at::Tensor teacher_temperature_warmup(const DinoLossOptions& options) {
  return at::linspace(
      options.teacher_temp_min,
      options.teacher_temp_max,
      options.teacher_temp_warmup_iters,
      at::TensorOptions().dtype(at::kFloat));
}

double teacher_temperature_at(
    const at::Tensor& warmup, const DinoLossOptions& options, int64_t iteration) {
  if (iteration >= options.teacher_temp_warmup_iters) {
    return static_cast<float>(options.teacher_temp_max); // torch.ones(...) * max, in float32
  }
  return warmup.data_ptr<float>()[iteration];
}

} // namespace

double dino_teacher_temperature(const DinoLossOptions& options, int64_t iteration) {
  return teacher_temperature_at(teacher_temperature_warmup(options), options, iteration);
}

DinoLoss::DinoLoss(DinoLossOptions options) : options_(std::move(options)) {
  validate_dino_loss_options(options_);
  teacher_temperatures_ = teacher_temperature_warmup(options_);
  center_ = at::zeros({1, options_.output_dim}, at::kFloat);
}

at::Tensor DinoLoss::forward(
    const at::Tensor& student,
    const at::Tensor& teacher,
    int64_t iteration,
    comm::ProcessGroup& group) {
  check_dino_shapes(student, teacher, options_);
  if (center_.device() != teacher.device()) {
    center_ = center_.to(teacher.device());
  }
  const std::vector<at::Tensor> student_crops =
      (student / options_.student_temp).chunk(options_.num_crops);
  const double teacher_temp = teacher_temperature_at(teacher_temperatures_, options_, iteration);
  const std::vector<at::Tensor> targets =
      at::softmax((teacher.detach() - center_) / teacher_temp, -1)
          .chunk(static_cast<int64_t>(options_.crops_for_teacher.size()));
  std::vector<at::Tensor> log_probabilities; // the same values VISSL recomputes per (i, v)
  for (const at::Tensor& crop : student_crops) {
    log_probabilities.push_back(at::log_softmax(crop, -1));
  }
  at::Tensor total;
  int64_t terms = 0;
  for (size_t i = 0; i < targets.size(); ++i) {
    for (size_t v = 0; v < log_probabilities.size(); ++v) {
      if (v == i) {
        continue; // the student's crop the teacher saw
      }
      const at::Tensor term = at::sum(-targets[i] * log_probabilities[v], -1).mean();
      total = total.defined() ? total + term : term;
      ++terms;
    }
  }
  total = total / static_cast<double>(terms);
  update_center(teacher, group);
  return total;
}

// DINOLoss.update_center: the teacher's raw scores summed, all-reduced, divided by the global
// row count, then the EMA.
void DinoLoss::update_center(const at::Tensor& teacher, comm::ProcessGroup& group) {
  at::NoGradGuard no_grad;
  at::Tensor batch_center = at::sum(teacher.detach(), 0, /*keepdim=*/true);
  group.all_reduce(batch_center);
  batch_center = batch_center / static_cast<double>(teacher.size(0) * group.world_size());
  center_ = center_ * options_.center_momentum + batch_center * (1.0 - options_.center_momentum);
}

std::map<std::string, at::Tensor> DinoLoss::state_dict() const {
  return {{"center", center_}};
}

void DinoLoss::load_state_dict(const std::map<std::string, at::Tensor>& state) {
  const auto found = state.find("center");
  if (found == state.end() || found->second.sizes() != center_.sizes()) {
    throw CheckpointError(fmt::format(
        "dino_loss: the checkpoint's center must be [1, {}]{}",
        options_.output_dim,
        found == state.end()
            ? "; it has none"
            : fmt::format("; it is [{}]", fmt::join(found->second.sizes(), ", "))));
  }
  center_ = found->second.detach().to(center_.options()).clone();
}

} // namespace largo::models
