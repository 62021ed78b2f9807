// Tensor parallelism through parallelize() (parallelize.h, step 0), composed on 4 Gloo ranks
// with another dimension:
//   - with DDP, as torchtitan's 2-D parallelism: tensor-parallel pairs (TP 2) times two
//     data-parallel replicas (DP 2), world rank = dp_index * 2 + tp_index, on the mesh
//     make_device_mesh builds (pp(1) * dp(2) * tp(2));
//   - with a pipeline: two stages (PP 2), each split over a tensor-parallel pair, on the mesh
//     pp(2) * dp(1) * tp(2), world rank = pp_index * 2 + tp_index; each pair's ranks exchange
//     activations with the other stage's rank of the same shard.
// Each rank also runs the unsharded model in one process on the global batch (parallelize()
// over ProcessGroup::single_process()), built from the same seed, and the 2-D run must train
// like it: losses, gradient norms (clip_grad_norm() is the unsharded norm) and weights. Its
// state is the unsharded model's (names and shapes), so a checkpoint of the 2-D run resumes
// in one process and in a fresh 2-D run, and a one-process checkpoint resumes in a 2-D run.
//
// Both run in float64 and differ only in the order of additions (the row-parallel layers'
// partial products, DDP's average of two half-batch means or the pipeline's weighted
// micro-batch means against one mean over the global batch); the bounds are the ones
// tensor_parallel_test_util.h derives, see kRelativeTolerance.
#include <largo/core/error.h>
#include <largo/models/mlp.h>
#include <largo/models/trunk_head_model.h>
#include <largo/models/vit.h>
#include <largo/optim/adamw.h>
#include <largo/optim/lamb.h>
#include <largo/optim/larc.h>
#include <largo/optim/sgd.h>
#include <largo/parallel/mesh/device_mesh.h>
#include <largo/parallel/parallelize.h>
#include <largo/parallel/tensor_parallel/tensor_parallel.h>
#include <largo/parallel/tensor_parallel/tensor_parallel_plan.h>

#include "comm/distributed_test_util.h"
#include "parallel/parallelize_test_util.h"
#include "parallel/tensor_parallel_test_util.h"

#include <fmt/format.h>
#include <torch/csrc/jit/serialization/pickle.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>

