// Partial norms and their reducer: squared_norms on both paths, and the design that ZeRO
// relies on: LARC, LAMB and global-norm clipping over 1-D pieces of the parameters held by
// two "ranks" (threads), with a reducer that sums their partials, equal the unsharded run.
#include "optim_test_util.h"

#include <largo/optim/grad_clipping.h>
#include <largo/optim/optimizer_factory.h>
#include <largo/optim/tensor_norms.h>

#include <cmath>
#include <condition_variable>
#include <mutex>
#include <thread>

namespace largo::optim::tensor_norms_test {
namespace {

using testing::make_params;
using testing::set_grads;

TEST(TensorNorms, SquaredNormsOnBothPaths) {
  const at::Tensor a = torch::arange(1, 100001, torch::kFloat64).reshape({100, 1000}) / 1000.0;
  const at::Tensor b = torch::linspace(-2, 3, 77, torch::kFloat32);
  const at::Tensor strided = a.t(); // dense, other strides: the CPU pass
  const at::Tensor sliced = a.select(1, 3); // not dense: ATen's norm
  const at::Tensor empty = torch::zeros({0}, torch::kFloat64);
  const at::Tensor result = squared_norms({a, b, strided, sliced, empty});
  ASSERT_EQ(result.scalar_type(), at::kDouble);
  ASSERT_EQ(result.numel(), 5);
  // Sums in another order: equal to ~1e-15 relative.
  auto expect_close = [](double actual, double expected) {
    EXPECT_NEAR(actual, expected, 1e-13 * std::abs(expected)) << expected;
  };
  expect_close(result[0].item<double>(), a.pow(2).sum().item<double>());
  // float32 squares are summed in float32 blocks of 64 (multi_tensor_cpu.h): < 1e-6.
  EXPECT_NEAR(result[1].item<double>(), b.to(at::kDouble).pow(2).sum().item<double>(),
              1e-6 * result[1].item<double>());
  EXPECT_EQ(result[2].item<double>(), result[0].item<double>()); // same elements, same order
  expect_close(result[3].item<double>(), sliced.pow(2).sum().item<double>());
  EXPECT_EQ(result[4].item<double>(), 0.0);
  // The chunked sums do not depend on the thread count.
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  const at::Tensor single = squared_norms({a, b});
  at::set_num_threads(threads);
  EXPECT_EQ(single[0].item<double>(), result[0].item<double>());
  EXPECT_EQ(single[1].item<double>(), result[1].item<double>());
}

TEST(TensorNorms, ReducerMustKeepTheShape) {
  const PartialNormReducer bad = [](const at::Tensor& t, NormReduceOp) { return t.sum(); };
  EXPECT_THROW(reduce_partials(bad, torch::ones({4}, torch::kFloat64), NormReduceOp::sum), Error);
  EXPECT_TRUE(torch::equal(
      reduce_partials({}, torch::ones({4}, torch::kFloat64), NormReduceOp::sum),
      torch::ones({4}, torch::kFloat64)));
}

// An in-memory all-reduce between `world` threads: each contributes, the last one combines,
// everyone leaves with the result.
class ThreadAllReduce {
 public:
  explicit ThreadAllReduce(int world) : world_(world) {}
  at::Tensor operator()(const at::Tensor& local, NormReduceOp op) {
    std::unique_lock<std::mutex> lock(mutex_);
    const int64_t generation = generation_;
    result_ = arrived_ == 0 ? local.clone()
                            : (op == NormReduceOp::sum ? result_ + local : at::maximum(result_, local));
    ++calls_;
    if (++arrived_ == world_) {
      arrived_ = 0;
      ++generation_;
      done_ = result_;
      cv_.notify_all();
    } else {
      cv_.wait(lock, [&] { return generation_ != generation; });
    }
    return done_.clone();
  }
  int64_t calls() const {
    return calls_;
  }

