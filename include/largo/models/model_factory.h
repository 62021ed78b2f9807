// Builds a model (trunk + head) from typed options: the one place that maps a trunk name
// (MODEL.TRUNK.NAME) to a builder. The trainer fills ModelOptions from the YAML config;
// library users fill it directly.
#pragma once

#include <largo/models/dino_head.h>
#include <largo/models/dino_model.h>
#include <largo/models/heads.h>
#include <largo/models/linear_eval.h>
#include <largo/models/mlp.h>
#include <largo/models/moco_model.h>
#include <largo/models/multi_crop_model.h>
#include <largo/models/parameter_count.h>
#include <largo/models/regnet.h>
#include <largo/models/resnet.h>
#include <largo/models/resnet_sk.h>
#include <largo/models/small_cnn.h>
#include <largo/models/swav_head.h>
#include <largo/models/trunk_head_model.h>
#include <largo/models/vit.h>

#include <torch/nn/modules/container/any.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace largo::models {

struct ModelOptions {
  // MODEL.TRUNK.NAME: "mlp" | "small_cnn" | "resnet" | "resnet_sk" | "regnet" |
  // "vision_transformer"
  std::string trunk_name = "small_cnn";
  int64_t in_channels = 3;   // channels of the input images
  int64_t image_size = 32;   // side of the (square) input images
  int64_t num_classes = 10;  // width of the linear head (and the last head dim)
  ResNetOptions resnet;      // MODEL.TRUNK.RESNETS.*
  ResNetSkOptions resnet_sk; // MODEL.TRUNK.RESNETS_SK.*
  RegNetOptions regnet;      // MODEL.TRUNK.REGNET.*
  VitOptions vit;            // MODEL.TRUNK.VISION_TRANSFORMERS.*
  MlpOptions mlp;            // MODEL.TRUNK.MLP.*
  SmallCnnOptions small_cnn; // MODEL.TRUNK.SMALL_CNN.*
  // MODEL.HEAD.PARAMS [["mlp", {"dims": [...]}]]: VISSL's mlp head dims [in, ..., out],
  // with dims[0] == the trunk's output width and dims.back() == num_classes.
  // Empty: Linear(trunk output -> num_classes).
  std::vector<int64_t> head_dims;
  MlpHeadOptions head; // the mlp head's other switches (used when head_dims is set)
  // MODEL.HEAD.PARAMS [["eval_mlp", {"in_channels": C, "dims": [...]}]] without feature taps:
  // VISSL's eval_mlp on the trunk's output, a BatchNorm2d over its C channels (C must be the
  // trunk's output width) before the mlp head of head_dims (linear_eval.h's EvalMlpHead, named
  // head.0.channel_bn.*, head.0.clf.clf.<k>.*). 0: the mlp head alone.
  int64_t head_channel_bn = 0;
  // Self-supervised heads, instead of head_dims (their outputs are not classes):
  // MODEL.HEAD.PARAMS [["swav_head", {...}]] (swav_head.dims non-empty), or several mlp
  // heads applied one after another (head_chain: SimCLR's projection).
  SwavHeadOptions swav_head;
  // MODEL.HEAD.PARAMS [["dino_head", {...}]] (dino_head.in_dim > 0): DINO's head alone.
  DinoHeadOptions dino_head;
  std::vector<MlpHeadSpec> head_chain;
  // Several views per image ([channels, h, w] each, data::Dataset::view_shapes): the run
  // trains a MultiCropModel over build_model's. Empty: one image per sample.
  std::vector<std::vector<int64_t>> view_shapes;
  // With view_shapes: the MultiCropModel pads the views to the largest and runs them through
  // the trunk in one pass (VISSL's create_multidimensional_tensor; padded_crops.h). Not with
  // moco or dino.
  bool pad_views = false;
  // A MoCo run: with view_shapes, build_run_model trains a MocoModel (the model and a
  // momentum encoder built alike) instead of the MultiCropModel. Unset: no momentum encoder.
  std::optional<MocoModelOptions> moco;
  // A DINO run: with view_shapes, build_run_model trains a DinoModel (the student and a teacher
  // built alike, with drop path 0 as VISSL's) instead of the MultiCropModel.
  std::optional<DinoModelOptions> dino;
  // MODEL.HEAD.PARAMS_MULTIPLIER: the head's Linear weights and biases are multiplied by it
  // after their initialization (VISSL's MLP.scale_weights): the mlp and eval_mlp heads', not
  // a swav_head's or a dino_head's (nor a swav_head projection's in head_chain).
  double head_params_multiplier = 1.0;
  // MODEL.FEATURE_EVAL_SETTINGS: not used by build_model; build_run_model builds the
  // evaluation model over build_model's (models/linear_eval.h).
  FeatureEvalOptions feature_eval;
};

// The trunk names build_model accepts, in the order error messages list them.
const std::vector<std::string>& supported_trunk_names();

// Builds the trunk named by options.trunk_name and its head. Throws OptionError naming the
// option, the value and what was expected: ModelOptions::trunk_name for an unknown trunk
// (listing the supported ones), the trunk's options (ResNetOptions::depth, ...) for bad trunk
// options, ModelOptions::head_dims / SwavHeadOptions::dims for head dims that do not fit the
// trunk or the classes.
// Initialization draws from the global torch generator: seed it first for reproducibility.
TrunkHeadModel build_model(const ModelOptions& options);

// Just the trunk (used by build_model; also for heads the caller builds).
Trunk build_trunk(const ModelOptions& options);

// What a run trains, built from one ModelOptions: build_model's model and, when
// options.feature_eval is enabled(), the linear evaluation over its trunk (linear_eval.h), or
// with options.view_shapes the multi-crop model over it (multi_crop_model.h), or with
// options.moco too the MoCo model (moco_model.h; its momentum encoder is a second
// build_model, drawn after the first from the same generator).
// The trainer, `largo estimate` and feature extraction build it alike.
struct RunModel {
  TrunkHeadModel model{nullptr};
  LinearEvalModel linear_eval{nullptr}; // empty without a linear evaluation
  MultiCropModel multi_crop{nullptr};   // empty for one image per sample
  MocoModel moco{nullptr};              // in place of multi_crop when options.moco is set
  DinoModel dino{nullptr};              // in place of multi_crop when options.dino is set

  // The module that trains, is checkpointed and is initialized from MODEL.WEIGHTS_INIT: the
  // linear evaluation, the multi-crop model, the MoCo model, or the model.
  std::shared_ptr<torch::nn::Module> module() const;
  // The same as parallel::parallelize takes it.
  torch::nn::AnyModule any_module() const;
  // The widths of the outputs its forward concatenates (split_outputs); empty: one output.
  std::vector<int64_t> output_widths() const;
};

// Initialization draws from the global torch generator, as build_model's does. Throws what
// build_model and LinearEvalModel throw.
RunModel build_run_model(const ModelOptions& options);

} // namespace largo::models