namespace largo::parallel::tensor_parallel_composition_test {
namespace {

using largo::testing::run_on_ranks;
using testing::adamw_noise_bound;
using testing::borrow;
using testing::expect_close;
using testing::gradient_noise;
using testing::groups_of;
using testing::kRelativeTolerance;
using testing::small_vit_options;
using testing::with_linear_head;

constexpr int kTensorParallelSize = 2;
constexpr int kDataParallelSize = 2;
constexpr int kSaveStep = 8;    // the checkpoint is taken after this many steps
constexpr int kResumeSteps = 4; // and every run continues for this many
constexpr int kSteps = kSaveStep + kResumeSteps;
constexpr int64_t kGlobalBatch = 8; // each replica reads half of it
constexpr int64_t kClasses = 5;
constexpr double kLearningRate = 1e-2;
// The bounds against the unsharded model: tensor_parallel_test_util.h derives them.

void expect_near_value(double actual, double expected, const std::string& what) {
  EXPECT_LE(std::abs(actual - expected), kRelativeTolerance * std::abs(expected))
      << what << ": " << actual << ", unsharded " << expected;
}

// Three Linear blocks (a column/row pair and a replicated third) and a replicated head.
models::TrunkHeadModel make_mlp() {
  torch::manual_seed(21);
  models::MlpOptions options;
  options.hidden_dims = {32, 24, 16};
  auto model = with_linear_head(models::build_mlp_trunk(options, /*in_channels=*/1, 4), kClasses);
  model->to(at::kDouble);
  return model;
}

// Two encoder layers of 4 heads (2 per tensor-parallel rank), dropout 0 (the default).
models::TrunkHeadModel make_vit() {
  torch::manual_seed(22);
  auto model = with_linear_head(models::build_vit_trunk(small_vit_options(), 3, 16), kClasses);
  model->to(at::kDouble);
  return model;
}

OptimizerFactory adamw() {
  return [](std::vector<optim::ParamGroup> groups) {
    return std::make_unique<optim::AdamW>(std::move(groups));
  };
}

// Optimizers with per-parameter norms, whose norms must be the unsharded parameters':
// LARC's trust ratio (||w|| / ||g||; not clipped, so that every ratio scales its update) and
// LAMB's (||w|| / ||update||).
OptimizerFactory larc_sgd() {
  return [](std::vector<optim::ParamGroup> groups) {
    optim::SGDOptions sgd;
    sgd.momentum = 0.9;
    optim::LARCOptions larc;
    larc.trust_coefficient = 0.02;
    return std::make_unique<optim::LARC>(
        std::make_unique<optim::SGD>(std::move(groups), sgd), larc);
  };
}

OptimizerFactory lamb() {
  return [](std::vector<optim::ParamGroup> groups) {
    return std::make_unique<optim::LAMB>(std::move(groups));
  };
}

struct Case {
  std::function<models::TrunkHeadModel()> make;
  std::vector<int64_t> image_shape;
  OptimizerFactory optimizer = adamw();
};

// The layouts of the file's top on the library's mesh, built once per test so that its runs
// share the groups: TP x DP, pp(1) * dp(2) * tp(2) (the tensor-parallel pairs {0, 1}, {2, 3},
// the data-parallel pairs {0, 2}, {1, 3}), or TP x PP, pp(2) * dp(world / 4) * tp(2).
struct Mesh {
  comm::ProcessGroup* world = nullptr;
  std::shared_ptr<DeviceMesh> layout;
  bool pipeline = false;
  PipelineParallelOptions stages; // with a pipeline
  DataParallelism data_parallelism = DataParallelism::kDdp; // over the "dp" group
  bool sequence_parallel = false;                           // in the ViT's layers
};

// The options of a run on `mesh`: its sizes and modes.
ParallelOptions options_on(const Mesh& mesh) {
  ParallelOptions options;
  options.tensor_parallel_size = kTensorParallelSize;
  if (mesh.pipeline) {
    options.pipeline.size = 2;
    options.pipeline.stages = mesh.stages;
  }
  options.data_parallelism = mesh.data_parallelism;
  options.sequence_parallel = mesh.sequence_parallel;
  return options;
}

Mesh make_pipeline_mesh(comm::ProcessGroup& world, PipelineParallelOptions stages = {}) {
  Mesh mesh;
  mesh.world = &world;
  mesh.pipeline = true;
  mesh.stages = std::move(stages);
  mesh.layout = make_device_mesh(borrow(world), options_on(mesh));
  return mesh;
}

Mesh make_mesh(comm::ProcessGroup& world) {
  Mesh mesh;
  mesh.world = &world;
  mesh.layout = make_device_mesh(borrow(world), options_on(mesh));
  return mesh;
}

// The unsharded model in one process (mesh null), or this rank's part of the 2-D run.
std::unique_ptr<ParallelModel> make_run(const Case& c, const Mesh* mesh) {
  models::TrunkHeadModel model = c.make();
  const ParallelOptions options = mesh != nullptr ? options_on(*mesh) : ParallelOptions{};
  if (mesh != nullptr) {
    apply_tensor_parallel_plan(*model, *mesh->layout, options); // step 0: before the groups
  }
  auto param_groups = groups_of(*model);
  param_groups[0].lr = kLearningRate;
  param_groups[0].weight_decay = 0.05;
  if (mesh == nullptr) {
    return parallelize(
        model, std::move(param_groups), c.optimizer, comm::ProcessGroup::single_process(), options);
  }
  return parallelize(model, std::move(param_groups), c.optimizer, mesh->layout, options);
}

// Step `step`'s global batch, the same on every rank.
std::pair<at::Tensor, at::Tensor> global_batch(int step, const std::vector<int64_t>& image_shape) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(700 + step);
  std::vector<int64_t> shape{kGlobalBatch};
  shape.insert(shape.end(), image_shape.begin(), image_shape.end());
  at::Tensor images = at::randn(shape, generator, at::kDouble);
  at::Tensor labels = at::randint(0, kClasses, {kGlobalBatch}, generator);
  return {images, labels};
}

struct StepResult {
  double loss = 0.0; // the global batch's mean
  double grad_norm = 0.0;
};

// One clipped AdamW step; a 2-D run's replica reads its half of the batch (both ranks of a
// tensor-parallel pair the same half; a pipeline's one replica all of it).
StepResult train_step(ParallelModel& run, int step, const Case& c, double max_norm) {
  auto [images, labels] = global_batch(step, c.image_shape);
  comm::ProcessGroup& data_parallel = run.data_parallel_group();
  const int64_t rows = kGlobalBatch / data_parallel.world_size();
  images = images.narrow(0, data_parallel.rank() * rows, rows);
  labels = labels.narrow(0, data_parallel.rank() * rows, rows);
  run.zero_grad();
  const double loss =
      run.forward_backward(images, labels, [](const at::Tensor& output, const at::Tensor& target) {
        return torch::nn::functional::cross_entropy(output, target);
      });
  EXPECT_TRUE(run.finish_backward());
  StepResult result;
  result.grad_norm = run.clip_grad_norm(max_norm);
  run.step();
  at::Tensor mean = at::tensor({loss}, at::kDouble);
  data_parallel.all_reduce(mean);
  result.loss = mean.item<double>() / data_parallel.world_size();
  return result;
}

// The first step's gradient norm of the unsharded model, to clip at half of it (so that
// clipping acts).
double first_grad_norm(const Case& c) {
  auto probe = make_run(c, nullptr);
  return train_step(*probe, 0, c, std::numeric_limits<double>::max()).grad_norm;
}

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

std::unordered_map<std::string, at::Tensor> as_map(const NamedTensors& named) {
  return {named.begin(), named.end()};
}

void expect_states_close(
    const NamedTensors& actual,
    const NamedTensors& expected,
    const std::string& what,
    double absolute_slack) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  for (size_t i = 0; i < actual.size(); ++i) {
    ASSERT_EQ(actual[i].first, expected[i].first) << what << ": the names' order";
    expect_close(
        actual[i].second, expected[i].second, what + " " + actual[i].first, absolute_slack);
  }
}

