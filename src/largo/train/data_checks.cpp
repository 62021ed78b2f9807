#include <largo/train/data_checks.h>

#include <largo/core/error.h>
#include <largo/data/transforms.h>

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

namespace largo::train {
namespace {

std::string shape_text(const std::vector<int64_t>& shape) {
  return fmt::format("{}", fmt::join(shape, "x"));
}

// Trunks whose weights fix the input size (an MLP's first layer, a ViT's position
// embeddings); the CNNs pool globally and take any size.
bool input_size_is_fixed(const std::string& trunk_name) {
  return trunk_name == "mlp" || trunk_name == "vision_transformer";
}

} // namespace

SplitFacts split_facts(
    const std::string& key,
    const DataSplitOptions& split,
    const data::Dataset& dataset,
    int64_t num_samples) {
  SplitFacts facts;
  facts.key = key;
  facts.source =
      split.source == "synthetic"
          ? fmt::format(
                "synthetic data ({}.SYNTHETIC.NUM_SAMPLES = {})", key, split.synthetic_num_samples)
          : fmt::format("{} in {} ({}.DATA_PATHS)", split.dataset_name, split.path.string(), key);
  if (split.data_limit >= 0) {
    facts.source += fmt::format(", {}.DATA_LIMIT = {}", key, split.data_limit);
  }
  facts.num_samples = num_samples;
  facts.num_classes = dataset.num_classes();
  const std::vector<int64_t> raw = dataset.sample_shape(); // [C, H, W]
  // One blank sample through the split's pipeline: the shape the loader's batches will have.
  const data::TransformPipeline pipeline = data::make_pipeline(split.transforms);
  auto generator = at::make_generator<at::CPUGeneratorImpl>(0);
  try {
    const at::Tensor sample = at::zeros({1, raw.at(0), raw.at(1), raw.at(2)}, at::kByte);
    const at::Tensor out = pipeline.apply(sample, generator);
    facts.input_shape = {out.size(1), out.size(2), out.size(3)};
  } catch (const Error& e) {
    throw ConfigError(fmt::format(
        "config key {}.TRANSFORMS cannot take the {} images of {}: {}",
        key,
        shape_text(raw),
        facts.source,
        e.what()));
  }
  return facts;
}

void check_data_fits_model(
    const SplitFacts& train, const std::optional<SplitFacts>& test, const std::string& trunk_name) {
  for (const SplitFacts* split : {&train, test ? &*test : nullptr}) {
    if (split != nullptr && split->num_samples == 0) {
      throw DataError(fmt::format(
          "{} has no samples ({}), so there is nothing to {}; point {}.DATA_PATHS at data{}",
          split->key,
          split->source,
          split == &train ? "train on" : "evaluate",
          split->key,
          split == &train ? "" : ", or set TEST_MODEL=False to train without evaluating"));
    }
  }
  const auto& shape = train.input_shape;
  if (input_size_is_fixed(trunk_name) && shape[1] != shape[2]) {
    throw ConfigError(fmt::format(
        "MODEL.TRUNK.NAME = {} takes square images, but {} yields {} images (after {}.TRANSFORMS); "
        "add a RandomCrop with a square size to {}.TRANSFORMS",
        trunk_name,
        train.key,
        shape_text(shape),
        train.key,
        train.key));
  }
  if (!test) {
    return;
  }
  const auto& test_shape = test->input_shape;
  const bool size_differs = test_shape[1] != shape[1] || test_shape[2] != shape[2];
  if (test_shape[0] != shape[0] || (input_size_is_fixed(trunk_name) && size_differs)) {
    throw ConfigError(fmt::format(
        "{} yields {} images but the model is built for {}'s {} images (both after their "
        "TRANSFORMS){}; make them agree (e.g. the same RandomCrop size in {}.TRANSFORMS, or "
        "the same dataset)",
        test->key,
        shape_text(test_shape),
        train.key,
        shape_text(shape),
        test_shape[0] != shape[0]
            ? ": the channel counts differ"
            : fmt::format(", and MODEL.TRUNK.NAME = {} takes one size only", trunk_name),
        test->key));
  }
  if (test->num_classes > train.num_classes) {
    throw ConfigError(fmt::format(
        "{} has {} classes but the model's head has {} outputs, one per class of {}; labels "
        "{}..{} could not be scored. Use the same classes in both splits ({}.SYNTHETIC.NUM_CLASSES "
        "or the dataset)",
        test->key,
        test->num_classes,
        train.num_classes,
        train.key,
        train.num_classes,
        test->num_classes - 1,
        test->key));
  }
}

} // namespace largo::train
