// make_optimizer: every name, LARC wrapping, and the error for an unknown name; the state
// layout the memory estimate reads, against the built optimizers' state.
#include "optim_test_util.h"

#include <largo/optim/optimizer_factory.h>

namespace largo::optim::optimizer_factory_test {
namespace {

std::vector<ParamGroup> one_group() {
  ParamGroup group;
  group.params = testing::make_params({{3, 4}, {5}});
  group.names = {"w", "b"};
  group.weight_decay = 0.1;
  return {group};
}

TEST(OptimizerFactory, BuildsEveryOptimizerAndWrapsLarc) {
  ASSERT_EQ(optimizer_names().size(), 6U);
  for (const std::string& name : optimizer_names()) {
    OptimizerSpec spec;
    spec.name = name;
    auto plain = make_optimizer(one_group(), spec);
    EXPECT_EQ(plain->type(), name);
    EXPECT_EQ(dynamic_cast<LARC*>(plain.get()), nullptr);
    spec.use_larc = true;
    spec.larc.clip = true;
    auto wrapped = make_optimizer(one_group(), spec);
    auto* larc = dynamic_cast<LARC*>(wrapped.get());
    ASSERT_NE(larc, nullptr) << name;
    EXPECT_EQ(larc->type(), name);
    EXPECT_TRUE(larc->options().clip);
    EXPECT_EQ(larc->inner().type(), name);
    // Groups are the inner optimizer's: set_lr reaches it.
    wrapped->set_lr(0.25);
    EXPECT_EQ(larc->inner().param_groups()[0].lr, 0.25);
  }
  OptimizerSpec spec;
  spec.sgd.momentum = 0.5;
  spec.sgd.nesterov = true;
  auto sgd = make_optimizer(one_group(), spec);
  EXPECT_TRUE(dynamic_cast<SGD&>(*sgd).options().nesterov);
  spec.name = "lars";
  spec.lars.eta = 0.02;
  spec.lars.excluded_from_adaptation = {"b"};
  auto lars = make_optimizer(one_group(), spec);
  EXPECT_EQ(dynamic_cast<LARS&>(*lars).options().eta, 0.02);
  EXPECT_EQ(dynamic_cast<LARS&>(*lars).options().excluded_from_adaptation.count("b"), 1U);
  spec.name = "rmsprop";
  spec.rmsprop.centered = true;
  auto rmsprop = make_optimizer(one_group(), spec);
  EXPECT_TRUE(dynamic_cast<RMSprop&>(*rmsprop).options().centered);
  spec.name = "adam";
  spec.adam.amsgrad = true;
  auto adam = make_optimizer(one_group(), spec);
  EXPECT_TRUE(dynamic_cast<Adam&>(*adam).options().amsgrad);
}

// state_layout says what each optimizer keeps after a step: its tensors shaped like the
// parameter, and whether a 0-dim "step".
TEST(OptimizerFactory, StateLayoutIsWhatTheOptimizerKeeps) {
  std::vector<OptimizerSpec> specs(9);
  const char* names[] = {
      "sgd", "sgd", "adam", "adamw", "rmsprop", "rmsprop", "rmsprop", "lamb", "lars"};
  for (size_t i = 0; i < specs.size(); ++i) {
    specs[i].name = names[i];
  }
  specs[0].sgd.momentum = 0.9;
  specs[2].adam.amsgrad = true;
  specs[5].rmsprop.momentum = 0.9;
  specs[6].rmsprop.momentum = 0.9;
  specs[6].rmsprop.centered = true;
  for (const OptimizerSpec& spec : specs) {
    std::vector<ParamGroup> groups = one_group();
    auto optimizer = make_optimizer(groups, spec);
    for (at::Tensor& p : groups[0].params) {
      p.mutable_grad() = torch::ones_like(p);
    }
    optimizer->step();
    const ParamState* state = optimizer->find_state("w"); // none for SGD without momentum
    int64_t shaped = 0;
    bool step = false;
    for (const auto& [key, tensor] : state != nullptr ? *state : ParamState{}) {
      shaped += tensor.dim() > 0 ? 1 : 0;
      step = step || key == "step";
    }
    const OptimizerStateLayout layout = state_layout(spec);
    EXPECT_EQ(layout.tensors_per_parameter, shaped) << describe(spec);
    EXPECT_EQ(layout.step_scalar, step) << describe(spec);
  }
}

TEST(OptimizerFactory, UnknownNameIsAConfigError) {
  OptimizerSpec spec;
  spec.name = "adagrad";
  testing::expect_config_error(
      [&] { (void)make_optimizer(one_group(), spec); },
      {"OptimizerSpec::name", "adagrad", "sgd, adam, adamw, rmsprop, lamb, lars"});
}

// The start-up log's line: the optimizer, its settings and whether LARC wraps it.
TEST(OptimizerFactory, DescribeSaysWhatIsBuilt) {
  OptimizerSpec spec;
  spec.sgd.momentum = 0.9;
  spec.sgd.nesterov = true;
  EXPECT_EQ(describe(spec), "SGD (momentum 0.9, dampening 0, nesterov true); LARC off");
  spec.name = "adamw";
  spec.adamw.betas = {0.8, 0.99};
  spec.use_larc = true;
  spec.larc.clip = true;
  spec.larc.excluded_from_adaptation = {"head.bias", "bn.weight"};
  EXPECT_EQ(
      describe(spec),
      "AdamW (betas 0.8/0.99, eps 1e-08, amsgrad false); LARC on (trust_coefficient 0.001, "
      "clip true, eps 1e-08, 2 parameters not adapted)");
  spec.name = "lamb";
  spec.use_larc = false;
  EXPECT_EQ(describe(spec), "LAMB (betas 0.9/0.999, eps 1e-06); LARC off");
  spec.name = "lars";
  spec.lars.excluded_from_adaptation = {"head.bias"};
  EXPECT_EQ(describe(spec), "LARS (momentum 0.9, eta 0.001, 1 parameters not adapted); LARC off");
  spec.name = "adam";
  EXPECT_EQ(describe(spec), "Adam (betas 0.9/0.999, eps 1e-08, amsgrad false); LARC off");
  spec.name = "rmsprop";
  spec.rmsprop.momentum = 0.9;
  EXPECT_EQ(
      describe(spec), "RMSprop (alpha 0.99, eps 1e-08, momentum 0.9, centered false); LARC off");
}

} // namespace
} // namespace largo::optim::optimizer_factory_test