void expect_states_equal(
    const NamedTensors& actual, const NamedTensors& expected, const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  for (size_t i = 0; i < actual.size(); ++i) {
    ASSERT_EQ(actual[i].first, expected[i].first) << what << ": the names' order";
    EXPECT_TRUE(at::equal(actual[i].second, expected[i].second))
        << what << ": " << actual[i].first << " differs";
  }
}

// Optimizer state as name -> key -> tensor (AdamW: step, exp_avg, exp_avg_sq).
std::map<std::string, std::map<std::string, at::Tensor>>
optimizer_tensors(const c10::IValue& state_dict) {
  std::map<std::string, std::map<std::string, at::Tensor>> tensors;
  for (const auto& entry : state_dict.toGenericDict().at("state").toGenericDict()) {
    for (const auto& item : entry.value().toGenericDict()) {
      tensors[entry.key().toStringRef()][item.key().toStringRef()] = item.value().toTensor();
    }
  }
  return tensors;
}

// Bitwise when absolute_slack < 0; else within the relative bound plus the slack, per key.
void expect_optimizer_states(
    const c10::IValue& actual,
    const c10::IValue& expected,
    const std::string& what,
    double max_norm,
    bool bitwise) {
  const auto left = optimizer_tensors(actual);
  const auto right = optimizer_tensors(expected);
  ASSERT_EQ(left.size(), right.size()) << what;
  for (const auto& [name, entries] : right) {
    ASSERT_EQ(left.count(name), 1u) << what << ": no state for " << name;
    for (const auto& [key, tensor] : entries) {
      const at::Tensor& other = left.at(name).at(key);
      const std::string where = fmt::format("{} {}.{}", what, name, key);
      if (bitwise) {
        EXPECT_TRUE(at::equal(other, tensor)) << where << " differs";
      } else if (key == "step") {
        EXPECT_TRUE(at::equal(other, tensor)) << where;
      } else {
        // exp_avg: a weighted mean (weights summing to < 1) of gradients, so where the
        // gradient is rounding noise (the key bias) each side is within gradient_noise of
        // 0 and they differ by up to twice that; exp_avg_sq: of squares, each side in
        // [0, noise^2]. Elsewhere 2x the relative bound (the square doubles it).
        const double noise = gradient_noise(max_norm);
        const double slack = key == "exp_avg_sq" ? noise * noise : 2.0 * noise;
        ASSERT_EQ(other.sizes(), tensor.sizes()) << where;
        const double scale = tensor.abs().max().item<double>();
        const double error = (other - tensor).abs().max().item<double>();
        EXPECT_LE(error, 2 * kRelativeTolerance * scale + slack)
            << where << ": max |difference| " << error << " at max |value| " << scale;
      }
    }
  }
}

// What torch.save / torch.load make of a state: pickled and read back.
c10::IValue through_pickle(const c10::IValue& value) {
  return torch::pickle_load(torch::pickle_save(value));
}

c10::IValue as_dict(const NamedTensors& state) {
  c10::impl::GenericDict dict(c10::StringType::get(), c10::AnyType::get());
  for (const auto& [name, tensor] : state) {
    dict.insert(name, tensor);
  }
  return dict;
}

NamedTensors as_named(const c10::IValue& dict) {
  NamedTensors named;
  for (const auto& item : dict.toGenericDict()) {
    named.emplace_back(item.key().toStringRef(), item.value().toTensor());
  }
  return named;
}

NamedTensors through_pickle(const NamedTensors& state) {
  return as_named(through_pickle(as_dict(state)));
}

// World rank 0's `value` on every rank, as a checkpoint file that every rank reads: a
// pipeline gives the whole state on its first stage only. Collective (two broadcasts).
c10::IValue from_rank_zero(comm::ProcessGroup& world, const c10::IValue& value) {
  std::vector<char> bytes;
  if (world.rank() == 0) {
    bytes = torch::pickle_save(value);
  }
  at::Tensor size = at::tensor({static_cast<int64_t>(bytes.size())}, at::kLong);
  world.broadcast(size, 0);
  at::Tensor data = at::empty({size.item<int64_t>()}, at::kByte);
  if (world.rank() == 0) {
    std::memcpy(data.data_ptr(), bytes.data(), bytes.size());
  }
  world.broadcast(data, 0);
  bytes.assign(
      static_cast<const char*>(data.data_ptr()),
      static_cast<const char*>(data.data_ptr()) + data.numel());
  return torch::pickle_load(bytes);
}

