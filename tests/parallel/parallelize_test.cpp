// parallel::parallelize() on a module defined here (not Largo's zoo), in the caller's own loop:
// every mode trains like one process on the global batch, accumulation like the larger batch,
// activation checkpointing (per module or as Sequential splits) changes nothing, precision
// composes with the sharded modes, and the combinations that do not compose are OptionErrors
// naming the library's options.
#include <largo/core/error.h>
#include <largo/optim/sgd.h>
#include <largo/parallel/parallelize.h>

#include "comm/distributed_test_util.h"
#include "parallel/parallelize_test_util.h"

#include <fmt/format.h>

namespace largo::parallel::parallelize_test {
namespace {

using largo::testing::run_on_ranks;
using testing::Block;
using testing::BlockImpl;
using testing::borrow;
using testing::groups_of;
using testing::sgd_momentum;

constexpr int64_t kInputs = 12;
constexpr int64_t kWidth = 16;
constexpr int64_t kClasses = 5;
constexpr int64_t kGlobalBatch = 8;
constexpr int kSteps = 6;

// Its blocks in a Sequential (where FSDP units and checkpointed modules are chosen), the rest
// called directly.
struct NetImpl : torch::nn::Module {
  NetImpl()
      : embed(register_module("embed", torch::nn::Linear(kInputs, kWidth))),
        blocks(register_module(
            "blocks", torch::nn::Sequential(Block(kWidth), Block(kWidth), Block(kWidth)))),
        head(register_module("head", torch::nn::Linear(kWidth, kClasses))) {}
  at::Tensor forward(at::Tensor x) {
    return head(blocks->forward(torch::relu(embed(x))));
  }
  torch::nn::Linear embed;
  torch::nn::Sequential blocks;
  torch::nn::Linear head;
};
TORCH_MODULE(Net);

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

// Rank 1 starts from other weights on purpose: parallelize must give every rank rank 0's.
Net make_net(int rank) {
  torch::manual_seed(rank == 0 ? 3 : 77);
  return Net();
}

// Rows [begin, begin + count) of step `step`'s global batch.
std::pair<at::Tensor, at::Tensor> rows(int step, int64_t begin, int64_t count) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(500 + step);
  at::Tensor inputs = at::randn({kGlobalBatch, kInputs}, generator);
  at::Tensor labels = at::randint(0, kClasses, {kGlobalBatch}, generator);
  return {inputs.narrow(0, begin, count), labels.narrow(0, begin, count)};
}

// The caller's own loop: kSteps steps, each rank its rows of the global batch in
// `accumulation` micro-steps.
NamedTensors
train(ParallelModel& model, int accumulation = 1, const std::vector<std::string>& dropped = {}) {
  comm::ProcessGroup& group = model.process_group();
  const int64_t per_rank = kGlobalBatch / group.world_size();
  const int64_t micro = per_rank / accumulation;
  for (int step = 0; step < kSteps; ++step) {
    model.zero_grad();
    for (int k = 0; k < accumulation; ++k) {
      auto [x, y] = rows(step, group.rank() * per_rank + k * micro, micro);
      auto scope = model.micro_step(/*synchronize=*/k + 1 == accumulation);
      model.backward(torch::nn::functional::cross_entropy(model.forward(x), y) / accumulation);
    }
    EXPECT_TRUE(model.finish_backward());
    if (!dropped.empty()) {
      model.drop_gradients(dropped);
    }
    model.clip_grad_norm(10.0);
    EXPECT_TRUE(model.step());
  }
  return model.full_parameters();
}

// One process, the whole global batch at once, no wrapper: the reference.
NamedTensors train_one_process(const ParallelOptions& options = {}) {
  Net net = make_net(0);
  ParallelOptions local = options;
  local.data_parallelism = DataParallelism::kDdp;
  local.fsdp = {};
  local.activation_checkpointing = {};
  auto model = parallelize(net, groups_of(*net), sgd_momentum(),
                           comm::ProcessGroup::single_process(), local);
  return train(*model);
}

NamedTensors train_parallel(comm::ProcessGroup& group, ParallelOptions options,
                            int accumulation = 1) {
  Net net = make_net(group.rank());
  auto model = parallelize(net, groups_of(*net), sgd_momentum(), borrow(group), options);
  return train(*model, accumulation);
}

// float32 sums of the same terms in another order (2 ranks' halves averaged, flat buckets,
// shards): each step's update differs by a few units in the last place of values of order
// 0.1-1, and 6 SGD steps at lr 0.05 carry that at most a few times 1e-7; 1e-5 leaves margin
// for every CPU's summation order while a real mistake (a missed reduction, a wrong scale)
// moves parameters by 1e-2.
void expect_close(const NamedTensors& actual, const NamedTensors& expected, double tolerance) {
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    ASSERT_EQ(actual[i].first, expected[i].first);
    const double difference =
        (actual[i].second.to(at::kDouble) - expected[i].second.to(at::kDouble)).abs().max().item<double>();
    EXPECT_LE(difference, tolerance) << expected[i].first;
  }
}

