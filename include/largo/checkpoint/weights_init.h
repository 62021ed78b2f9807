// Initializing a model from a file of weights before training or evaluation, as VISSL's
// MODEL.WEIGHTS_INIT does (vissl/utils/checkpoint.py init_model_from_consolidated_weights),
// from three kinds of files:
//   - a Largo checkpoint: its "model" entry, the full model by Largo's names (also after a
//     ZeRO or FSDP run); used when STATE_DICT_KEY_NAME is VISSL's default
//     "classy_state_dict" and the file is a Largo checkpoint, or when it is "model";
//   - a VISSL checkpoint (STATE_DICT_KEY_NAME "classy_state_dict"): the state under
//     ["base_model"]["model"]["trunk"] and ["heads"], named "trunk.<name>" and "heads.<name>"
//     (a feature extractor's "base_model." prefix removed from the trunk's names);
//   - a plain state dict saved with torch.save (STATE_DICT_KEY_NAME "", or the key or list
//     of nested keys that holds it, e.g. "state_dict"), renamed with REMOVE_PREFIX (first)
//     and APPEND_PREFIX, as in VISSL.
// Then each name the model does not have is passed through `rename`, e.g.
// models::resnet_name_from_torchvision, which maps torchvision's and VISSL's ResNet names to
// Largo's, and matched with the model's parameters and buffers.
//
// Names containing any SKIP_LAYERS entry are ignored, in the model and in the file. With
// init_heads false (linear evaluation that does not evaluate the pretrained head) the
// model's head tensors ("head." / "heads.") keep their initialization and the file's are
// ignored. Every other mismatch — model tensors the file lacks, file tensors the model
// lacks, different shapes, entries that are not tensors — is listed in one CheckpointError
// naming the file, and nothing is modified. (VISSL only logs missing layers; a run that
// silently trains from a partly random model is what this prevents.)
//
// No collectives: every rank that initializes reads the file itself. Initialize before
// wrapping the model for data parallelism (DDP broadcasts rank 0's weights anyway; ZeRO-3/
// FSDP shards what each rank holds, so every rank must have loaded them).
#pragma once

#include <largo/checkpoint/checkpoint_file.h>

#include <torch/nn/module.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

namespace largo::checkpoint {

struct WeightsInitOptions {
  std::filesystem::path params_file; // MODEL.WEIGHTS_INIT.PARAMS_FILE
  // MODEL.WEIGHTS_INIT.STATE_DICT_KEY_NAME: the key (or nested keys) holding the state dict;
  // empty: the file is the state dict.
  std::vector<std::string> state_dict_key_name{"classy_state_dict"};
  std::vector<std::string> skip_layers{"num_batches_tracked"}; // SKIP_LAYERS (substrings)
  std::string remove_prefix; // REMOVE_PREFIX: removed from names that start with it
  std::string append_prefix; // APPEND_PREFIX: prepended to every name
  // false: head tensors are neither loaded nor reported (MODEL.FEATURE_EVAL_SETTINGS:
  // EVAL_MODE_ON without EVAL_TRUNK_AND_HEAD).
  bool init_heads = true;
  // false: head tensors whose shape differs are left as built instead of being an error
  // (MODEL.FEATURE_EVAL_SETTINGS.ASSERT_HEAD_LAYER_SHAPE_INIT).
  bool check_head_shapes = true;
  // Maps a file name the model does not have to the model's naming; identity when empty.
  std::function<std::string(const std::string&)> rename;
};

struct WeightsInitReport {
  int64_t num_loaded = 0;           // model tensors set from the file
  std::vector<std::string> skipped; // model tensors left as built (SKIP_LAYERS, heads)
  std::vector<std::string> ignored; // file entries not used (SKIP_LAYERS, heads)
  std::string source;               // "Largo checkpoint", "VISSL checkpoint", "state dict"
  // "initialized 102 tensors from FILE (state dict); kept 2 as built: ..."
  std::string describe(const std::string& origin) const;
};

// Reads options.params_file (checkpoint::load_checkpoint) and initializes `model` from it.
// Throws CheckpointError naming the file for an unreadable file, a missing key, or any
// mismatch (see the top of this file).
WeightsInitReport
init_weights_from_file(torch::nn::Module& model, const WeightsInitOptions& options);

// The same from a file's contents; `origin` names the file in messages.
WeightsInitReport init_weights(
    torch::nn::Module& model,
    const StateDict& contents,
    const WeightsInitOptions& options,
    const std::string& origin);

// Whether `name` is a head tensor's name ("head." or "heads." at the start).
bool is_head_name(const std::string& name);

} // namespace largo::checkpoint