// The state checks apply where the run gives a state: every rank of TP x DP, the first
// stage's ranks of a pipeline, the first replica's ranks of FSDP (the others get none).
bool gives_state(const ParallelModel& run, const Mesh& mesh) {
  const bool first_replica = run.data_parallel_group().rank() == 0;
  return (run.pipeline() == nullptr || run.pipeline()->pipeline_rank() == 0) &&
         (mesh.data_parallelism != DataParallelism::kFsdp || first_replica);
}

// ZeRO and FSDP consolidate the optimizer state on the first replica (the others get none).
bool gives_optimizer_state(const ParallelModel& run, const Mesh& mesh) {
  return gives_state(run, mesh) &&
         (mesh.data_parallelism == DataParallelism::kDdp || run.data_parallel_group().rank() == 0);
}

// Each dimension's strategy states its placements: the split layers Shard over "tp" (value
// and optimizer state), ZeRO's and FSDP's optimizer state FlatShard over "dp" (FSDP's values
// too), a pipeline rank's parameters OwnedBy it over "pp".
void expect_placements(const ParallelModel& run, const Mesh& mesh) {
  const StatePlacements placements = run.placements();
  auto kind_over = [](const Placements& placements, const std::string& dimension) {
    auto found = placements.find(dimension);
    return found == placements.end() ? Placement::Kind::kReplicate : found->second.kind;
  };
  const bool zero = mesh.data_parallelism != DataParallelism::kDdp;
  const bool fsdp = mesh.data_parallelism == DataParallelism::kFsdp;
  int split = 0;
  for (const ParameterPlacement& parameter : placements.parameters()) {
    if (kind_over(parameter.value, "tp") == Placement::Kind::kShard) {
      ++split;
      EXPECT_EQ(parameter.optimizer_state.at("tp"), parameter.value.at("tp")) << parameter.name;
    }
    EXPECT_EQ(kind_over(parameter.optimizer_state, "dp") == Placement::Kind::kFlatShard, zero)
        << parameter.name;
    EXPECT_EQ(kind_over(parameter.value, "dp") == Placement::Kind::kFlatShard, fsdp)
        << parameter.name;
    if (mesh.pipeline) {
      EXPECT_EQ(parameter.value.at("pp"), Placement::owned_by(run.pipeline()->pipeline_rank()))
          << parameter.name;
    }
  }
  if (!mesh.pipeline) { // a stage may hold only replicated layers (the head)
    EXPECT_GT(split, 0) << placements.describe();
  }
  EXPECT_FALSE(placements.module_holds_whole_model());
  EXPECT_EQ(placements.module_holds_gathered_copies(), fsdp);
  EXPECT_EQ(placements.cover_whole_model(), !mesh.pipeline);
}