void expect_equal(const NamedTensors& actual, const NamedTensors& expected) {
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_TRUE(torch::equal(actual[i].second, expected[i].second)) << expected[i].first;
  }
}

ParallelOptions mode_options(DataParallelism mode) {
  ParallelOptions options;
  options.data_parallelism = mode;
  options.ddp.bucket_cap_bytes = 2048; // several buckets
  options.ddp.first_bucket_cap_bytes = 1024;
  options.zero.reduce_buffer_bytes = 2048;
  options.fsdp.wrap_policy = WrapPolicy::of_type<BlockImpl>("Block");
  return options;
}

// A test name for a mode: "ZeRO-1" -> "ZeRO1".
std::string mode_test_name(DataParallelism mode) {
  std::string name = to_string(mode);
  name.erase(
      std::remove_if(name.begin(), name.end(), [](char c) { return !std::isalnum(c); }),
      name.end());
  return name;
}

class ModesTest : public ::testing::TestWithParam<std::tuple<DataParallelism, int>> {};

TEST_P(ModesTest, TrainLikeOneProcessOnTheGlobalBatch) {
  const auto [mode, accumulation] = GetParam();
  run_on_ranks(2, [mode = mode, accumulation = accumulation](comm::ProcessGroup& group) {
    torch::set_num_threads(1);
    const NamedTensors reference = train_one_process();
    expect_close(train_parallel(group, mode_options(mode), accumulation), reference, 1e-5);
  });
}

INSTANTIATE_TEST_SUITE_P(
    EveryMode,
    ModesTest,
    ::testing::Combine(
        ::testing::Values(
            DataParallelism::kDdp,
            DataParallelism::kZero1,
            DataParallelism::kZero2,
            DataParallelism::kFsdp),
        ::testing::Values(1, 2)),
    [](const auto& info) {
      return fmt::format(
          "{}_accumulate{}", mode_test_name(std::get<0>(info.param)), std::get<1>(info.param));
    });

// drop_gradients (VISSL's frozen parameters) in every mode: the dropped parameters keep their
// first value bit for bit (the sharded modes step pieces, whose gradients are what must go),
// and the others train as one process dropping the same, clipping included.
class DropGradientsTest : public ::testing::TestWithParam<DataParallelism> {};

TEST_P(DropGradientsTest, DroppedParametersStayAndTheRestTrainLikeOneProcess) {
  run_on_ranks(2, [mode = GetParam()](comm::ProcessGroup& group) {
    torch::set_num_threads(1);
    const std::vector<std::string> dropped = {"head.weight", "blocks.1.fc1.weight"};
    Net reference_net = make_net(0);
    auto reference = parallelize(
        reference_net,
        groups_of(*reference_net),
        sgd_momentum(),
        comm::ProcessGroup::single_process(),
        ParallelOptions{});
    const NamedTensors first = reference->full_parameters();
    const NamedTensors expected = train(*reference, 1, dropped);
    Net net = make_net(group.rank());
    auto model =
        parallelize(net, groups_of(*net), sgd_momentum(), borrow(group), mode_options(mode));
    const NamedTensors actual = train(*model, 1, dropped);
    expect_close(actual, expected, 1e-5);
    for (size_t i = 0; i < first.size(); ++i) {
      const bool is_dropped =
          std::find(dropped.begin(), dropped.end(), first[i].first) != dropped.end();
      EXPECT_EQ(torch::equal(actual[i].second, first[i].second), is_dropped) << first[i].first;
    }
    EXPECT_THROW(model->drop_gradients({"head.no_such_weight"}), Error);
  });
}

