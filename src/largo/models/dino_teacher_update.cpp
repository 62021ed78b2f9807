#include <largo/models/dino_teacher_update.h>

#include <largo/core/error.h>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

namespace largo::models {
namespace {

void check_teacher_matches(
    const std::vector<at::Tensor>& teacher, const std::vector<at::Tensor>& student) {
  if (teacher.size() != student.size()) {
    throw Error(fmt::format(
        "update_dino_teacher: the teacher has {} parameters, the student {}; build the teacher "
        "as a copy of the student",
        teacher.size(),
        student.size()));
  }
  for (size_t i = 0; i < teacher.size(); ++i) {
    if (!teacher[i].sizes().equals(student[i].sizes()) ||
        teacher[i].dtype() != student[i].dtype() || teacher[i].device() != student[i].device()) {
      throw Error(fmt::format(
          "update_dino_teacher: parameter {} is [{}] in the teacher and [{}] in the student (or "
          "differs in dtype or device)",
          i,
          fmt::join(teacher[i].sizes(), ", "),
          fmt::join(student[i].sizes(), ", ")));
    }
  }
}

} // namespace

void update_dino_teacher(
    torch::nn::Module& teacher, const torch::nn::Module& student, double momentum) {
  update_dino_teacher(teacher, student.parameters(), momentum);
}

void update_dino_teacher(
    torch::nn::Module& teacher, const std::vector<at::Tensor>& sources, double momentum) {
  require_option(
      momentum >= 0.0 && momentum <= 1.0,
      "update_dino_teacher(momentum)",
      fmt::format("{}", momentum),
      "a number in [0, 1]");
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> targets = teacher.parameters();
  check_teacher_matches(targets, sources);
  if (targets.empty()) {
    return;
  }
  // VISSL: param_k.data.mul_(m).add_((1 - m) * param_q): the product rounded on its own, then
  // the sum (not one fused multiply-add), so the same two roundings per element.
  at::_foreach_mul_(targets, momentum);
  at::_foreach_add_(targets, at::_foreach_mul(sources, 1.0 - momentum));
}

} // namespace largo::models