void expect_two_dimensional_run_like_one_process(const Case& c, const Mesh& mesh) {
  comm::ProcessGroup& world = *mesh.world;
  const double max_norm = 0.5 * first_grad_norm(c);

  auto reference = make_run(c, nullptr);
  auto two_d = make_run(c, &mesh);
  const std::string described = two_d->describe();
  EXPECT_NE(described.find("tensor parallel over 2 ranks"), std::string::npos) << described;
  EXPECT_EQ(described.find(", sequence parallel") != std::string::npos, mesh.sequence_parallel)
      << described; // the pipeline cuts below put encoder layers on every stage
  const char* data_parallel =
      mesh.pipeline ? "pipeline: world "
      : mesh.data_parallelism == DataParallelism::kZero1
          ? "ZeRO stage 1: optimizer state sharded over 2 rank(s)"
      : mesh.data_parallelism == DataParallelism::kZero2
          ? "ZeRO stage 2: optimizer state and gradients sharded over 2 rank(s)"
      : mesh.data_parallelism == DataParallelism::kFsdp
          ? "ZeRO stage 3 (FSDP): parameters, gradients and optimizer state sharded over 2 rank(s)"
          : "DDP over 2 ranks";
  EXPECT_NE(described.find(data_parallel), std::string::npos) << described;
  if (mesh.pipeline && mesh.data_parallelism == DataParallelism::kZero1) {
    EXPECT_NE(described.find("pp(2) * dp(2) * tp(2)"), std::string::npos) << described;
    EXPECT_NE(described.find("ZeRO-1 over each stage's replicas"), std::string::npos) << described;
  }
  expect_placements(*two_d, mesh);
  const bool holds_state = gives_state(*two_d, mesh);
  // Before training: the full state is the unsharded model's, bit for bit (a gather of
  // slices), with its names in its order.
  const NamedTensors initial = two_d->model_state_dict();
  if (holds_state) {
    expect_states_equal(initial, reference->model_state_dict(), "initial state");
  }

  for (int step = 0; step < kSaveStep; ++step) {
    const StepResult sharded = train_step(*two_d, step, c, max_norm);
    const StepResult unsharded = train_step(*reference, step, c, max_norm);
    expect_near_value(sharded.loss, unsharded.loss, fmt::format("loss {}", step));
    expect_near_value(sharded.grad_norm, unsharded.grad_norm, fmt::format("grad norm {}", step));
    if (step == 0) {
      EXPECT_GT(unsharded.grad_norm, max_norm) << "clipping should act";
    }
  }
  // The checkpoint, as torch.save writes and torch.load reads it, world rank 0's on every
  // rank.
  const c10::IValue model_dict = as_dict(two_d->model_state_dict());
  const c10::IValue optimizer_dict = two_d->optimizer_state_dict();
  const NamedTensors saved_model = as_named(from_rank_zero(world, model_dict));
  const c10::IValue saved_optimizer = from_rank_zero(world, optimizer_dict);
  const NamedTensors reference_model = through_pickle(reference->model_state_dict());
  const c10::IValue reference_optimizer = through_pickle(reference->optimizer_state_dict());
  const double weight_slack = adamw_noise_bound(max_norm, kSaveStep, kLearningRate);
  expect_states_close(saved_model, reference_model, "2-D state after training", weight_slack);
  expect_optimizer_states(
      saved_optimizer,
      reference_optimizer,
      "2-D optimizer state",
      max_norm,
      /*bitwise=*/false);

  // Uninterrupted: both go on.
  std::vector<StepResult> two_d_losses, reference_losses;
  for (int step = kSaveStep; step < kSteps; ++step) {
    two_d_losses.push_back(train_step(*two_d, step, c, max_norm));
    reference_losses.push_back(train_step(*reference, step, c, max_norm));
  }
  const NamedTensors two_d_final =
      as_named(from_rank_zero(world, as_dict(two_d->model_state_dict())));
  const NamedTensors reference_final = reference->model_state_dict();
  const double final_slack = adamw_noise_bound(max_norm, kSteps, kLearningRate);
  expect_states_close(two_d_final, reference_final, "2-D state at the end", final_slack);

  // The 2-D checkpoint into a fresh 2-D run: the same state back, and bit for bit the same
  // steps as the uninterrupted run.
  {
    auto resumed = make_run(c, &mesh);
    resumed->load_model_state_dict(as_map(saved_model));
    resumed->load_optimizer_state_dict(saved_optimizer);
    const NamedTensors loaded = resumed->model_state_dict();
    const c10::IValue loaded_optimizer = resumed->optimizer_state_dict();
    if (holds_state) {
      expect_states_equal(loaded, saved_model, "2-D -> 2-D, loaded");
    }
    if (gives_optimizer_state(*resumed, mesh)) {
      expect_optimizer_states(
          loaded_optimizer, saved_optimizer, "2-D -> 2-D, loaded", max_norm, /*bitwise=*/true);
    }
    for (int step = kSaveStep; step < kSteps; ++step) {
      const StepResult result = train_step(*resumed, step, c, max_norm);
      EXPECT_EQ(result.loss, two_d_losses[step - kSaveStep].loss) << "2-D -> 2-D loss " << step;
    }
    const NamedTensors continued = resumed->model_state_dict();
    if (holds_state) {
      expect_states_equal(continued, two_d_final, "2-D -> 2-D, continued");
    }
  }
  // The 2-D checkpoint into one process: it loads as is, and continues like the 2-D run.
  {
    auto resumed = make_run(c, nullptr);
    resumed->load_model_state_dict(as_map(saved_model));
    resumed->load_optimizer_state_dict(saved_optimizer);
    expect_states_equal(resumed->model_state_dict(), saved_model, "2-D -> 1, loaded");
    expect_optimizer_states(
        resumed->optimizer_state_dict(),
        saved_optimizer,
        "2-D -> 1, loaded",
        max_norm,
        /*bitwise=*/true);
    for (int step = kSaveStep; step < kSteps; ++step) {
      const StepResult result = train_step(*resumed, step, c, max_norm);
      expect_near_value(
          result.loss, two_d_losses[step - kSaveStep].loss, fmt::format("2-D -> 1 loss {}", step));
    }
    expect_states_close(
        resumed->model_state_dict(), two_d_final, "2-D -> 1, continued", final_slack);
  }
  // And back: the one-process checkpoint into a fresh 2-D run, which continues like the
  // one-process run.
  {
    auto resumed = make_run(c, &mesh);
    resumed->load_model_state_dict(as_map(reference_model));
    resumed->load_optimizer_state_dict(reference_optimizer);
    const NamedTensors loaded = resumed->model_state_dict();
    const c10::IValue loaded_optimizer = resumed->optimizer_state_dict();
    if (holds_state) {
      expect_states_equal(loaded, reference_model, "1 -> 2-D, loaded");
    }
    if (gives_optimizer_state(*resumed, mesh)) {
      expect_optimizer_states(
          loaded_optimizer, reference_optimizer, "1 -> 2-D, loaded", max_norm, /*bitwise=*/true);
    }
    for (int step = kSaveStep; step < kSteps; ++step) {
      const StepResult result = train_step(*resumed, step, c, max_norm);
      expect_near_value(
          result.loss,
          reference_losses[step - kSaveStep].loss,
          fmt::format("1 -> 2-D loss {}", step));
    }
    const NamedTensors continued = resumed->model_state_dict();
    if (holds_state) {
      expect_states_close(continued, reference_final, "1 -> 2-D, continued", final_slack);
    }
  }
}