INSTANTIATE_TEST_SUITE_P(
    EveryMode,
    DropGradientsTest,
    ::testing::Values(
        DataParallelism::kDdp,
        DataParallelism::kZero1,
        DataParallelism::kZero2,
        DataParallelism::kFsdp),
    [](const auto& info) { return mode_test_name(info.param); });

// Each data-parallel mode states its placements: DDP replicates everything, ZeRO-1/2 flat-shard
// the optimizer state over "dp", FSDP the values too (which the module then holds as gathered
// copies); none owns a part of the model alone.
TEST(ParallelizeTest, EachDataParallelModeStatesItsPlacements) {
  run_on_ranks(2, [](comm::ProcessGroup& group) {
    torch::set_num_threads(1);
    for (DataParallelism mode :
         {DataParallelism::kDdp,
          DataParallelism::kZero1,
          DataParallelism::kZero2,
          DataParallelism::kFsdp}) {
      SCOPED_TRACE(to_string(mode));
      Net net = make_net(group.rank());
      const size_t trained = net->parameters().size();
      auto model =
          parallelize(net, groups_of(*net), sgd_momentum(), borrow(group), mode_options(mode));
      const StatePlacements placements = model->placements();
      const std::string value = mode == DataParallelism::kFsdp ? "{dp: FlatShard}" : "{}";
      const std::string state = mode == DataParallelism::kDdp ? "{}" : "{dp: FlatShard}";
      EXPECT_EQ(
          placements.describe(),
          fmt::format("value {}, optimizer state {}: {} parameters", value, state, trained));
      EXPECT_EQ(placements.module_holds_whole_model(), mode != DataParallelism::kFsdp);
      EXPECT_EQ(placements.module_holds_gathered_copies(), mode == DataParallelism::kFsdp);
      EXPECT_TRUE(placements.cover_whole_model());
      // What the run's plan is checked against before a model exists says the same.
      const ParameterPlacement planned = data_parallel_placement(mode);
      EXPECT_EQ(describe(planned.value), value);
      EXPECT_EQ(describe(planned.optimizer_state), state);
    }
  });
}

// Offload on the CPU, where the host is the device: the host optimizer steps the same values
// as the device's would, so the run is the same bit for bit; the device then holds no
// optimizer state, and the host what the estimate says.
class OffloadTest : public ::testing::TestWithParam<DataParallelism> {};

TEST_P(OffloadTest, TrainsBitForBitLikeWithoutAndReportsItsHostMemory) {
  run_on_ranks(2, [mode = GetParam()](comm::ProcessGroup& group) {
    torch::set_num_threads(1);
    const NamedTensors on_device = train_parallel(group, mode_options(mode));
    ParallelOptions options = mode_options(mode);
    options.offload_optimizer = true;
    Net net = make_net(group.rank());
    auto model = parallelize(net, groups_of(*net), sgd_momentum(), borrow(group), options);
    EXPECT_NE(model->describe().find("offloaded to host memory"), std::string::npos);
    expect_equal(train(*model), on_device);
    optim::OptimizerSpec spec;
    spec.sgd.momentum = 0.9;
    const ModelStateReport report = model->memory_report(&spec);
    ASSERT_TRUE(report.estimated.has_value());
    EXPECT_EQ(report.measured.optimizer_state, 0);
    EXPECT_EQ(report.estimated->optimizer_state, 0);
    EXPECT_GT(report.measured.host, 0);
    if (mode != DataParallelism::kFsdp) { // the same flat layout: to the byte
      EXPECT_EQ(report.measured.host, report.estimated->host);
    } else { // per-unit layouts against one flat layout: the padding differs (5 %, as ZeRO's)
      EXPECT_NEAR(
          static_cast<double>(report.measured.host),
          static_cast<double>(report.estimated->host),
          0.05 * static_cast<double>(report.estimated->host));
    }
  });
}