 private:
  int world_;
  std::mutex mutex_;
  std::condition_variable cv_;
  int arrived_ = 0;
  int64_t generation_ = 0;
  int64_t calls_ = 0;
  at::Tensor result_, done_;
};

const std::vector<std::vector<int64_t>> kShapes = {{3, 4}, {5}, {7}};

// Rank r of 2 holds elements [r * ceil(n/2), ...) of every parameter, as a 1-D view.
at::Tensor piece_of(const at::Tensor& full, int rank) {
  const int64_t n = full.numel();
  const int64_t half = (n + 1) / 2;
  const int64_t begin = rank == 0 ? 0 : half;
  const int64_t length = rank == 0 ? half : n - half;
  return full.detach().view(-1).narrow(0, begin, length);
}

std::vector<ParamGroup> groups_over(const std::vector<at::Tensor>& params) {
  ParamGroup decayed;
  decayed.params = {params[0], params[2]};
  decayed.names = {"w", "v"};
  decayed.lr = 0.05;
  decayed.weight_decay = 0.01;
  ParamGroup plain;
  plain.params = {params[1]};
  plain.names = {"b"};
  plain.lr = 0.02;
  return {decayed, plain};
}

// Runs `steps` steps unsharded and on two ranks of pieces; returns the largest relative
// difference of the parameters.
double sharded_vs_unsharded(const OptimizerSpec& spec, int64_t steps, bool clip) {
  std::vector<at::Tensor> full = make_params(kShapes);
  auto optimizer = make_optimizer(groups_over(full), spec);

  std::vector<at::Tensor> sharded_full = make_params(kShapes); // same start
  ThreadAllReduce all_reduce(2);
  std::vector<std::unique_ptr<Optimizer>> ranks;
  std::vector<std::vector<at::Tensor>> pieces(2);
  for (int r = 0; r < 2; ++r) {
    for (const at::Tensor& p : sharded_full) {
      pieces[r].push_back(piece_of(p, r));
    }
    ranks.push_back(make_optimizer(groups_over(pieces[r]), spec));
    ranks.back()->set_norm_reducer(std::ref(all_reduce));
  }

  for (int64_t step = 1; step <= steps; ++step) {
    set_grads(full, step);
    set_grads(sharded_full, step);
    if (clip) {
      clip_grad_norm(full, 0.5);
    }
    std::vector<std::thread> threads;
    for (int r = 0; r < 2; ++r) {
      threads.emplace_back([&, r] {
        for (size_t k = 0; k < kShapes.size(); ++k) { // the rank's piece of each gradient
          pieces[r][k].mutable_grad() = piece_of(sharded_full[k].grad(), r);
        }
        if (clip) {
          clip_grad_norm(pieces[r], 0.5, 2.0, std::ref(all_reduce));
        }
        ranks[r]->step();
      });
    }
    for (auto& t : threads) {
      t.join();
    }
    optimizer->step();
  }
  double worst = 0.0;
  for (size_t k = 0; k < full.size(); ++k) {
    worst = std::max(worst, ((full[k] - sharded_full[k]).abs() / full[k].abs().clamp_min(1.0))
                                .max()
                                .item<double>());
  }
  EXPECT_GT(all_reduce.calls(), 0);
  return worst;
}

// Partial sums split at other places round differently: 1e-13 relative after 20 steps
// (float64) is rounding; forgetting to reduce changes the trust ratios by ~2x.
constexpr double kShardTolerance = 1e-13;

TEST(ShardedNorms, LarcOverPiecesMatchesUnsharded) {
  OptimizerSpec spec;
  spec.sgd.momentum = 0.9;
  spec.use_larc = true;
  spec.larc.trust_coefficient = 0.02;
  spec.larc.clip = true;
  EXPECT_LT(sharded_vs_unsharded(spec, 20, /*clip=*/false), kShardTolerance);
  spec.larc.clip = false;
  EXPECT_LT(sharded_vs_unsharded(spec, 20, /*clip=*/true), kShardTolerance);
}

TEST(ShardedNorms, LambOverPiecesMatchesUnsharded) {
  OptimizerSpec spec;
  spec.name = "lamb";
  EXPECT_LT(sharded_vs_unsharded(spec, 20, /*clip=*/true), kShardTolerance);
}

TEST(ShardedNorms, WithoutReducerPiecesDiffer) {
  // The check above can fail: without the reducer each rank sees half norms.
  OptimizerSpec spec;
  spec.name = "lamb";
  std::vector<at::Tensor> full = make_params(kShapes);
  auto optimizer = make_optimizer(groups_over(full), spec);
  std::vector<at::Tensor> other = make_params(kShapes);
  std::vector<at::Tensor> piece = {piece_of(other[0], 0), piece_of(other[1], 0), piece_of(other[2], 0)};
  auto rank0 = make_optimizer(groups_over(piece), spec);
  set_grads(full, 1);
  set_grads(other, 1);
  for (size_t k = 0; k < piece.size(); ++k) {
    piece[k].mutable_grad() = piece_of(other[k].grad(), 0);
  }
  optimizer->step();
  rank0->step();
  EXPECT_GT((piece_of(full[0], 0) - piece[0]).abs().max().item<double>(), 1e-6);
}

TEST(ShardedNorms, ReducerGetsOneTensorPerStep) {
  OptimizerSpec spec;
  spec.use_larc = true;
  std::vector<at::Tensor> params = make_params(kShapes);
  auto optimizer = make_optimizer(groups_over(params), spec);
  std::vector<int64_t> sizes;
  optimizer->set_norm_reducer([&](const at::Tensor& partials, NormReduceOp op) {
    EXPECT_EQ(op, NormReduceOp::sum);
    EXPECT_EQ(partials.scalar_type(), at::kDouble);
    sizes.push_back(partials.numel());
    return partials;
  });
  set_grads(params, 1);
  params[1].mutable_grad().reset(); // no gradient: zeros in its entries
  optimizer->step();
  optimizer->step();
  EXPECT_EQ(sizes, (std::vector<int64_t>{6, 6})); // 2 x 3 parameters
}

} // namespace
} // namespace largo::optim::tensor_norms_test
