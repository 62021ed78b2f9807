// VISSL's weight-decay grouping: norm layers, biases, name substrings, and the head.
#include <largo/core/error.h>
#include <largo/optim/param_groups.h>
#include <largo/optim/sgd.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <map>

namespace largo::optim::param_groups_test {
namespace {

namespace nn = torch::nn;

// trunk: conv (+bias), BatchNorm, LayerNorm, GroupNorm, a linear with a "pos_embed"-like
// extra parameter and a frozen one; head: linear (+bias) and a BatchNorm.
struct TrunkBlockImpl : nn::Module {
  TrunkBlockImpl() {
    linear = register_module("linear", nn::Linear(4, 4));
    pos_embed = register_parameter("pos_embed", torch::zeros({4}));
    frozen = register_parameter("frozen", torch::zeros({4}), /*requires_grad=*/false);
  }
  at::Tensor forward(const at::Tensor& x) {
    return linear(x) + pos_embed + frozen;
  }
  nn::Linear linear{nullptr};
  at::Tensor pos_embed, frozen;
};
TORCH_MODULE(TrunkBlock);

struct NetImpl : nn::Module {
  NetImpl() {
    trunk = register_module(
        "trunk",
        nn::Sequential(
            nn::Conv2d(nn::Conv2dOptions(3, 4, 3)),
            nn::BatchNorm2d(4),
            nn::LayerNorm(nn::LayerNormOptions({4})),
            nn::GroupNorm(nn::GroupNormOptions(2, 4)),
            TrunkBlock()));
    head = register_module("head", nn::Sequential(nn::BatchNorm1d(4), nn::Linear(4, 10)));
  }
  nn::Sequential trunk{nullptr}, head{nullptr};
};
TORCH_MODULE(Net);

const ParamGroup* find_group(const std::vector<ParamGroup>& groups, const std::string& name) {
  for (const ParamGroup& group : groups) {
    if (group.name == name) {
      return &group;
    }
  }
  return nullptr;
}

std::vector<std::string> group_names(const std::vector<ParamGroup>& groups) {
  std::vector<std::string> names;
  for (const ParamGroup& group : groups) {
    names.push_back(group.name);
  }
  return names;
}

using Names = std::vector<std::string>;

TEST(ParamGroups, VisslDefaultsLeaveNormLayersUndecayed) {
  Net net;
  ParamGroupOptions options; // regularize_bn false, regularize_bias true, wd 1e-4
  options.lr = 0.3;
  const auto groups = build_param_groups(*net, options);
  ASSERT_EQ(group_names(groups), (Names{"trunk", "trunk_no_wd", "head", "head_no_wd"}));
  EXPECT_EQ(
      groups[0].names,
      (Names{
          "trunk.0.weight",
          "trunk.0.bias",
          "trunk.4.pos_embed",
          "trunk.4.linear.weight",
          "trunk.4.linear.bias"}));
  EXPECT_EQ(groups[0].weight_decay, 1e-4);
  EXPECT_EQ(
      groups[1].names,
      (Names{
          "trunk.1.weight",
          "trunk.1.bias",
          "trunk.2.weight",
          "trunk.2.bias",
          "trunk.3.weight",
          "trunk.3.bias"}));
  EXPECT_EQ(groups[1].weight_decay, 0.0);
  EXPECT_EQ(groups[2].names, (Names{"head.1.weight", "head.1.bias"}));
  EXPECT_EQ(groups[2].weight_decay, 1e-4); // use_different_wd is off: the trunk's decay
  EXPECT_EQ(groups[3].names, (Names{"head.0.weight", "head.0.bias"}));
  EXPECT_EQ(groups[3].weight_decay, 0.0);
  for (const ParamGroup& group : groups) {
    EXPECT_EQ(group.lr, 0.3);
    ASSERT_EQ(group.params.size(), group.names.size());
  }
  // The tensors are the module's own (same storage), and the frozen one is left out.
  const auto named = net->named_parameters();
  EXPECT_TRUE(groups[0].params[2].is_same(named["trunk.4.pos_embed"]));
  size_t total = 0;
  for (const ParamGroup& group : groups) {
    total += group.params.size();
  }
  EXPECT_EQ(total, named.size() - 1);
}

TEST(ParamGroups, RegularizeFlagsAndNameSubstrings) {
  Net net;
  ParamGroupOptions options;
  options.regularize_bn = true;
  options.regularize_bias = false;
  options.non_regularized_parameters = {"pos_embed"};
  options.weight_decay = 5e-4;
  const auto groups = build_param_groups(*net, options);
  const ParamGroup* trunk = find_group(groups, "trunk");
  const ParamGroup* trunk_no_wd = find_group(groups, "trunk_no_wd");
  const ParamGroup* head = find_group(groups, "head");
  const ParamGroup* head_no_wd = find_group(groups, "head_no_wd");
  ASSERT_TRUE(trunk && trunk_no_wd && head && head_no_wd);
  EXPECT_EQ(
      trunk->names,
      (Names{
          "trunk.0.weight",
          "trunk.1.weight",
          "trunk.2.weight",
          "trunk.3.weight",
          "trunk.4.linear.weight"}));
  EXPECT_EQ(trunk->weight_decay, 5e-4);
  EXPECT_EQ(
      trunk_no_wd->names,
      (Names{
          "trunk.0.bias",
          "trunk.1.bias",
          "trunk.2.bias",
          "trunk.3.bias",
          "trunk.4.pos_embed",
          "trunk.4.linear.bias"}));
  EXPECT_EQ(head->names, (Names{"head.0.weight", "head.1.weight"}));
  EXPECT_EQ(head_no_wd->names, (Names{"head.0.bias", "head.1.bias"}));
}

TEST(ParamGroups, HeadWeightDecayAndEmptyGroupsDropped) {
  nn::Sequential trunk_only(nn::Linear(3, 3), nn::Linear(3, 2));
  ParamGroupOptions options;
  auto groups = build_param_groups(*trunk_only, options);
  ASSERT_EQ(group_names(groups), Names{"trunk"});
  EXPECT_EQ(groups[0].names, (Names{"0.weight", "0.bias", "1.weight", "1.bias"}));

  Net net;
  options.use_different_wd = true;
  options.head_weight_decay = 0.05;
  options.regularize_bn = true;
  groups = build_param_groups(*net, options);
  EXPECT_EQ(group_names(groups), (Names{"trunk", "head"}));
  EXPECT_EQ(find_group(groups, "head")->weight_decay, 0.05);
  EXPECT_EQ(find_group(groups, "trunk")->weight_decay, 1e-4);
}

TEST(ParamGroups, CustomNormPredicateAndSharedParameters) {
  // A module of the caller's own that is a norm layer (e.g. a synchronized BatchNorm).
  struct MyNormImpl : nn::Module {
    MyNormImpl() {
      scale = register_parameter("scale", torch::ones({2}));
    }
    at::Tensor scale;
  };
  auto root = std::make_shared<nn::Module>();
  auto norm = std::make_shared<MyNormImpl>();
  root->register_module("norm", norm);
  auto linear = nn::Linear(2, 2);
  root->register_module("a", linear);
  root->register_module("b", linear); // the same module twice: its params appear once

  ParamGroupOptions options;
  auto groups = build_param_groups(*root, options);
  ASSERT_EQ(group_names(groups), Names{"trunk"});
  EXPECT_EQ(groups[0].names, (Names{"norm.scale", "a.weight", "a.bias"}));

  options.is_norm_layer = [](const nn::Module& module) {
    return dynamic_cast<const MyNormImpl*>(&module) != nullptr;
  };
  groups = build_param_groups(*root, options);
  ASSERT_EQ(group_names(groups), (Names{"trunk", "trunk_no_wd"}));
  EXPECT_EQ(groups[1].names, Names{"norm.scale"});
  EXPECT_TRUE(is_norm_layer(*nn::BatchNorm2d(3)));
  EXPECT_TRUE(is_norm_layer(*nn::InstanceNorm2d(nn::InstanceNorm2dOptions(3).affine(true))));
  EXPECT_FALSE(is_norm_layer(*linear));
}

TEST(ParamGroups, FeedAnOptimizer) {
  Net net;
  SGD optimizer(build_param_groups(*net, ParamGroupOptions{}), SGDOptions{0.9});
  auto x = torch::randn({2, 3, 5, 6});
  auto features = net->trunk->forward(x); // [2, 4, 3, 4] after LayerNorm over the last dim
  auto loss = net->head->forward(features.mean({1, 2})).sum();
  loss.backward();
  const at::Tensor before = net->named_parameters()["trunk.1.weight"].detach().clone();
  optimizer.step();
  // BatchNorm weights get momentum SGD without decay: p -= lr * grad on the first step.
  // A copy (shares storage): named_parameters() returns a temporary dict.
  const at::Tensor bn_weight = net->named_parameters()["trunk.1.weight"];
  EXPECT_TRUE(torch::allclose(bn_weight, before - 0.1 * bn_weight.grad()));
  EXPECT_NE(optimizer.find_state("head.1.weight"), nullptr);
}

// One SGD step with zero gradients leaves only the weight decay: p *= 1 - lr * wd for the
// decayed parameters, nothing for the others.
std::map<std::string, bool> decayed_by_a_step(const ParamGroupOptions& options) {
  Net net;
  for (const auto& item : net->named_parameters()) {
    torch::NoGradGuard no_grad;
    item.value().fill_(0.5); // non-zero everywhere, so decay is visible
    item.value().mutable_grad() = torch::zeros_like(item.value());
  }
  SGD optimizer(build_param_groups(*net, options), SGDOptions{});
  optimizer.set_lr(0.1);
  optimizer.step();
  std::map<std::string, bool> decayed;
  for (const auto& item : net->named_parameters()) {
    if (!item.value().requires_grad()) {
      continue;
    }
    const double value = item.value().reshape(-1)[0].item<double>();
    EXPECT_TRUE(value == 0.5 || std::abs(value - 0.5 * (1 - 0.1 * options.weight_decay)) < 1e-7)
        << item.key() << " = " << value;
    decayed[item.key()] = value != 0.5;
  }
  return decayed;
}

TEST(ParamGroups, BiasAndNormGetNoWeightDecayUnlessRegularized) {
  ParamGroupOptions options;
  options.weight_decay = 0.5;
  options.regularize_bn = false;
  options.regularize_bias = false;
  const auto decayed = decayed_by_a_step(options);
  EXPECT_TRUE(decayed.at("trunk.0.weight"));    // conv weight
  EXPECT_FALSE(decayed.at("trunk.0.bias"));     // conv bias
  EXPECT_FALSE(decayed.at("trunk.1.weight"));   // BatchNorm
  EXPECT_FALSE(decayed.at("trunk.1.bias"));
  EXPECT_FALSE(decayed.at("trunk.2.weight"));   // LayerNorm
  EXPECT_FALSE(decayed.at("trunk.3.weight"));   // GroupNorm
  EXPECT_TRUE(decayed.at("trunk.4.linear.weight"));
  EXPECT_FALSE(decayed.at("trunk.4.linear.bias"));
  EXPECT_FALSE(decayed.at("head.0.weight"));    // BatchNorm1d in the head
  EXPECT_TRUE(decayed.at("head.1.weight"));
  EXPECT_FALSE(decayed.at("head.1.bias"));

  options.regularize_bn = true;
  options.regularize_bias = true;
  for (const auto& [name, was_decayed] : decayed_by_a_step(options)) {
    EXPECT_TRUE(was_decayed) << name;
  }
  options.regularize_bn = true;
  options.regularize_bias = false;
  const auto bn_only = decayed_by_a_step(options);
  EXPECT_TRUE(bn_only.at("trunk.1.weight"));
  EXPECT_FALSE(bn_only.at("trunk.1.bias")); // a bias, even in a norm layer
  EXPECT_FALSE(bn_only.at("trunk.0.bias"));
}

TEST(ParamGroups, BiasAndNormNamesForLarc) {
  Net net;
  const Names names = bias_and_norm_parameter_names(*net);
  const Names expected = {
      "trunk.0.bias", "trunk.1.weight", "trunk.1.bias", "trunk.2.weight", "trunk.2.bias",
      "trunk.3.weight", "trunk.3.bias", "trunk.4.linear.bias", "head.0.weight", "head.0.bias",
      "head.1.bias"};
  EXPECT_EQ(names, expected);
}

// VISSL's lars excludes by p.ndim == 1: pos_embed (1-D, neither bias nor norm) too, the frozen
// parameter not (it is not trained), and no weight of more than one dimension.
TEST(ParamGroups, OneDimensionalNamesForLars) {
  Net net;
  Names names = one_dimensional_parameter_names(*net);
  std::sort(names.begin(), names.end());
  const Names expected = {
      "head.0.bias", "head.0.weight", "head.1.bias", "trunk.0.bias", "trunk.1.bias",
      "trunk.1.weight", "trunk.2.bias", "trunk.2.weight", "trunk.3.bias", "trunk.3.weight",
      "trunk.4.linear.bias", "trunk.4.pos_embed"};
  EXPECT_EQ(names, expected);
}

// construct_single_param_group_only: every trained parameter in one decayed group, in the
// module's order, whatever the layer types, the regularize flags and the head prefix say.
TEST(ParamGroups, SingleRuleMakesOneDecayedGroupOfEveryParameter) {
  Net net;
  net->named_parameters()["trunk.0.bias"].set_requires_grad(false); // frozen: left out
  ParamGroupOptions options;
  options.rule = ParamGroupRule::kSingle;
  options.lr = 0.3;
  options.weight_decay = 0.04;
  options.regularize_bias = false; // not read under the single rule
  options.non_regularized_parameters = {"pos_embed"};
  const auto groups = build_param_groups(*net, options);
  ASSERT_EQ(group_names(groups), (Names{"all"}));
  Names expected;
  for (const auto& item : net->named_parameters()) {
    if (item.value().requires_grad()) {
      expected.push_back(item.key());
    }
  }
  EXPECT_EQ(groups[0].names, expected);
  EXPECT_EQ(groups[0].params.size(), expected.size());
  EXPECT_EQ(groups[0].weight_decay, 0.04);
  EXPECT_EQ(groups[0].lr, 0.3);
  EXPECT_EQ(decay_source("all"), DecaySource::kWeightDecay);
}

// VISSL's dino constructor goes by name alone: "*.bias" and names holding "norm" are not
// decayed, everything else is, head included, and the layer types, the regularize flags and
// the head prefix do not matter. Net's norm layers are named by index, so their weights are
// decayed; a module named "norm1" is not.
TEST(ParamGroups, DinoRuleGoesByNameOverTheWholeModel) {
  Net net;
  net->register_module("norm1", nn::LayerNorm(nn::LayerNormOptions({4})));
  ParamGroupOptions options;
  options.rule = ParamGroupRule::kDino;
  options.lr = 0.3;
  options.weight_decay = 0.04;
  options.regularize_bn = true; // not read under the dino rule
  options.non_regularized_parameters = {"pos_embed"};
  const auto groups = build_param_groups(*net, options);
  ASSERT_EQ(group_names(groups), (Names{"decayed", "not_decayed"}));
  EXPECT_EQ(
      groups[0].names,
      (Names{
          "trunk.0.weight",
          "trunk.1.weight",
          "trunk.2.weight",
          "trunk.3.weight",
          "trunk.4.pos_embed",
          "trunk.4.linear.weight",
          "head.0.weight",
          "head.1.weight"}));
  EXPECT_EQ(groups[0].weight_decay, 0.04);
  EXPECT_EQ(
      groups[1].names,
      (Names{
          "trunk.0.bias",
          "trunk.1.bias",
          "trunk.2.bias",
          "trunk.3.bias",
          "trunk.4.linear.bias",
          "head.0.bias",
          "head.1.bias",
          "norm1.weight",
          "norm1.bias"}));
  EXPECT_EQ(groups[1].weight_decay, 0.0);
  for (const ParamGroup& group : groups) {
    EXPECT_EQ(group.lr, 0.3);
  }
  EXPECT_EQ(decay_source("decayed"), DecaySource::kWeightDecay);
  EXPECT_EQ(decay_source("not_decayed"), DecaySource::kNone);
  EXPECT_EQ(decay_source("trunk"), DecaySource::kWeightDecay);
  EXPECT_EQ(decay_source("trunk_no_wd"), DecaySource::kNone);
  EXPECT_EQ(decay_source("head"), DecaySource::kHeadWeightDecay);
  EXPECT_EQ(decay_source("head_no_wd"), DecaySource::kNone);
}

} // namespace
} // namespace largo::optim::param_groups_test
