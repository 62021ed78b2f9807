#include <largo/checkpoint/weights_init.h>

#include <largo/core/error.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>
#include <set>
#include <utility>

namespace largo::checkpoint {
namespace {

using Entries = std::vector<std::pair<std::string, c10::IValue>>;

bool starts_with(const std::string& text, const std::string& prefix) {
  return text.compare(0, prefix.size(), prefix) == 0;
}

// (A c10::Dict is a shared handle: returned by value, nothing is copied.)
StateDict dict_at(
    const StateDict& dict,
    const std::string& key,
    const std::string& where,
    const std::string& origin) {
  auto it = dict.find(key);
  if (it == dict.end()) {
    std::vector<std::string> keys;
    for (const auto& entry : dict) {
      keys.push_back(entry.key().isString() ? entry.key().toStringRef() : "(non-string key)");
    }
    throw CheckpointError(fmt::format(
        "weights file {}: {} has no key '{}' (MODEL.WEIGHTS_INIT.STATE_DICT_KEY_NAME); its keys "
        "are [{}]. Set STATE_DICT_KEY_NAME to the key holding the weights, or \"\" when the "
        "file is the state dict itself",
        origin,
        where,
        key,
        fmt::join(keys, ", ")));
  }
  if (!it->value().isGenericDict()) {
    throw CheckpointError(fmt::format(
        "weights file {}: {}['{}'] is a {}, not a dict of weights",
        origin,
        where,
        key,
        it->value().tagKind()));
  }
  return it->value().toGenericDict();
}

Entries entries_of(const StateDict& dict, const std::string& prefix) {
  Entries entries;
  for (const auto& entry : dict) {
    entries.emplace_back(prefix + entry.key().toStringRef(), entry.value());
  }
  return entries;
}

// VISSL's layout: classy_state_dict["base_model"]["model"]{"trunk", "heads"}.
Entries vissl_entries(const StateDict& classy, const std::string& origin) {
  const StateDict base = dict_at(classy, "base_model", "classy_state_dict", origin);
  const StateDict model = dict_at(base, "model", "classy_state_dict['base_model']", origin);
  const std::string where = "classy_state_dict['base_model']['model']";
  Entries entries;
  for (auto& [name, value] : entries_of(dict_at(model, "trunk", where, origin), "")) {
    // A feature extractor's trunk (VISSL linear evaluation) nests the trunk in base_model.
    const std::string plain = starts_with(name, "base_model.") ? name.substr(11) : name;
    entries.emplace_back("trunk." + plain, value);
  }
  if (model.contains("heads")) {
    for (auto& entry : entries_of(dict_at(model, "heads", where, origin), "heads.")) {
      entries.push_back(std::move(entry));
    }
  }
  return entries;
}

// The named entries of the file, named as the file's layout implies (before `rename`).
Entries file_entries(
    const StateDict& contents,
    const WeightsInitOptions& options,
    const std::string& origin,
    std::string& source) {
  const auto& keys = options.state_dict_key_name;
  const bool vissl_default = keys.size() == 1 && keys[0] == "classy_state_dict";
  if (vissl_default && !contents.contains("classy_state_dict") && contents.contains("model") &&
      contents.contains("largo_version")) {
    source = "Largo checkpoint";
    return entries_of(dict_at(contents, "model", "the checkpoint", origin), "");
  }
  StateDict dict = contents;
  std::string where = "the file";
  for (const auto& key : keys) {
    if (key == "classy_state_dict" && &key == &keys.back()) {
      source = "VISSL checkpoint";
      return vissl_entries(dict_at(dict, key, where, origin), origin);
    }
    dict = dict_at(dict, key, where, origin);
    where += "['" + key + "']";
  }
  source = contents.contains("largo_version") ? "Largo checkpoint" : "state dict";
  Entries entries = entries_of(dict, "");
  for (auto& [name, value] : entries) {
    if (!options.remove_prefix.empty() && starts_with(name, options.remove_prefix)) {
      name = name.substr(options.remove_prefix.size());
    }
    name = options.append_prefix + name;
  }
  return entries;
}

bool skipped(const std::string& name, const WeightsInitOptions& options) {
  return std::any_of(
             options.skip_layers.begin(),
             options.skip_layers.end(),
             [&](const std::string& part) {
               return !part.empty() && name.find(part) != std::string::npos;
             }) ||
         (!options.init_heads && is_head_name(name));
}

std::string shape_text(const at::Tensor& tensor) {
  return fmt::format("[{}]", fmt::join(tensor.sizes(), ", "));
}

} // namespace

bool is_head_name(const std::string& name) {
  return starts_with(name, "head.") || starts_with(name, "heads.");
}

namespace {

// The names, BatchNorm's num_batches_tracked counters (SKIP_LAYERS' default, one per BatchNorm
// layer) counted rather than listed: "head.0.weight, 20 num_batches_tracked buffers".
std::string name_list(const std::vector<std::string>& names) {
  const std::string counter = "num_batches_tracked";
  std::vector<std::string> listed;
  int64_t counters = 0;
  for (const std::string& name : names) {
    if (name.find(counter) != std::string::npos) { // also "x (file: y)"
      ++counters;
    } else {
      listed.push_back(name);
    }
  }
  if (counters > 0) {
    listed.push_back(fmt::format("{} {} buffer{}", counters, counter, counters == 1 ? "" : "s"));
  }
  return fmt::format("{}", fmt::join(listed, ", "));
}

} // namespace

std::string WeightsInitReport::describe(const std::string& origin) const {
  std::string text = fmt::format("initialized {} tensors from {} ({})", num_loaded, origin, source);
  if (!skipped.empty()) {
    text += fmt::format("; kept as built: {}", name_list(skipped));
  }
  if (!ignored.empty()) {
    text += fmt::format("; not used from the file: {}", name_list(ignored));
  }
  return text;
}

WeightsInitReport init_weights(
    torch::nn::Module& model,
    const StateDict& contents,
    const WeightsInitOptions& options,
    const std::string& origin) {
  WeightsInitReport report;
  std::map<std::string, at::Tensor> targets; // the model's parameters and buffers
  for (const auto& item : model.named_parameters()) {
    targets.emplace(item.key(), item.value());
  }
  for (const auto& item : model.named_buffers()) {
    targets.emplace(item.key(), item.value());
  }
  std::map<std::string, c10::IValue> source; // model name -> the file's value to load
  std::set<std::string> seen;                // model names the file has an entry for
  std::vector<std::string> unexpected, mismatched;
  for (const auto& [file_name, value] : file_entries(contents, options, origin, report.source)) {
    std::string name = file_name;
    if (targets.count(name) == 0 && options.rename) {
      name = options.rename(name);
    }
    const std::string shown =
        name == file_name ? name : fmt::format("{} (file: {})", name, file_name);
    if (skipped(name, options)) {
      report.ignored.push_back(shown);
      continue;
    }
    auto target = targets.find(name);
    if (target == targets.end()) {
      unexpected.push_back(shown);
      continue;
    }
    seen.insert(name);
    if (!value.isTensor()) {
      mismatched.push_back(fmt::format("{} (a {}, not a tensor)", shown, value.tagKind()));
    } else if (value.toTensor().sizes() != target->second.sizes()) {
      if (is_head_name(name) && !options.check_head_shapes) {
        report.skipped.push_back(name); // VISSL: a head of another shape keeps its init
        report.ignored.push_back(shown);
        continue;
      }
      mismatched.push_back(fmt::format(
          "{} (file {}, model {})",
          shown,
          shape_text(value.toTensor()),
          shape_text(target->second)));
    } else {
      source.emplace(name, value);
    }
  }
  std::vector<std::string> missing;
  for (const auto& [name, tensor] : targets) {
    if (skipped(name, options)) {
      report.skipped.push_back(name);
    } else if (seen.count(name) == 0) {
      missing.push_back(name);
    }
  }
  if (!missing.empty() || !unexpected.empty() || !mismatched.empty()) {
    std::vector<std::string> parts;
    if (!missing.empty()) {
      parts.push_back(
          fmt::format("missing from the file ({}): {}", missing.size(), fmt::join(missing, ", ")));
    }
    if (!unexpected.empty()) {
      parts.push_back(
          fmt::format("not in the model ({}): {}", unexpected.size(), fmt::join(unexpected, ", ")));
    }
    if (!mismatched.empty()) {
      parts.push_back(
          fmt::format("different ({}): {}", mismatched.size(), fmt::join(mismatched, ", ")));
    }
    throw CheckpointError(fmt::format(
        "cannot initialize the model from weights file {} ({}): {}. Nothing was loaded. Fix "
        "the names with MODEL.WEIGHTS_INIT.REMOVE_PREFIX / APPEND_PREFIX / STATE_DICT_KEY_NAME, "
        "or leave tensors out with MODEL.WEIGHTS_INIT.SKIP_LAYERS",
        origin,
        report.source,
        fmt::join(parts, "; ")));
  }
  torch::NoGradGuard no_grad;
  for (const auto& [name, value] : source) {
    targets.at(name).copy_(value.toTensor());
  }
  report.num_loaded = static_cast<int64_t>(source.size());
  return report;
}

WeightsInitReport
init_weights_from_file(torch::nn::Module& model, const WeightsInitOptions& options) {
  if (options.params_file.empty()) {
    throw CheckpointError(
        "MODEL.WEIGHTS_INIT.PARAMS_FILE is empty: name the file to initialize from");
  }
  const StateDict contents = load_checkpoint(options.params_file);
  return init_weights(model, contents, options, options.params_file.string());
}

} // namespace largo::checkpoint
