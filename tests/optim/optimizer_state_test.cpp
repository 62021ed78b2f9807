// Optimizer state: save → load → continue equals an uninterrupted run bit for bit; the
// saved dict is readable by Python's torch.load; mismatches are refused by name; options
// are validated with the config key and value in the message.
#include "optim_test_util.h"
#include "test_paths.h"

#include <largo/core/channels_last.h>
#include <largo/core/error.h>
#include <largo/optim/adam.h>
#include <largo/optim/adamw.h>
#include <largo/optim/lamb.h>
#include <largo/optim/larc.h>
#include <largo/optim/lars.h>
#include <largo/optim/rmsprop.h>
#include <largo/optim/sgd.h>

#include <fmt/format.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>

namespace largo::optim::optimizer_state_test {
namespace {

using testing::make_params;
using testing::set_grads;
using testing::expect_config_error;

const std::vector<std::vector<int64_t>> kShapes = {{3, 4}, {5}};

std::vector<ParamGroup> two_groups(const std::vector<at::Tensor>& params) {
  ParamGroup decayed;
  decayed.name = "trunk";
  decayed.params = {params[0]};
  decayed.names = {"trunk.weight"};
  decayed.lr = 0.05;
  decayed.weight_decay = 0.01;
  ParamGroup plain;
  plain.name = "trunk_no_wd";
  plain.params = {params[1]};
  plain.names = {"trunk.bias"};
  plain.lr = 0.05;
  return {decayed, plain};
}

using OptimizerFactory = std::function<std::unique_ptr<Optimizer>(std::vector<ParamGroup>)>;

std::unique_ptr<Optimizer> make_sgd(std::vector<ParamGroup> groups) {
  return std::make_unique<SGD>(std::move(groups), SGDOptions{0.9, 0.0, true});
}

std::unique_ptr<Optimizer> make_adamw(std::vector<ParamGroup> groups) {
  AdamWOptions options;
  options.amsgrad = true;
  return std::make_unique<AdamW>(std::move(groups), options);
}

std::unique_ptr<Optimizer> make_adam(std::vector<ParamGroup> groups) {
  AdamOptions options;
  options.amsgrad = true;
  return std::make_unique<Adam>(std::move(groups), options);
}

std::unique_ptr<Optimizer> make_rmsprop(std::vector<ParamGroup> groups) {
  RMSpropOptions options;
  options.momentum = 0.9;
  options.centered = true;
  return std::make_unique<RMSprop>(std::move(groups), options);
}

// The _foreach path (what a CUDA parameter takes).
std::unique_ptr<Optimizer> make_rmsprop_foreach(std::vector<ParamGroup> groups) {
  RMSpropOptions options;
  options.momentum = 0.9;
  options.centered = true;
  options.fused = false;
  return std::make_unique<RMSprop>(std::move(groups), options);
}

std::unique_ptr<Optimizer> make_lamb(std::vector<ParamGroup> groups) {
  return std::make_unique<LAMB>(std::move(groups));
}

// The bias ("trunk.bias", 1-D) excluded as exclude_bias_and_norm would.
std::unique_ptr<Optimizer> make_lars(std::vector<ParamGroup> groups) {
  LARSOptions options;
  options.eta = 0.02;
  options.excluded_from_adaptation = {"trunk.bias"};
  return std::make_unique<LARS>(std::move(groups), options);
}

std::unique_ptr<Optimizer> make_larc_sgd(std::vector<ParamGroup> groups) {
  LARCOptions larc;
  larc.trust_coefficient = 0.02;
  larc.clip = true;
  return std::make_unique<LARC>(make_sgd(std::move(groups)), larc);
}

std::unique_ptr<Optimizer> make_larc_lamb(std::vector<ParamGroup> groups) {
  return std::make_unique<LARC>(make_lamb(std::move(groups)));
}

void run_steps(
    Optimizer& optimizer, std::vector<at::Tensor>& params, int64_t first_step, int64_t num_steps) {
  for (int64_t step = first_step; step < first_step + num_steps; ++step) {
    optimizer.set_lr(0.05 * (1.0 - 0.01 * static_cast<double>(step)));
    set_grads(params, step);
    optimizer.step();
  }
}

std::vector<at::Tensor> clone_params(const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> copies;
  for (const at::Tensor& p : params) {
    copies.push_back(p.detach().clone().requires_grad_());
  }
  return copies;
}

void expect_resume_is_bit_exact(const OptimizerFactory& factory) {
  // Uninterrupted: 20 steps.
  std::vector<at::Tensor> reference = make_params(kShapes);
  auto reference_optimizer = factory(two_groups(reference));
  run_steps(*reference_optimizer, reference, 1, 20);

  // 10 steps, save to bytes, load into a fresh optimizer over copied params, 10 more.
  std::vector<at::Tensor> first = make_params(kShapes);
  auto first_optimizer = factory(two_groups(first));
  run_steps(*first_optimizer, first, 1, 10);
  const std::vector<char> bytes = torch::pickle_save(first_optimizer->state_dict());
  std::vector<at::Tensor> resumed = clone_params(first);
  auto resumed_optimizer = factory(two_groups(resumed));
  resumed_optimizer->load_state_dict(torch::pickle_load(bytes));
  // Keep training the first optimizer: the loaded state must not alias its tensors.
  run_steps(*first_optimizer, first, 11, 3);
  run_steps(*resumed_optimizer, resumed, 11, 10);

  for (size_t k = 0; k < reference.size(); ++k) {
    EXPECT_TRUE(torch::equal(resumed[k], reference[k])) << "param " << k << " differs";
  }
  for (const std::string name : {"trunk.weight", "trunk.bias"}) {
    const ParamState* expected = reference_optimizer->find_state(name);
    const ParamState* actual = resumed_optimizer->find_state(name);
    ASSERT_NE(expected, nullptr);
    ASSERT_NE(actual, nullptr);
    ASSERT_EQ(actual->size(), expected->size());
    for (const auto& [key, tensor] : *expected) {
      ASSERT_EQ(actual->count(key), 1U) << key;
      EXPECT_TRUE(torch::equal(actual->at(key), tensor)) << name << "." << key;
      EXPECT_EQ(actual->at(key).scalar_type(), tensor.scalar_type()) << name << "." << key;
    }
  }
}

TEST(OptimizerState, SgdResumeIsBitExact) {
  expect_resume_is_bit_exact(make_sgd);
}

TEST(OptimizerState, AdamWResumeIsBitExact) {
  expect_resume_is_bit_exact(make_adamw);
}

TEST(OptimizerState, AdamResumeIsBitExact) {
  expect_resume_is_bit_exact(make_adam);
}

TEST(OptimizerState, RmspropResumeIsBitExact) {
  expect_resume_is_bit_exact(make_rmsprop);
  expect_resume_is_bit_exact(make_rmsprop_foreach);
}

TEST(OptimizerState, LambResumeIsBitExact) {
  expect_resume_is_bit_exact(make_lamb);
}

TEST(OptimizerState, LarsResumeIsBitExact) {
  expect_resume_is_bit_exact(make_lars);
}

TEST(OptimizerState, LarcSgdResumeIsBitExact) {
  expect_resume_is_bit_exact(make_larc_sgd);
}

TEST(OptimizerState, LarcLambResumeIsBitExact) {
  expect_resume_is_bit_exact(make_larc_lamb);
}

// LARC keeps no state of its own: its state_dict is the inner optimizer's plus its
// settings, so checkpoints move between runs with and without LARC (as with Apex).
TEST(OptimizerState, LarcStateDictIsTheInnerOnesPlusSettings) {
  std::vector<at::Tensor> params = make_params(kShapes);
  auto larc = make_larc_sgd(two_groups(params));
  run_steps(*larc, params, 1, 3);
  const c10::IValue saved = torch::pickle_load(torch::pickle_save(larc->state_dict()));
  const auto root = saved.toGenericDict();
  EXPECT_EQ(root.at("type").toStringRef(), "sgd");
  const auto settings = root.at("larc").toGenericDict();
  EXPECT_EQ(settings.at("trust_coefficient").toDouble(), 0.02);
  EXPECT_TRUE(settings.at("clip").toBool());
  EXPECT_EQ(settings.at("eps").toDouble(), 1e-8);
  EXPECT_TRUE(torch::equal(
      root.at("state").toGenericDict().at("trunk.weight").toGenericDict().at("momentum_buffer").toTensor(),
      larc->find_state("trunk.weight")->at("momentum_buffer")));
  // Weight decay is zeroed for the inner step only.
  EXPECT_EQ(larc->param_groups()[0].weight_decay, 0.01);

  // A LARC checkpoint loads into plain SGD, and a plain SGD checkpoint into LARC.
  std::vector<at::Tensor> copy = clone_params(params);
  auto plain = make_sgd(two_groups(copy));
  plain->load_state_dict(saved);
  EXPECT_TRUE(torch::equal(
      plain->find_state("trunk.weight")->at("momentum_buffer"),
      larc->find_state("trunk.weight")->at("momentum_buffer")));
  auto larc_again = make_larc_sgd(two_groups(clone_params(params)));
  larc_again->load_state_dict(plain->state_dict());
  EXPECT_NE(larc_again->find_state("trunk.bias"), nullptr);
  EXPECT_GT(larc_again->state_bytes(), 0);
  EXPECT_EQ(larc_again->state_bytes(), larc->state_bytes());
  // But not into another optimizer type.
  auto lamb = make_larc_lamb(two_groups(clone_params(params)));
  EXPECT_THROW(lamb->load_state_dict(saved), CheckpointError);
}

TEST(OptimizerState, LayoutAndLoadedGroupSettings) {
  std::vector<at::Tensor> params = make_params(kShapes);
  AdamW optimizer(two_groups(params));
  run_steps(optimizer, params, 1, 3);
  const c10::IValue saved = torch::pickle_load(torch::pickle_save(optimizer.state_dict()));
  ASSERT_TRUE(saved.isGenericDict());
  const auto root = saved.toGenericDict();
  EXPECT_EQ(root.at("type").toStringRef(), "adamw");
  const auto state = root.at("state").toGenericDict();
  const auto weight_state = state.at("trunk.weight").toGenericDict();
  EXPECT_EQ(weight_state.at("step").toTensor().item<float>(), 3.0F);
  EXPECT_EQ(weight_state.at("exp_avg").toTensor().sizes(), params[0].sizes());
  EXPECT_EQ(weight_state.find("max_exp_avg_sq"), weight_state.end()); // amsgrad off
  const auto groups = root.at("param_groups").toList();
  ASSERT_EQ(groups.size(), 2U);
  const auto group0 = groups.get(0).toGenericDict();
  EXPECT_EQ(group0.at("name").toStringRef(), "trunk");
  EXPECT_DOUBLE_EQ(group0.at("weight_decay").toDouble(), 0.01);
  EXPECT_DOUBLE_EQ(group0.at("eps").toDouble(), 1e-8);
  EXPECT_EQ(group0.at("params").toListRef().at(0).toStringRef(), "trunk.weight");

  // Loading restores each group's lr and weight_decay, as torch.optim does.
  std::vector<at::Tensor> fresh = clone_params(params);
  auto groups_changed = two_groups(fresh);
  groups_changed[0].lr = 1.0;
  groups_changed[0].weight_decay = 0.5;
  AdamW loaded(groups_changed);
  loaded.load_state_dict(saved);
  EXPECT_DOUBLE_EQ(loaded.param_groups()[0].lr, optimizer.param_groups()[0].lr);
  EXPECT_DOUBLE_EQ(loaded.param_groups()[0].weight_decay, 0.01);
}

// The warnings spdlog's default logger prints while `body` runs.
std::string warnings_during(const std::function<void()>& body) {
  std::ostringstream captured;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(captured);
  auto logger = spdlog::default_logger();
  logger->sinks().push_back(sink);
  body();
  logger->sinks().pop_back();
  return captured.str();
}

// A checkpoint written with other hyperparameters than the optimizer's is loaded with the
// optimizer's, saying so; the same ones (AdamW's betas list included) say nothing.
TEST(OptimizerState, ADifferentHyperparameterIsNamedAndTheSameIsNot) {
  std::vector<at::Tensor> params = make_params(kShapes);
  AdamW optimizer(two_groups(params));
  run_steps(optimizer, params, 1, 2);
  const c10::IValue saved = torch::pickle_load(torch::pickle_save(optimizer.state_dict()));
  AdamW same(two_groups(clone_params(params)));
  EXPECT_EQ(warnings_during([&] { same.load_state_dict(saved); }), "");
  AdamWOptions other_betas;
  other_betas.betas = {0.8, 0.999};
  AdamW other(two_groups(clone_params(params)), other_betas);
  const std::string warnings = warnings_during([&] { other.load_state_dict(saved); });
  EXPECT_NE(
      warnings.find("betas = [0.9, 0.999] but this optimizer uses [0.8, 0.999]"), std::string::npos)
      << warnings;
}

// Writes `script` to `path` and runs it with LARGO_PYTHON: its exit status (77: no torch
// there; -1: it could not be started).
int run_python(const std::filesystem::path& path, const std::string& script) {
  std::ofstream(path) << script;
  const int status = std::system((std::string(LARGO_PYTHON) + " " + path.string()).c_str());
  return status == -1 ? -1 : WEXITSTATUS(status);
}

// The dict must be a plain one that PyTorch reads with torch.load. (Written here with
// torch::pickle_save, whose TorchScript type tags torch.load's default weights_only mode
// refuses; Largo's checkpoint files leave them out, and the checkpoint suites load those in
// the default mode.)
TEST(OptimizerState, PythonTorchLoadReadsStateDict) {
  if (!std::filesystem::exists(LARGO_PYTHON)) {
    GTEST_SKIP() << "no Python with torch (LARGO_PYTHON)";
  }
  std::vector<at::Tensor> params = make_params(kShapes);
  SGD optimizer(two_groups(params), SGDOptions{0.9});
  run_steps(optimizer, params, 1, 2);
  const auto dir = std::filesystem::path(largo::test_paths::binary_dir()) / "optim_test_output";
  std::filesystem::create_directories(dir);
  const auto path = dir / "sgd_state.pt";
  {
    const std::vector<char> bytes = torch::pickle_save(optimizer.state_dict());
    std::ofstream out(path, std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  const double expected_first =
      optimizer.find_state("trunk.weight")->at("momentum_buffer").reshape(-1)[0].item<double>();
  const std::string script = fmt::format(
      "import sys\n"
      "try:\n import torch\nexcept ImportError:\n sys.exit(77)\n"
      "d = torch.load('{}', weights_only=False)\n"
      "assert d['type'] == 'sgd', d['type']\n"
      "assert [g['name'] for g in d['param_groups']] == ['trunk', 'trunk_no_wd']\n"
      "assert d['param_groups'][0]['params'] == ['trunk.weight']\n"
      "assert d['param_groups'][0]['momentum'] == 0.9\n"
      "assert d['param_groups'][0]['nesterov'] is False\n"
      "buf = d['state']['trunk.weight']['momentum_buffer']\n"
      "assert buf.shape == (3, 4) and buf.dtype == torch.float64\n"
      "assert buf.reshape(-1)[0].item() == float('{:.17g}'), buf.reshape(-1)[0].item()\n",
      path.string(),
      expected_first);
  const auto script_path = dir / "read_sgd_state.py";
  const int status = run_python(script_path, script);
  if (status == 77) {
    GTEST_SKIP() << LARGO_PYTHON " has no torch";
  }
  EXPECT_EQ(status, 0) << "torch.load could not read the state dict; see " << script_path;
}

// Largo's Adam and RMSprop state_dict() is torch.optim's format: torch.optim.Adam /
// RMSprop's load_state_dict takes it (the "step" tensors, the state and the groups'
// hyperparameters by torch's names), and PyTorch's next step from it is Largo's, to the
// float64 rounding of two implementations (1e-12 relative, as in optimizer_baseline_test).
void expect_torch_optim_continues(const std::string& torch_class, const OptimizerFactory& factory) {
  std::vector<at::Tensor> params = make_params(kShapes);
  auto optimizer = factory(two_groups(params));
  run_steps(*optimizer, params, 1, 3);
  c10::impl::GenericDict file(c10::StringType::get(), c10::AnyType::get());
  // A copy: state_dict()'s tensors are the optimizer's, which the next step changes.
  file.insert("optimizer", torch::pickle_load(torch::pickle_save(optimizer->state_dict())));
  file.insert(
      "params", c10::List<at::Tensor>({params[0].detach().clone(), params[1].detach().clone()}));
  run_steps(*optimizer, params, 4, 1); // the step PyTorch takes too
  file.insert("grads", c10::List<at::Tensor>({params[0].grad(), params[1].grad()}));
  file.insert("lr", optimizer->param_groups()[0].lr);
  file.insert("expected", c10::List<at::Tensor>({params[0].detach(), params[1].detach()}));
  const auto dir = std::filesystem::path(largo::test_paths::binary_dir()) / "optim_test_output";
  std::filesystem::create_directories(dir);
  const auto path = dir / (torch_class + "_state.pt");
  {
    const std::vector<char> bytes = torch::pickle_save(c10::IValue(file));
    std::ofstream out(path, std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  const std::string script = fmt::format(
      "import sys\n"
      "try:\n import torch\nexcept ImportError:\n sys.exit(77)\n"
      "d = torch.load('{0}', weights_only=False)\n"
      "params = [p.clone().requires_grad_() for p in d['params']]\n"
      "opt = torch.optim.{1}([{{'params': [params[0]]}}, {{'params': [params[1]]}}])\n"
      "opt.load_state_dict(d['optimizer'])\n"
      "for group in opt.param_groups:\n"
      " group['lr'] = d['lr']\n"
      "for p, g in zip(params, d['grads']):\n"
      " p.grad = g.clone()\n"
      "opt.step()\n"
      "for p, want in zip(params, d['expected']):\n"
      " err = ((p.detach() - want).abs() / want.abs().clamp(min=1)).max().item()\n"
      " assert err <= 1e-12, f'torch.optim.{1} differs from Largo by {{err}}'\n"
      "assert float(opt.state[params[0]]['step']) == 4.0\n",
      path.string(),
      torch_class);
  const auto script_path = dir / ("continue_" + torch_class + ".py");
  const int status = run_python(script_path, script);
  if (status == 77) {
    GTEST_SKIP() << LARGO_PYTHON " has no torch";
  }
  EXPECT_EQ(status, 0) << "torch.optim." << torch_class
                       << " did not continue from Largo's state; see " << script_path;
}

TEST(OptimizerState, TorchOptimContinuesFromAdamAndRmspropState) {
  if (!std::filesystem::exists(LARGO_PYTHON)) {
    GTEST_SKIP() << "no Python with torch (LARGO_PYTHON)";
  }
  expect_torch_optim_continues("Adam", make_adam);
  expect_torch_optim_continues("RMSprop", make_rmsprop);
}

// Runs fn, expects a CheckpointError whose message contains every one of `parts`.
template <typename Fn>
void expect_checkpoint_error(Fn&& fn, const std::vector<std::string>& parts) {
  try {
    fn();
    ADD_FAILURE() << "expected a CheckpointError";
  } catch (const CheckpointError& error) {
    for (const std::string& part : parts) {
      EXPECT_NE(std::string(error.what()).find(part), std::string::npos)
          << "'" << part << "' not in: " << error.what();
    }
  }
}

c10::IValue trained_sgd_state() {
  std::vector<at::Tensor> params = make_params(kShapes);
  SGD optimizer(two_groups(params), SGDOptions{0.9});
  run_steps(optimizer, params, 1, 2);
  return torch::pickle_load(torch::pickle_save(optimizer.state_dict()));
}

TEST(OptimizerState, LoadRejectsWrongType) {
  std::vector<at::Tensor> params = make_params(kShapes);
  AdamW adamw(two_groups(params));
  expect_checkpoint_error(
      [&] { adamw.load_state_dict(trained_sgd_state()); }, {"'sgd'", "'adamw'"});
  expect_checkpoint_error([&] { adamw.load_state_dict(c10::IValue(3.0)); }, {"dict"});
}

TEST(OptimizerState, LoadRejectsMissingAndUnexpectedParameters) {
  std::vector<at::Tensor> params = make_params({{3, 4}, {5}, {2}});
  auto groups = two_groups(params);
  groups[1].params.push_back(params[2]);
  groups[1].names.push_back("trunk.extra");
  SGD with_extra(groups, SGDOptions{0.9});
  expect_checkpoint_error(
      [&] { with_extra.load_state_dict(trained_sgd_state()); }, {"trunk.extra", "missing"});

  groups = two_groups(params);
  groups[1].names = {"trunk.renamed"};
  SGD renamed(groups, SGDOptions{0.9});
  expect_checkpoint_error([&] { renamed.load_state_dict(trained_sgd_state()); }, {"trunk.renamed"});

  groups = two_groups(params);
  groups.pop_back();
  SGD one_group(groups, SGDOptions{0.9});
  expect_checkpoint_error(
      [&] { one_group.load_state_dict(trained_sgd_state()); }, {"2 parameter groups", "has 1"});
}

TEST(OptimizerState, LoadRejectsShapeMismatchAndChangesNothing) {
  std::vector<at::Tensor> params = make_params({{3, 4}, {6}});
  SGD optimizer(two_groups(params), SGDOptions{0.9});
  run_steps(optimizer, params, 1, 1);
  const at::Tensor before = optimizer.find_state("trunk.bias")->at("momentum_buffer").clone();
  const double lr_before = optimizer.param_groups()[0].lr;
  expect_checkpoint_error(
      [&] { optimizer.load_state_dict(trained_sgd_state()); },
      {"trunk.bias", "momentum_buffer", "[5]", "[6]"});
  EXPECT_TRUE(torch::equal(optimizer.find_state("trunk.bias")->at("momentum_buffer"), before));
  EXPECT_EQ(optimizer.param_groups()[0].lr, lr_before);
}

// A channels-last weight's momentum (zeros_like keeps the weight's strides) is saved in the
// standard layout and loaded in the layout of the parameter it steps, so a checkpoint moves
// between channels-last and contiguous runs; SGD's update is elementwise, so both continue
// with the same values bit for bit.
TEST(OptimizerState, ChannelsLastStateIsSavedContiguousAndLoadsInTheParametersLayout) {
  std::vector<at::Tensor> nhwc = make_params({{4, 3, 2, 2}, {5}});
  nhwc[0].set_data(to_channels_last(nhwc[0].detach()));
  SGD trained(two_groups(nhwc), SGDOptions{0.9});
  run_steps(trained, nhwc, 0, 2);
  ASSERT_TRUE(has_channels_last_strides(trained.find_state("trunk.weight")->at("momentum_buffer")));
  const c10::IValue saved = trained.state_dict();
  const at::Tensor saved_momentum = saved.toGenericDict()
                                        .at("state")
                                        .toGenericDict()
                                        .at("trunk.weight")
                                        .toGenericDict()
                                        .at("momentum_buffer")
                                        .toTensor();
  EXPECT_EQ(
      saved_momentum.strides(), at::IntArrayRef(c10::contiguous_strides(saved_momentum.sizes())));

  std::vector<at::Tensor> nchw = clone_params(nhwc);
  nchw[0].set_data(nchw[0].detach().contiguous());
  SGD contiguous(two_groups(nchw), SGDOptions{0.9});
  contiguous.load_state_dict(saved);
  EXPECT_TRUE(contiguous.find_state("trunk.weight")->at("momentum_buffer").is_contiguous());
  std::vector<at::Tensor> resumed = clone_params(nhwc);
  resumed[0].set_data(to_channels_last(resumed[0].detach()));
  SGD channels_last(two_groups(resumed), SGDOptions{0.9});
  channels_last.load_state_dict(saved);
  EXPECT_TRUE(
      has_channels_last_strides(channels_last.find_state("trunk.weight")->at("momentum_buffer")));
  run_steps(contiguous, nchw, 2, 2);
  run_steps(channels_last, resumed, 2, 2);
  run_steps(trained, nhwc, 2, 2);
  for (size_t k = 0; k < nhwc.size(); ++k) {
    EXPECT_TRUE(torch::equal(resumed[k], nhwc[k])) << k;
    EXPECT_TRUE(torch::equal(nchw[k], nhwc[k])) << k;
  }
}

TEST(OptimizerValidation, SgdOptions) {
  std::vector<at::Tensor> params = make_params(kShapes);
  expect_config_error(
      [&] { (void)SGD(two_groups(params), SGDOptions{-0.5}); }, {"SGDOptions::momentum", "-0.5"});
  expect_config_error(
      [&] {
        (void)SGD(two_groups(params), SGDOptions{0.0, 0.0, true});
      },
      {"SGDOptions::nesterov", "momentum = 0"});
  expect_config_error(
      [&] {
        (void)SGD(two_groups(params), SGDOptions{0.9, 0.1, true});
      },
      {"SGDOptions::nesterov", "dampening = 0.1"});
  auto groups = two_groups(params);
  groups[1].lr = -1.0;
  expect_config_error(
      [&] { (void)SGD(groups, SGDOptions{}); }, {"ParamGroup::lr", "-1", "trunk_no_wd"});
  groups = two_groups(params);
  groups[0].weight_decay = -0.25;
  expect_config_error(
      [&] { (void)SGD(groups, SGDOptions{}); }, {"ParamGroup::weight_decay", "-0.25"});
  SGD valid(two_groups(params), SGDOptions{0.9, 0.0, true});
  expect_config_error([&] { valid.set_lr(-0.5); }, {"ParamGroup::lr", "-0.5"});
}

TEST(OptimizerValidation, AdamWOptions) {
  std::vector<at::Tensor> params = make_params(kShapes);
  AdamWOptions bad_beta;
  bad_beta.betas = {0.9, 1.0};
  expect_config_error(
      [&] { (void)AdamW(two_groups(params), bad_beta); }, {"AdamWOptions::betas[1]", "1"});
  AdamWOptions bad_eps;
  bad_eps.eps = -1e-8;
  expect_config_error(
      [&] { (void)AdamW(two_groups(params), bad_eps); }, {"AdamWOptions::eps", "-1e-08"});
}

TEST(OptimizerValidation, AdamAndRmspropOptions) {
  std::vector<at::Tensor> params = make_params(kShapes);
  AdamOptions bad_beta;
  bad_beta.betas = {-0.1, 0.999};
  expect_config_error(
      [&] { (void)Adam(two_groups(params), bad_beta); }, {"AdamOptions::betas[0]", "-0.1"});
  // ClassyVision's RMSProp rules: alpha and momentum in [0, 1), eps > 0.
  RMSpropOptions bad_alpha;
  bad_alpha.alpha = 1.0;
  expect_config_error(
      [&] { (void)RMSprop(two_groups(params), bad_alpha); },
      {"RMSpropOptions::alpha", "1", "[0, 1)"});
  RMSpropOptions bad_momentum;
  bad_momentum.momentum = -0.5;
  expect_config_error(
      [&] { (void)RMSprop(two_groups(params), bad_momentum); },
      {"RMSpropOptions::momentum", "-0.5", "[0, 1)"});
  RMSpropOptions bad_eps;
  bad_eps.eps = 0.0;
  expect_config_error(
      [&] { (void)RMSprop(two_groups(params), bad_eps); }, {"RMSpropOptions::eps", "0", "> 0"});
}

TEST(OptimizerValidation, LambAndLarcOptions) {
  std::vector<at::Tensor> params = make_params(kShapes);
  LAMBOptions bad_beta;
  bad_beta.betas = {1.5, 0.9};
  expect_config_error(
      [&] { (void)LAMB(two_groups(params), bad_beta); }, {"LAMBOptions::betas[0]", "1.5"});
  LARCOptions bad_trust;
  bad_trust.trust_coefficient = 0.0;
  expect_config_error(
      [&] { (void)LARC(make_sgd(two_groups(params)), bad_trust); },
      {"LARCOptions::trust_coefficient", "0"});
  LARCOptions bad_eps;
  bad_eps.eps = -1.0;
  expect_config_error(
      [&] { (void)LARC(make_sgd(two_groups(params)), bad_eps); }, {"LARCOptions::eps", "-1"});
  EXPECT_THROW((void)LARC(nullptr), Error);
}

// VISSL asserts momentum in [0, 1) for lars; eta must be a positive number.
TEST(OptimizerValidation, LarsOptions) {
  std::vector<at::Tensor> params = make_params(kShapes);
  for (double momentum : {1.0, -0.1}) {
    LARSOptions bad_momentum;
    bad_momentum.momentum = momentum;
    expect_config_error(
        [&] { (void)LARS(two_groups(params), bad_momentum); },
        {"LARSOptions::momentum", fmt::format("{}", momentum), "[0, 1)"});
  }
  LARSOptions bad_eta;
  bad_eta.eta = 0.0;
  expect_config_error([&] { (void)LARS(two_groups(params), bad_eta); }, {"LARSOptions::eta", "0"});
  LARSOptions zero_momentum;
  zero_momentum.momentum = 0.0;
  EXPECT_NO_THROW((void)LARS(two_groups(params), zero_momentum));
}

TEST(OptimizerValidation, ParameterNames) {
  std::vector<at::Tensor> params = make_params(kShapes);
  auto groups = two_groups(params);
  groups[1].names = {"trunk.weight"};
  expect_config_error([&] { (void)SGD(groups, SGDOptions{}); }, {"trunk.weight", "twice"});
  groups = two_groups(params);
  groups[0].names.push_back("extra");
  expect_config_error([&] { (void)SGD(groups, SGDOptions{}); }, {"1 parameters but 2 names"});
  // Without names, names are made up from the group name.
  groups = two_groups(params);
  groups[0].names.clear();
  SGD named(groups, SGDOptions{});
  EXPECT_EQ(named.param_groups()[0].names, std::vector<std::string>{"trunk.0"});
}

TEST(Optimizer, ZeroGradSetLrAndSkippedParameters) {
  std::vector<at::Tensor> params = make_params(kShapes);
  SGD optimizer(two_groups(params), SGDOptions{0.9});
  set_grads(params, 1);
  params[1].mutable_grad().reset(); // no gradient: no update, no state
  const at::Tensor bias_before = params[1].detach().clone();
  optimizer.set_lr(0.2);
  EXPECT_EQ(optimizer.param_groups()[0].lr, 0.2);
  EXPECT_EQ(optimizer.param_groups()[1].lr, 0.2);
  optimizer.step();
  EXPECT_TRUE(torch::equal(params[1], bias_before));
  EXPECT_EQ(optimizer.find_state("trunk.bias"), nullptr);
  ASSERT_NE(optimizer.find_state("trunk.weight"), nullptr);
  EXPECT_EQ(optimizer.state_bytes(), 12 * 8);

  optimizer.zero_grad(/*set_to_none=*/false);
  ASSERT_TRUE(params[0].grad().defined());
  EXPECT_EQ(params[0].grad().abs().sum().item<double>(), 0.0);
  optimizer.zero_grad();
  EXPECT_FALSE(params[0].grad().defined());
}

} // namespace
} // namespace largo::optim::optimizer_state_test
