// VISSL's head names in Largo's naming (models/vissl_names.h), checked name by name against
// a built model of each head type: VISSL's ModuleList of heads against Largo's one flat head.
#include <largo/models/model_factory.h>
#include <largo/models/vissl_names.h>

#include <gtest/gtest.h>

#include <set>

namespace largo::models::vissl_names_test {
namespace {

// Small models on 8x8 single-channel images, the mlp trunk's output 16 wide.
ModelOptions mlp_trunk() {
  ModelOptions options;
  options.trunk_name = "mlp";
  options.mlp.hidden_dims = {16};
  options.in_channels = 1;
  options.image_size = 8;
  options.num_classes = 5;
  return options;
}

std::set<std::string> tensor_names(const ModelOptions& options) {
  TrunkHeadModel model = build_model(options);
  std::set<std::string> names;
  for (const auto& item : model->named_parameters()) {
    names.insert(item.key());
  }
  for (const auto& item : model->named_buffers()) {
    names.insert(item.key());
  }
  return names;
}

// Each (VISSL name, Largo name) pair maps as given, and the Largo name is the model's.
void expect_mapped(
    const ModelOptions& options, const std::vector<std::pair<std::string, std::string>>& pairs) {
  const std::set<std::string> names = tensor_names(options);
  for (const auto& [vissl, largo] : pairs) {
    EXPECT_EQ(head_name_from_vissl(vissl, options), largo) << vissl;
    EXPECT_EQ(names.count(largo), 1U) << largo << " is not a tensor of the model";
  }
}

TEST(VisslNames, SwavHeadKeepsVisslsNamesUnderHeadZero) {
  ModelOptions options = mlp_trunk();
  options.swav_head.dims = {16, 8, 4};
  options.swav_head.use_bn = true;
  options.swav_head.num_clusters = {6, 3};
  expect_mapped(
      options,
      {{"heads.0.projection_head.0.weight", "head.0.projection_head.0.weight"},
       {"heads.0.projection_head.1.running_var", "head.0.projection_head.1.running_var"},
       {"heads.0.projection_head.3.bias", "head.0.projection_head.3.bias"},
       {"heads.0.prototypes1.weight", "head.0.prototypes1.weight"}});
  // There is one swav_head: another index is not the model's.
  EXPECT_EQ(
      head_name_from_vissl("heads.1.prototypes0.weight", options), "heads.1.prototypes0.weight");
}

TEST(VisslNames, MlpHeadsRunOneAfterAnotherAreFlattened) {
  ModelOptions one = mlp_trunk();
  one.head_dims = {16, 8, 5};
  one.head.use_bn = true;
  one.head.use_relu = true; // clf: Linear, BatchNorm1d, ReLU, Linear
  expect_mapped(
      one,
      {{"heads.0.clf.0.weight", "head.0.weight"},
       {"heads.0.clf.1.running_mean", "head.1.running_mean"},
       {"heads.0.clf.3.bias", "head.3.bias"}});
  EXPECT_EQ(head_name_from_vissl("heads.0.clf.4.weight", one), "heads.0.clf.4.weight");

  // Barlow Twins' shape: BatchNorm and ReLU after every Linear of the first two heads.
  ModelOptions chain = mlp_trunk();
  MlpHeadOptions hidden;
  hidden.use_bn = true;
  hidden.use_relu = true;
  hidden.skip_last_layer_relu_bn = false;
  chain.head_chain = {{{16, 8}, hidden}, {{8, 8}, hidden}, {{8, 4}, MlpHeadOptions{}}};
  expect_mapped(
      chain,
      {{"heads.0.clf.0.weight", "head.0.weight"},
       {"heads.0.clf.1.weight", "head.1.weight"},
       {"heads.1.clf.0.bias", "head.3.bias"},
       {"heads.1.clf.1.running_var", "head.4.running_var"},
       {"heads.2.clf.0.weight", "head.6.weight"}});
  EXPECT_EQ(head_name_from_vissl("heads.3.clf.0.weight", chain), "heads.3.clf.0.weight");
  EXPECT_EQ(head_name_from_vissl("heads.1.clf.3.weight", chain), "heads.1.clf.3.weight");

  // No MODEL.HEAD.PARAMS: the linear head, VISSL's mlp [in, classes].
  expect_mapped(mlp_trunk(), {{"heads.0.clf.0.weight", "head.0.weight"}});
}

// A swav_head without prototypes before a classifier: its projection keeps VISSL's module
// name, and its normalisation is a layer the next head's names count past.
TEST(VisslNames, SwavProjectionBeforeAClassifierKeepsItsModuleName) {
  ModelOptions options = mlp_trunk();
  MlpHeadSpec projection;
  projection.dims = {16, 8, 6};
  projection.options.use_bn = true;
  projection.options.use_relu = true;
  projection.options.skip_last_layer_relu_bn = false;
  projection.normalize_output = true;
  projection.vissl_module = "projection_head";
  // Linear, BatchNorm1d, ReLU twice (head.0 .. head.5), the normalisation (head.6), the
  // classifier's Linear (head.7).
  options.head_chain = {projection, MlpHeadSpec{{6, 5}, MlpHeadOptions{}}};
  expect_mapped(
      options,
      {{"heads.0.projection_head.0.weight", "head.0.weight"},
       {"heads.0.projection_head.4.running_mean", "head.4.running_mean"},
       {"heads.1.clf.0.weight", "head.7.weight"},
       {"heads.1.clf.0.bias", "head.7.bias"}});
  // The projection is not an mlp's clf, and has no prototypes.
  EXPECT_EQ(head_name_from_vissl("heads.0.clf.0.weight", options), "heads.0.clf.0.weight");
  EXPECT_EQ(
      head_name_from_vissl("heads.0.prototypes0.weight", options), "heads.0.prototypes0.weight");
}

TEST(VisslNames, OtherNamesAndLinearEvaluationHeadsAreLeftAlone) {
  ModelOptions options = mlp_trunk();
  for (const std::string name :
       {"heads.0.projection_head.0.weight",
        "heads.x.clf.0.weight",
        "heads.0.clf.x.weight",
        "head.0.weight",
        "trunk.0.linear.weight"}) {
    EXPECT_EQ(head_name_from_vissl(name, options), name);
  }
  options.feature_eval.taps = {FeatureTap{}};
  EXPECT_EQ(head_name_from_vissl("heads.0.clf.clf.0.weight", options), "heads.0.clf.clf.0.weight");
}

// weights_name_mapping: heads as above, the trunk through the ResNet's torchvision/VISSL
// names.
TEST(VisslNames, WeightsNameMappingCombinesTheHeadAndTheTrunk) {
  ModelOptions options;
  options.trunk_name = "resnet";
  options.resnet.depth = 18;
  options.head_chain = {{{512, 64}, MlpHeadOptions{}}, {{64, 16}, MlpHeadOptions{}}};
  const auto rename = weights_name_mapping(options);
  EXPECT_EQ(rename("trunk._feature_blocks.conv1.weight"), "trunk.0.conv1.weight");
  EXPECT_EQ(rename("heads.1.clf.0.weight"), "head.1.weight");
  options.trunk_name = "small_cnn";
  EXPECT_EQ(weights_name_mapping(options)("trunk.0.0.weight"), "trunk.0.0.weight");
}

} // namespace
} // namespace largo::models::vissl_names_test
