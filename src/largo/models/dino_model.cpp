#include <largo/models/dino_model.h>

#include <largo/core/error.h>
#include <largo/models/dino_teacher_update.h>
#include <largo/models/momentum_copy.h>
#include <largo/models/multi_crop_model.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <utility>

namespace largo::models {
namespace {

constexpr char kWhat[] = "the DINO teacher";

// The head's output (a Sequential that may be empty) over `features`.
at::Tensor run_head(torch::nn::Sequential& head, const at::Tensor& features) {
  return head->is_empty() ? features : head->forward(features);
}

} // namespace

DinoModelImpl::DinoModelImpl(
    const TrunkHeadModel& student,
    TrunkHeadModel teacher,
    std::vector<std::vector<int64_t>> view_shapes,
    DinoModelOptions options)
    : trunk_(register_module("trunk", student->trunk())),
      head_(register_module("head", student->head())),
      teacher_(std::move(teacher)),
      view_shapes_(std::move(view_shapes)),
      options_(std::move(options)) {
  const auto num_crops = static_cast<int64_t>(view_shapes_.size());
  if (num_crops < 2) {
    throw ConfigError(fmt::format(
        "DINO takes at least 2 crops per image (2 global crops for the teacher, then local "
        "ones), got {}; use ImgPilToMultiCrop",
        num_crops));
  }
  const auto& teacher_crops = options_.crops_for_teacher;
  bool crops_ok = !teacher_crops.empty();
  for (int64_t crop : teacher_crops) {
    crops_ok = crops_ok && crop >= 0 && crop < num_crops &&
               view_shapes_[crop] == view_shapes_[teacher_crops.front()];
  }
  require_option(
      crops_ok,
      "DinoModelOptions::crops_for_teacher",
      fmt::format("[{}]", fmt::join(teacher_crops, ", ")),
      fmt::format("crop indices in [0, {}) of one size (the global crops)", num_crops));
  freeze_as_copy_of(
      *this,
      *teacher_,
      "the DINO teacher must have the student's parameters (build both with the same model "
      "options)");
}

at::Tensor DinoModelImpl::forward(const at::Tensor& packed) {
  const std::vector<at::Tensor> crops = unpack_views(packed, view_shapes_, "DINO model");
  place_teacher(packed.device());
  if (is_training() && !built_) {
    build_teacher();
  }
  const at::Tensor student = student_scores(crops);
  const at::Tensor teacher = teacher_scores(crops);
  return at::cat({student, teacher.to(student.scalar_type())}, 0);
}

// The teacher is no child module: moving the model (to the GPU) leaves it where it was. The
// input is where the student runs (checked by its first layer), so it says where to put the
// teacher without listing the student's parameters every forward.
void DinoModelImpl::place_teacher(const c10::Device& device) {
  if (teacher_device_ != device) {
    teacher_->to(device);
    teacher_device_ = device;
  }
}

// VISSL's DINOHook._build_momentum_network: the teacher loads the student's state dict.
void DinoModelImpl::build_teacher(const WholeParameters* whole) {
  at::NoGradGuard no_grad;
  const std::vector<at::Tensor> sources = momentum_copy_sources(*this, *teacher_, whole, kWhat);
  std::vector<at::Tensor> targets = teacher_->parameters();
  for (size_t i = 0; i < targets.size(); ++i) {
    targets[i].copy_(sources[i]);
  }
  const auto teacher_buffers = teacher_->named_buffers();
  for (const auto& item : named_buffers()) {
    if (const at::Tensor* buffer = teacher_buffers.find(item.key())) {
      buffer->copy_(item.value());
    }
  }
  built_ = true;
}

// Consecutive crops of one size run through the trunk together (MultiCropModel's grouping),
// the head once over every crop's features: crop-major rows.
at::Tensor DinoModelImpl::student_scores(const std::vector<at::Tensor>& crops) {
  std::vector<at::Tensor> features;
  size_t begin = 0;
  while (begin < crops.size()) {
    size_t end = begin + 1;
    while (end < crops.size() && view_shapes_[end] == view_shapes_[begin]) {
      ++end;
    }
    std::vector<at::Tensor> group(crops.begin() + begin, crops.begin() + end);
    features.push_back(trunk_->forward(at::cat(group, 0)));
    begin = end;
  }
  return run_head(head_, at::cat(features, 0));
}

at::Tensor DinoModelImpl::teacher_scores(const std::vector<at::Tensor>& crops) {
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> inputs;
  for (int64_t crop : options_.crops_for_teacher) {
    inputs.push_back(crops[crop]);
  }
  teacher_->train(is_training());
  return teacher_->forward(at::cat(inputs, 0)).detach();
}

void DinoModelImpl::update_teacher(double momentum, const WholeParameters* whole) {
  if (built_) {
    update_dino_teacher(*teacher_, momentum_copy_sources(*this, *teacher_, whole, kWhat), momentum);
  }
}

std::map<std::string, at::Tensor> DinoModelImpl::teacher_state_dict() const {
  std::map<std::string, at::Tensor> state = momentum_copy_state_dict(*teacher_, "teacher.");
  state.emplace("teacher_built", at::tensor({static_cast<int64_t>(built_)}, at::kLong));
  return state;
}

void DinoModelImpl::load_teacher_state_dict(const std::map<std::string, at::Tensor>& state) {
  load_momentum_copy_state_dict(*teacher_, state, "teacher.", "DINO teacher");
  built_ = load_momentum_copy_counter(state, "teacher_built", "DINO teacher") != 0;
}

void DinoModelImpl::swap_child(const std::string& name, const SwappedModule& replacement) {
  swap_sequential_member(*this, name, replacement, {{"trunk", &trunk_}, {"head", &head_}});
}

} // namespace largo::models
