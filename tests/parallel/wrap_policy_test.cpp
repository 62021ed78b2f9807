// Wrap policies over arbitrary module trees, and intercepting Sequential elements without
// changing what the module is (names, parameters, state dict).
#include <largo/core/error.h>
#include <largo/parallel/activation_checkpointing/checkpointed_segments.h>
#include <largo/parallel/activation_checkpointing/sequential_interception.h>
#include <largo/parallel/wrap_policy.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace largo::parallel::wrap_policy_test {
namespace {

struct PairImpl : torch::nn::Module {
  PairImpl() : a(register_module("a", torch::nn::Linear(4, 4))), b(register_module("b", torch::nn::Linear(4, 4))) {}
  at::Tensor forward(at::Tensor x) {
    return b(torch::relu(a(x)));
  }
  torch::nn::Linear a, b;
};
TORCH_MODULE(Pair);

// A user module holding a Sequential (libtorch cannot nest a Sequential in a Sequential).
struct StageImpl : torch::nn::Module {
  StageImpl()
      : layers(register_module("layers", torch::nn::Sequential(Pair(), torch::nn::ReLU(), Pair()))) {}
  at::Tensor forward(at::Tensor x) {
    return layers->forward(x);
  }
  torch::nn::Sequential layers;
};
TORCH_MODULE(Stage);

// Sequentials at two depths, one element without parameters, one frozen element.
struct TreeImpl : torch::nn::Module {
  TreeImpl()
      : stem(register_module("stem", torch::nn::Linear(4, 4))),
        stages(register_module("stages",
                               torch::nn::Sequential(Stage(), Pair(), torch::nn::Linear(4, 4)))) {
    stages[2]->as<torch::nn::Linear>()->weight.requires_grad_(false);
    stages[2]->as<torch::nn::Linear>()->bias.requires_grad_(false);
  }
  at::Tensor forward(at::Tensor x) {
    return stages->forward(stem(x));
  }
  torch::nn::Linear stem;
  torch::nn::Sequential stages;
};
TORCH_MODULE(Tree);

std::vector<std::string> names_of(const std::vector<WrapTarget>& targets) {
  std::vector<std::string> names;
  for (const auto& target : targets) {
    names.push_back(target.name);
  }
  return names;
}

TEST(WrapPolicyTest, FindsSequentialElementsInForwardOrderWithoutNesting) {
  Tree tree;
  // Every element with trainable parameters: the Stage matches as a whole, so its Pairs are
  // not searched; the last Linear is frozen.
  EXPECT_EQ(names_of(find_wrap_targets(tree.ptr(), WrapPolicy::min_trainable_parameters(0))),
            (std::vector<std::string>{"stages.0", "stages.1"}));
  EXPECT_EQ(names_of(find_wrap_targets(tree.ptr(), WrapPolicy::of_type<PairImpl>("Pair"))),
            (std::vector<std::string>{"stages.0.layers.0", "stages.0.layers.2", "stages.1"}));
  EXPECT_EQ(names_of(find_wrap_targets(tree.ptr(), WrapPolicy::elements_of("stages.0.layers"))),
            (std::vector<std::string>{"stages.0.layers.0", "stages.0.layers.1",
                                      "stages.0.layers.2"}));
  // 2 Pairs of 2 x (16 + 4) parameters in stages.0, one in stages.1.
  const auto big = find_wrap_targets(tree.ptr(), WrapPolicy::min_trainable_parameters(41));
  EXPECT_EQ(names_of(big), (std::vector<std::string>{"stages.0"}));
  EXPECT_EQ(big.front().trainable_numel, 80);
  EXPECT_TRUE(find_wrap_targets(tree.ptr(), WrapPolicy()).empty());
  const auto both = WrapPolicy::elements_of("stages") && WrapPolicy::of_type<PairImpl>("Pair");
  EXPECT_EQ(names_of(find_wrap_targets(tree.ptr(), both)), (std::vector<std::string>{"stages.1"}));
  EXPECT_THROW(WrapPolicy::min_trainable_parameters(-1), OptionError);
}

TEST(SequentialInterceptionTest, ChangesTheForwardPathOnlyAndCanBeUndone) {
  torch::manual_seed(0);
  Tree tree;
  const auto names_before = tree->named_parameters().keys();
  at::Tensor x = torch::randn({3, 4});
  const at::Tensor plain = tree->forward(x);
  int calls = 0;
  torch::nn::Sequential stages = tree->stages;
  torch::nn::AnyModule original = sequential_element_forward(*stages, 1);
  intercept_sequential_element(*stages, 1, [&](const at::Tensor& input) {
    ++calls;
    return original.forward<at::Tensor>(input);
  });
  EXPECT_TRUE(torch::equal(tree->forward(x), plain));
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(tree->named_parameters().keys(), names_before);
  *(stages->begin() + 1) = original;
  tree->forward(x);
  EXPECT_EQ(calls, 1);
  EXPECT_THROW(intercept_sequential_element(*stages, 3, [](const at::Tensor& t) { return t; }),
               Error);
}

TEST(CheckpointedSegmentsTest, GradientsAreBitwiseTheSameAndTheModuleIsRestored) {
  torch::manual_seed(1);
  Tree tree;
  at::Tensor x = torch::randn({5, 4});
  auto gradients = [&] {
    tree->zero_grad();
    tree->forward(x).pow(2).sum().backward();
    std::vector<at::Tensor> grads;
    for (const auto& p : tree->parameters()) {
      grads.push_back(p.grad().defined() ? p.grad().clone() : at::Tensor());
    }
    return grads;
  };
  const auto plain = gradients();
  auto check = [&](const std::vector<at::Tensor>& grads) {
    for (size_t i = 0; i < plain.size(); ++i) {
      EXPECT_EQ(plain[i].defined(), grads[i].defined());
      if (plain[i].defined()) {
        EXPECT_TRUE(torch::equal(plain[i], grads[i])) << i;
      }
    }
  };
  {
    auto per_pair = CheckpointedSegments::wrap_modules(tree.ptr(), WrapPolicy::of_type<PairImpl>("Pair"));
    EXPECT_EQ(per_pair->num_segments(), 3);
    EXPECT_EQ(per_pair->describe(), "stages.0.layers.0, stages.0.layers.2, stages.1");
    check(gradients());
  }
  {
    auto split = CheckpointedSegments::split_sequential(tree->stages, "stages", {0, 2, 3});
    EXPECT_EQ(split->describe(), "stages[0, 2)");
    check(gradients());
  }
  check(gradients()); // both removed again
  EXPECT_THROW(CheckpointedSegments::split_sequential(tree->stages, "stages", {0, 4}), Error);
}

} // namespace
} // namespace largo::parallel::wrap_policy_test