INSTANTIATE_TEST_SUITE_P(
    ShardedModes,
    OffloadTest,
    ::testing::Values(DataParallelism::kZero1, DataParallelism::kZero2, DataParallelism::kFsdp),
    [](const auto& info) { return mode_test_name(info.param); });

// Checkpointing recomputes the same operations on the same values: bit for bit the same run,
// with every block its own segment or the Sequential cut in two, under DDP and FSDP (whose
// recompute gathers each unit again).
TEST(ParallelizeTest, ActivationCheckpointingChangesNothing) {
  run_on_ranks(2, [](comm::ProcessGroup& group) {
    torch::set_num_threads(1);
    for (DataParallelism mode : {DataParallelism::kDdp, DataParallelism::kFsdp}) {
      SCOPED_TRACE(to_string(mode));
      const NamedTensors plain = train_parallel(group, mode_options(mode));
      ParallelOptions per_block = mode_options(mode);
      per_block.activation_checkpointing.modules = WrapPolicy::of_type<BlockImpl>("Block");
      expect_equal(train_parallel(group, per_block), plain);
      ParallelOptions split = mode_options(mode);
      split.activation_checkpointing.sequential = "blocks";
      split.activation_checkpointing.num_splits = 2;
      split.activation_checkpointing.probe_input_shape = {kInputs};
      expect_equal(train_parallel(group, split), plain);
      ParallelOptions given = mode_options(mode); // as VISSL's RegNet stage_checkpoints cut
      given.activation_checkpointing.sequential = "blocks";
      given.activation_checkpointing.num_splits = 2;
      given.activation_checkpointing.boundaries = {0, 2, 3};
      expect_equal(train_parallel(group, given), plain);
    }
  });
}

// A cut given as boundaries is installed as given, without a probe.
TEST(ParallelizeTest, AGivenCheckpointingCutIsInstalledAsGiven) {
  run_on_ranks(1, [](comm::ProcessGroup& group) {
    ParallelOptions options = mode_options(DataParallelism::kDdp);
    options.activation_checkpointing.sequential = "blocks";
    options.activation_checkpointing.num_splits = 2;
    options.activation_checkpointing.boundaries = {0, 2, 3};
    Net net = make_net(0);
    auto model = parallelize(net, groups_of(*net), sgd_momentum(), borrow(group), options);
    ASSERT_TRUE(model->checkpoint_plan().has_value());
    EXPECT_EQ(model->checkpoint_plan()->boundaries, (std::vector<int64_t>{0, 2, 3}));
    EXPECT_EQ(model->checkpoint_plan()->cut_by, "cut where given");
  });
}

// Parameterless: `repeats` tanh layers, each holding its output for the backward, so the
// activation bytes it holds are set by `repeats`.
struct TanhChainImpl : torch::nn::Module {
  explicit TanhChainImpl(int64_t repeats) : repeats(repeats) {}
  at::Tensor forward(at::Tensor x) {
    for (int64_t i = 0; i < repeats; ++i) {
      x = torch::tanh(x);
    }
    return x;
  }
  int64_t repeats;
};
TORCH_MODULE(TanhChain);

struct ChainNetImpl : torch::nn::Module {
  ChainNetImpl(int64_t first_repeats, int64_t last_repeats)
      : blocks(register_module(
            "blocks",
            torch::nn::Sequential(
                torch::nn::Linear(kInputs, kWidth),
                TanhChain(first_repeats),
                torch::nn::Linear(kWidth, kWidth),
                TanhChain(1),
                torch::nn::Linear(kWidth, kWidth),
                TanhChain(last_repeats),
                torch::nn::Linear(kWidth, kClasses)))) {}
  at::Tensor forward(at::Tensor x) {
    return blocks->forward(x);
  }
  torch::nn::Sequential blocks;
};
TORCH_MODULE(ChainNet);

