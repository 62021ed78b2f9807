// VISSL's swav_head against a transcription of its code (tests/reference/
// gen_swav_head_baselines.py): the same parameter names, the same outputs of a training-mode
// forward (BatchNorm's batch statistics and running averages included) and the same
// prototypes after VISSL's normalisation, in float64.
#include <largo/core/error.h>
#include <largo/models/swav_head.h>

#include "models/model_test_util.h"

#include <set>

namespace largo::models::swav_head_test {
namespace {

using testing::baseline_case;
using testing::json_matrix;

constexpr const char* kFile = "swav_head_baselines.json";
constexpr const char* kGenerator = "gen_swav_head_baselines.py";

SwavHeadOptions options_from(const nlohmann::json& args) {
  SwavHeadOptions options;
  options.dims = args.at("dims").get<std::vector<int64_t>>();
  options.use_bn = args.at("use_bn").get<bool>();
  options.num_clusters = args.at("num_clusters").get<std::vector<int64_t>>();
  options.use_bias = args.value("use_bias", true);
  options.return_embeddings = args.value("return_embeddings", true);
  options.skip_last_bn = args.value("skip_last_bn", true);
  options.normalize_feats = args.value("normalize_feats", true);
  options.activation = args.value("activation_name", std::string("ReLU"));
  options.batchnorm_eps = args.value("eps", 1e-5);
  options.batchnorm_momentum = args.value("momentum", 0.1);
  return options;
}

// Every tensor of `named` (parameters or buffers) takes its flat values from `values`.
void load_values(
    const torch::OrderedDict<std::string, at::Tensor>& named, const nlohmann::json& values) {
  torch::NoGradGuard no_grad;
  for (const auto& item : named) {
    if (item.key().find("num_batches_tracked") != std::string::npos) {
      continue;
    }
    const auto flat = values.at(item.key()).get<std::vector<double>>();
    item.value().copy_(torch::tensor(flat, torch::kFloat64).reshape(item.value().sizes()));
  }
}

// Float64 throughout: a value is a chain of dot products of at most 12 terms, BatchNorm over
// 6 samples and an L2 normalisation, each a few ulps (2.2e-16) relative; 1e-12 of the values'
// scale leaves two orders of magnitude for summation order and the libm.
void expect_close(const at::Tensor& actual, const at::Tensor& expected, const std::string& what) {
  ASSERT_EQ(actual.sizes(), expected.sizes()) << what;
  const double scale = 1.0 + expected.abs().max().item<double>();
  EXPECT_LE((actual - expected).abs().max().item<double>(), 1e-12 * scale) << what;
}

at::Tensor flat_values(const nlohmann::json& values, const at::Tensor& like) {
  return torch::tensor(values.get<std::vector<double>>(), torch::kFloat64).reshape(like.sizes());
}

void check_case(const std::string& name) {
  const nlohmann::json entry = baseline_case(kFile, kGenerator, name);
  ASSERT_FALSE(entry.is_null());
  SwavHead head(options_from(entry.at("args")));
  head->to(torch::kFloat64);
  std::set<std::string> names;
  for (const auto& item : head->named_parameters()) {
    names.insert(item.key());
  }
  std::set<std::string> expected_names;
  for (const auto& item : entry.at("parameters").items()) {
    expected_names.insert(item.key());
  }
  EXPECT_EQ(names, expected_names) << "VISSL's parameter names";
  load_values(head->named_parameters(), entry.at("parameters"));
  load_values(head->named_buffers(), entry.at("buffers"));

  head->train();
  const std::vector<at::Tensor> outputs = head->forward(json_matrix(entry.at("features")));
  const auto& expected = entry.at("outputs");
  ASSERT_EQ(outputs.size(), expected.size());
  for (size_t i = 0; i < outputs.size(); ++i) {
    expect_close(outputs[i], json_matrix(expected[i]), name + " output " + std::to_string(i));
  }
  for (const auto& item : head->named_buffers()) {
    if (item.key().find("num_batches_tracked") == std::string::npos) {
      expect_close(
          item.value(),
          flat_values(entry.at("buffers_after").at(item.key()), item.value()),
          name + " " + item.key());
    }
  }
  head->normalize_prototypes();
  for (const auto& item : head->named_parameters()) {
    if (item.key().rfind("prototypes", 0) == 0) {
      expect_close(
          item.value(),
          flat_values(entry.at("normalized_prototypes").at(item.key()), item.value()),
          name + " normalized " + item.key());
    }
  }
}

TEST(SwavHeadTest, MatchesVisslsHead) {
  for (const char* name :
       {"swav_default",
        "two_prototype_sets_no_embeddings",
        "gelu_last_bn_unnormalized",
        "projection_only"}) {
    SCOPED_TRACE(name);
    check_case(name);
  }
}

TEST(SwavHeadTest, BadArgumentsNameTheArgument) {
  auto message_of = [](SwavHeadOptions options) -> std::string {
    try {
      SwavHead head(std::move(options));
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "(no ConfigError)";
  };
  SwavHeadOptions options;
  options.dims = {8};
  EXPECT_NE(message_of(options).find("SwavHeadOptions::dims = [8]"), std::string::npos);
  options.dims = {8, 4};
  options.num_clusters = {3000, 0};
  EXPECT_NE(
      message_of(options).find("SwavHeadOptions::num_clusters = [3000, 0]"), std::string::npos);
  options.num_clusters = {5};
  options.activation = "Tanh";
  EXPECT_NE(message_of(options).find("SwavHeadOptions::activation = Tanh"), std::string::npos);
}

} // namespace
} // namespace largo::models::swav_head_test