// The TP x DP mesh, checked against the layout the file's top describes.
Mesh checked_mesh(comm::ProcessGroup& world) {
  Mesh mesh = make_mesh(world);
  EXPECT_EQ(describe_sizes(mesh.layout->dimensions()), "pp(1) * dp(2) * tp(2)");
  EXPECT_EQ(mesh.layout->group("tp")->rank(), world.rank() % kTensorParallelSize);
  EXPECT_EQ(mesh.layout->group("tp")->global_rank(0), world.rank() / 2 * 2);
  EXPECT_EQ(mesh.layout->group("dp")->rank(), world.rank() / kTensorParallelSize);
  EXPECT_EQ(mesh.layout->group("dp")->global_rank(0), world.rank() % kTensorParallelSize);
  return mesh;
}

TEST(TensorParallelComposition, MlpTrunkTpTimesDdpTrainsAndResumesLikeOneProcess) {
  run_on_ranks(kTensorParallelSize * kDataParallelSize, [](comm::ProcessGroup& world) {
    expect_two_dimensional_run_like_one_process({make_mlp, {1, 4, 4}}, checked_mesh(world));
  });
}

// TP 2 x ZeRO-1, ZeRO-2 and FSDP over the two replicas: the optimizer state (with stage 2
// the gradients, with FSDP the parameters too) of each rank's slices partitioned over its
// replicas; its checkpoint is still the unsharded model's.
TEST(TensorParallelComposition, TpTimesZeroAndFsdpTrainAndResumeLikeOneProcess) {
  run_on_ranks(kTensorParallelSize * kDataParallelSize, [](comm::ProcessGroup& world) {
    for (DataParallelism zero :
         {DataParallelism::kZero1, DataParallelism::kZero2, DataParallelism::kFsdp}) {
      SCOPED_TRACE(to_string(zero));
      Mesh mesh = checked_mesh(world);
      mesh.data_parallelism = zero;
      expect_two_dimensional_run_like_one_process({make_mlp, {1, 4, 4}}, mesh);
      expect_two_dimensional_run_like_one_process({make_vit, {3, 16, 16}}, mesh);
      expect_two_dimensional_run_like_one_process({make_mlp, {1, 4, 4}, lamb()}, mesh);
    }
  });
}

TEST(TensorParallelComposition, VitTpTimesDdpTrainsAndResumesLikeOneProcess) {
  run_on_ranks(kTensorParallelSize * kDataParallelSize, [](comm::ProcessGroup& world) {
    expect_two_dimensional_run_like_one_process({make_vit, {3, 16, 16}}, checked_mesh(world));
  });
}

// TP 2 x PP 2: each stage split over a tensor-parallel pair, under every schedule (the MLP's
// four blocks make one stage each with two virtual stages per rank).
TEST(TensorParallelComposition, MlpTrunkTpTimesPipelineTrainsAndResumesLikeOneProcess) {
  run_on_ranks(kTensorParallelSize * 2, [](comm::ProcessGroup& world) {
    for (const auto& stages :
         {PipelineParallelOptions(),
          PipelineParallelOptions().schedule(PipelineScheduleKind::kGPipe),
          PipelineParallelOptions().schedule(PipelineScheduleKind::kZeroBubbleH1),
          PipelineParallelOptions()
              .schedule(PipelineScheduleKind::kInterleaved1F1B)
              .virtual_stages(2)}) {
      SCOPED_TRACE(to_string(stages.schedule()));
      expect_two_dimensional_run_like_one_process(
          {make_mlp, {1, 4, 4}}, make_pipeline_mesh(world, stages));
    }
  });
}

// PP 2 x DP 2 x TP 2 at 8 ranks with ZeRO-1 over each stage's replicas: the pieces of each
// rank's slices partitioned over its replica pair; with LAMB, whose norms then complete over
// the replicas, the shards and (the gradient norm) the stages.
TEST(TensorParallelComposition, MlpTrunkThreeDimensionsWithZeroOneTrainAndResumeLikeOneProcess) {
  run_on_ranks(8, [](comm::ProcessGroup& world) {
    Mesh mesh = make_pipeline_mesh(world);
    mesh.data_parallelism = DataParallelism::kZero1;
    expect_two_dimensional_run_like_one_process({make_mlp, {1, 4, 4}, lamb()}, mesh);
  });
}