// Every rank's cut (the same number of boundaries on each), by rank.
std::vector<std::vector<int64_t>>
every_ranks(const std::vector<int64_t>& boundaries, comm::ProcessGroup& group) {
  const auto count = static_cast<int64_t>(boundaries.size());
  at::Tensor all = torch::empty({group.world_size() * count}, torch::kLong);
  group.all_gather(all, torch::tensor(boundaries, torch::kLong));
  std::vector<std::vector<int64_t>> cuts;
  for (int rank = 0; rank < group.world_size(); ++rank) {
    const int64_t* begin = all.data_ptr<int64_t>() + rank * count;
    cuts.emplace_back(begin, begin + count);
  }
  return cuts;
}

// Each rank measures activation bytes itself; a cut that differed between ranks would order
// FSDP's recomputation gathers differently (a hang). Here the ranks' measurements are made to
// differ (rank 1's heavy element is first, rank 0's last): every rank installs rank 0's cut.
TEST(ParallelizeTest, EveryRankInstallsRankZerosCheckpointingCut) {
  run_on_ranks(2, [](comm::ProcessGroup& group) {
    torch::set_num_threads(1);
    const bool rank0 = group.rank() == 0;
    ChainNet net(/*first_repeats=*/rank0 ? 1 : 40, /*last_repeats=*/rank0 ? 40 : 1);
    const SequentialCheckpointPlan own = plan_sequential_checkpointing(
        torch::nn::AnyModule(net),
        *net->blocks,
        "blocks",
        2,
        SegmentCost::kActivationBytes,
        {kInputs});
    const auto own_cuts = every_ranks(own.boundaries, group);
    ASSERT_NE(own_cuts[0], own_cuts[1]) << "precondition: the ranks' own cuts differ";
    ParallelOptions options = mode_options(DataParallelism::kDdp);
    options.activation_checkpointing.sequential = "blocks";
    options.activation_checkpointing.num_splits = 2;
    options.activation_checkpointing.probe_input_shape = {kInputs};
    auto model = parallelize(net, groups_of(*net), sgd_momentum(), borrow(group), options);
    ASSERT_TRUE(model->checkpoint_plan().has_value());
    const std::vector<int64_t>& installed = model->checkpoint_plan()->boundaries;
    EXPECT_EQ(installed, own_cuts[0]);
  });
}

// bfloat16 autocast with ZeRO-2, FSDP (float32 units) and checkpointing trains like DDP under
// the same autocast: the bfloat16 matmuls are the same on every path, only float32
// reductions are ordered differently.
TEST(ParallelizeTest, AutocastComposesWithShardingAndCheckpointing) {
  run_on_ranks(2, [](comm::ProcessGroup& group) {
    torch::set_num_threads(1);
    precision::PrecisionPolicyOptions amp;
    amp.use_amp = true;
    amp.amp_type = "pytorch";
    amp.dtype = "bfloat16";
    ParallelOptions ddp = mode_options(DataParallelism::kDdp);
    ddp.precision = precision::resolve_precision_policy(amp);
    const NamedTensors reference = train_parallel(group, ddp);
    for (DataParallelism mode : {DataParallelism::kZero2, DataParallelism::kFsdp}) {
      SCOPED_TRACE(to_string(mode));
      ParallelOptions options = mode_options(mode);
      options.precision = ddp.precision;
      options.activation_checkpointing.modules = WrapPolicy::of_type<BlockImpl>("Block");
      // A bfloat16 rounding that flips between the two orders moves an activation by 2^-8
      // relative; through 6 small steps the parameters stay within 1e-4 of each other.
      expect_close(train_parallel(group, options), reference, 1e-4);
    }
  });
}