TEST(TensorParallelComposition, VitTpTimesPipelineTrainsAndResumesLikeOneProcess) {
  run_on_ranks(kTensorParallelSize * 2, [](comm::ProcessGroup& world) {
    expect_two_dimensional_run_like_one_process({make_vit, {3, 16, 16}}, make_pipeline_mesh(world));
  });
}

// Sequence parallelism (the ViT's 5 tokens split 3 + 2) under TP x DDP, TP x FSDP (the
// norms' gradients, summed over the shards in backward, then reduce-scattered over the
// replicas) and TP x PP (cut between the two encoder layers: each rank's tokens are sent to
// the next stage's rank of the same shards).
TEST(TensorParallelComposition, VitWithSequenceParallelismTrainsAndResumesLikeOneProcess) {
  run_on_ranks(kTensorParallelSize * kDataParallelSize, [](comm::ProcessGroup& world) {
    for (DataParallelism mode : {DataParallelism::kDdp, DataParallelism::kFsdp}) {
      SCOPED_TRACE(to_string(mode));
      Mesh mesh = checked_mesh(world);
      mesh.data_parallelism = mode;
      mesh.sequence_parallel = true;
      expect_two_dimensional_run_like_one_process({make_vit, {3, 16, 16}}, mesh);
    }
    // Blocks: the patch embedding, 2 encoder layers, the final norm; the head is the last.
    Mesh pipeline = make_pipeline_mesh(world, PipelineParallelOptions().boundaries({0, 2, 5}));
    pipeline.sequence_parallel = true;
    expect_two_dimensional_run_like_one_process({make_vit, {3, 16, 16}}, pipeline);
  });
}

// LARC and LAMB on the MLP (whose gradients carry no rounding noise where they are zero, so
// the AdamW slack of the bounds stays negligible), over TP x DDP and TP x PP. Checked to fail
// with each shard's own norms: the second step's loss is off by 1e-7 relative (LARC:
// 1.67659949 against 1.67659969), 1000 times the bound.
TEST(TensorParallelComposition, LarcAndLambNormsAreTheUnshardedParameters) {
  run_on_ranks(kTensorParallelSize * 2, [](comm::ProcessGroup& world) {
    const Mesh two_d = checked_mesh(world);
    for (const auto& [name, optimizer] :
         {std::pair<std::string, OptimizerFactory>{"larc", larc_sgd()}, {"lamb", lamb()}}) {
      SCOPED_TRACE(name);
      const Case c{make_mlp, {1, 4, 4}, optimizer};
      expect_two_dimensional_run_like_one_process(c, two_d);
      expect_two_dimensional_run_like_one_process(c, make_pipeline_mesh(world));
    }
  });
}

// Without data parallelism (a mesh of one replica, tp(2)): update_full_parameter() changes
// the full value of a shard (SwAV's prototypes normalised between steps), and
// full_parameters() gives it back, bit for bit.
TEST(TensorParallelComposition, TensorParallelAloneUpdatesFullParameters) {
  run_on_ranks(kTensorParallelSize, [](comm::ProcessGroup& world) {
    models::TrunkHeadModel model = make_mlp();
    const auto full = model->named_parameters(); // before sharding: the full values
    const at::Tensor expected = full["trunk.1.linear.weight"].detach() * 2.0 + 1.0;
    ParallelOptions options;
    options.tensor_parallel_size = kTensorParallelSize;
    auto mesh = make_device_mesh(borrow(world), options);
    apply_tensor_parallel(*model, mesh->group("tp")); // a user's own split of the layers
    auto run = parallelize(model, groups_of(*model), adamw(), mesh, options);
    EXPECT_NE(run->describe().find("tensor parallel over 2 ranks"), std::string::npos)
        << run->describe();
    ASSERT_NE(run->tensor_parallel_group(), nullptr);
    run->update_full_parameter("trunk.1.linear.weight", [](at::Tensor& value) {
      ASSERT_EQ(value.size(1), 32); // the full [24, 32] weight, not the [24, 16] shard
      value.mul_(2.0).add_(1.0);
    });
    for (const auto& [name, value] : run->full_parameters()) {
      EXPECT_TRUE(
          at::equal(value, name == "trunk.1.linear.weight" ? expected : full[name].detach()))
          << name;
    }
  });
}

// The OptionError parallelize() throws on `layout` (a mesh, or the world), or "" when it
// throws none (then it built the model).
template <typename Layout>
std::string
parallelize_error(models::TrunkHeadModel model, ParallelOptions options, Layout layout) {
  try {
    parallelize(model, groups_of(*model), adamw(), std::move(layout), std::move(options));
  } catch (const OptionError& error) {
    return error.what();
  }
  return "";
}

void expect_contains(const std::string& message, const std::string& part) {
  EXPECT_NE(message.find(part), std::string::npos)
      << "\"" << message << "\" lacks \"" << part << "\"";
}