TEST(ParallelizeTest, CombinationsThatDoNotComposeAreOptionErrors) {
  precision::PrecisionPolicyOptions o2;
  o2.use_amp = true;
  o2.opt_level = "O2";
  o2.dtype = "bfloat16";
  auto expect_option_error = [](ParallelOptions options, const std::string& option) {
    Net net = make_net(0);
    try {
      parallelize(net, groups_of(*net), sgd_momentum(), comm::ProcessGroup::single_process(),
                  options);
      ADD_FAILURE() << "expected an OptionError naming " << option;
    } catch (const OptionError& error) {
      EXPECT_EQ(error.option(), option) << error.what();
    }
  };
  ParallelOptions zero_o2 = mode_options(DataParallelism::kZero1);
  zero_o2.precision = precision::resolve_precision_policy(o2);
  expect_option_error(zero_o2, "ParallelOptions::precision");
  ParallelOptions fsdp_cast = mode_options(DataParallelism::kFsdp);
  fsdp_cast.precision = precision::resolve_precision_policy(o2);
  expect_option_error(fsdp_cast, "ParallelOptions::precision");
  ParallelOptions copies_without_fsdp = mode_options(DataParallelism::kZero2);
  copies_without_fsdp.fsdp.compute_dtype = at::kBFloat16;
  expect_option_error(copies_without_fsdp, "FullyShardedDataParallelOptions::compute_dtype");
  ParallelOptions two_cuts = mode_options(DataParallelism::kDdp);
  two_cuts.activation_checkpointing.modules = WrapPolicy::of_type<BlockImpl>("Block");
  two_cuts.activation_checkpointing.sequential = "blocks";
  two_cuts.activation_checkpointing.num_splits = 2;
  expect_option_error(two_cuts, "ActivationCheckpointingOptions::num_splits");
  ParallelOptions too_many = mode_options(DataParallelism::kDdp);
  too_many.activation_checkpointing.sequential = "blocks";
  too_many.activation_checkpointing.num_splits = 4; // 3 blocks
  expect_option_error(too_many, "ActivationCheckpointingOptions::num_splits");
  ParallelOptions past_the_end = mode_options(DataParallelism::kDdp);
  past_the_end.activation_checkpointing.sequential = "blocks";
  past_the_end.activation_checkpointing.num_splits = 2;
  past_the_end.activation_checkpointing.boundaries = {0, 2, 4}; // 3 blocks
  expect_option_error(past_the_end, "ActivationCheckpointingOptions::boundaries");
  ParallelOptions miscounted = past_the_end;
  miscounted.activation_checkpointing.boundaries = {0, 1, 2, 3}; // 3 segments, num_splits 2
  expect_option_error(miscounted, "ActivationCheckpointingOptions::boundaries");
  ParallelOptions offload_without_shards = mode_options(DataParallelism::kDdp);
  offload_without_shards.offload_optimizer = true;
  expect_option_error(offload_without_shards, "ParallelOptions::offload_optimizer");
  ParallelOptions not_a_sequential = mode_options(DataParallelism::kDdp);
  not_a_sequential.activation_checkpointing.sequential = "head";
  not_a_sequential.activation_checkpointing.num_splits = 1;
  expect_option_error(not_a_sequential, "ActivationCheckpointingOptions::sequential");
}

TEST(ParallelizeTest, DescribesWhatRunsAndReportsItsMemory) {
  run_on_ranks(2, [](comm::ProcessGroup& group) {
    torch::set_num_threads(1);
    ParallelOptions options = mode_options(DataParallelism::kZero2);
    options.activation_checkpointing.sequential = "blocks";
    options.activation_checkpointing.num_splits = 2;
    options.activation_checkpointing.cost = SegmentCost::kBlockCount;
    Net net = make_net(group.rank());
    auto model = parallelize(net, groups_of(*net), sgd_momentum(), borrow(group), options);
    const std::string text = model->describe();
    EXPECT_NE(text.find("ZeRO stage 2"), std::string::npos) << text;
    EXPECT_NE(text.find("blocks [0, 1) [1, 3); the first 1 of 2 segments checkpointed"),
              std::string::npos)
        << text;
    train(*model);
    optim::OptimizerSpec spec;
    spec.sgd.momentum = 0.9;
    const ModelStateReport report = model->memory_report(&spec);
    ASSERT_TRUE(report.estimated.has_value());
    EXPECT_EQ(report.zero_stage, 2);
    EXPECT_EQ(report.measured.optimizer_state, report.estimated->optimizer_state);
    EXPECT_EQ(report.measured.parameters, report.estimated->parameters);
  });
}

} // namespace
} // namespace largo::parallel::parallelize_test