// Refused before any collective, so each rank may check them alone (the meshes of 2 ranks
// here make no new group: each dimension is one rank or the world).
TEST(TensorParallelComposition, RefusesWhatDoesNotCompose) {
  run_on_ranks(kTensorParallelSize, [](comm::ProcessGroup& world) {
    ParallelOptions with_size;
    with_size.tensor_parallel_size = kTensorParallelSize;
    const auto tp_mesh = make_device_mesh(borrow(world), with_size); // tp(2)

    // Tensor parallelism, but the module was not split.
    const std::string unsharded = parallelize_error(make_mlp(), with_size, tp_mesh);
    expect_contains(unsharded, "ParallelOptions::tensor_parallel_size");
    expect_contains(unsharded, "apply_tensor_parallel_plan");

    // A split module without tensor parallelism.
    models::TrunkHeadModel sharded = make_mlp();
    apply_tensor_parallel(*sharded, tp_mesh->group("tp"));
    const std::string unsplit_run =
        parallelize_error(sharded, ParallelOptions{}, comm::ProcessGroup::single_process());
    expect_contains(unsplit_run, "ParallelOptions::tensor_parallel_size = 1");
    expect_contains(unsplit_run, "expected 2, the size of the mesh's \"tp\" group");

    // FSDP's compute copies.
    {
      ParallelOptions options = with_size;
      options.data_parallelism = DataParallelism::kFsdp;
      options.fsdp.compute_dtype = at::kHalf;
      models::TrunkHeadModel model = make_mlp();
      apply_tensor_parallel_plan(*model, *tp_mesh, options);
      const std::string message = parallelize_error(model, options, tp_mesh);
      expect_contains(message, "FullyShardedDataParallelOptions::compute_dtype");
      EXPECT_THROW(check_parallel_options(options, 2), OptionError);
    }

    // In pipeline stages: every shard must cut the model alike, and stages are not
    // recomputed.
    auto options_error = [](const ParallelOptions& options) -> std::string {
      try {
        check_parallel_options(options, 4);
      } catch (const OptionError& error) {
        return error.what();
      }
      return "";
    };
    ParallelOptions staged;
    staged.tensor_parallel_size = 2;
    staged.pipeline.size = 2;
    EXPECT_EQ(options_error(staged), "");
    staged.pipeline.stages.balance(StageBalance::kTime);
    expect_contains(options_error(staged), "PipelineParallelOptions::balance");
    staged.pipeline.stages.balance(StageBalance::kParameters).checkpoint_stages(true);
    expect_contains(options_error(staged), "PipelineParallelOptions::checkpoint_stages");
    staged.pipeline.stages.checkpoint_stages(false);
    staged.data_parallelism = DataParallelism::kZero1; // over each stage's replicas
    EXPECT_EQ(options_error(staged), "");

    // The size alone (a run plan's, before any group exists) is checked the same way; at
    // parallelize() it needs the mesh it was split over, not the world nor another mesh.
    ParallelOptions by_size;
    by_size.tensor_parallel_size = 2;
    by_size.activation_checkpointing.sequential = "trunk";
    by_size.activation_checkpointing.num_splits = 2;
    try {
      check_parallel_options(by_size, 4);
      ADD_FAILURE() << "activation checkpointing with tensor_parallel_size 2 was accepted";
    } catch (const OptionError& error) {
      expect_contains(error.what(), "ParallelOptions::tensor_parallel_size");
    }
    by_size.activation_checkpointing = {};
    models::TrunkHeadModel model = make_mlp();
    apply_tensor_parallel_plan(*model, *tp_mesh, by_size);
    const std::string given_the_world = parallelize_error(model, by_size, borrow(world));
    expect_contains(given_the_world, "ParallelOptions::tensor_parallel_size = 2");
    expect_contains(given_the_world, "give parallelize() the mesh");
    const auto dp_mesh = make_device_mesh(borrow(world), ParallelOptions{}); // dp(2)
    const std::string other_mesh = parallelize_error(model, by_size, dp_mesh);
    expect_contains(other_mesh, "parallelize's mesh = pp(1) * dp(2) * tp(1)");
    expect_contains(other_mesh, "pp(1) * dp(1) * tp(2)");
  });
}

// The mesh of a run: tensor-parallel shards innermost, the replicas what is left.
TEST(TensorParallelComposition, MeshDimensionsHoldTheTensorParallelSize) {
  ParallelOptions options;
  options.tensor_parallel_size = 2;
  const auto dimensions = mesh_dimensions(options, 8);
  ASSERT_EQ(dimensions.size(), 3u);
  EXPECT_EQ(describe_sizes(dimensions), "pp(1) * dp(4) * tp(2)");
  EXPECT_EQ(data_shard(5, dimensions), (DataShard{2, 4})); // ranks 4 and 5 read shard 2
  EXPECT_EQ(data_shard(4, dimensions), (DataShard{2, 4}));
  options.tensor_parallel_size = 3;
  EXPECT_THROW(mesh_dimensions(options, 8), OptionError);
}

} // namespace
} // namespace largo::parallel::tensor_parallel_composition_test
