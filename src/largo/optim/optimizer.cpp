#include <largo/optim/optimizer.h>

#include <largo/core/error.h>

#include <ATen/core/Dict.h>
#include <ATen/core/List.h>
#include <ATen/core/jit_type.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <unordered_set>

namespace largo::optim {
namespace {

using c10::IValue;
using c10::impl::GenericDict;

GenericDict make_string_dict() {
  return GenericDict(c10::StringType::get(), c10::AnyType::get());
}

void check_lr(double lr, const std::string& group_name) {
  if (!(lr >= 0.0)) {
    throw ConfigError(fmt::format(
        "ParamGroup::lr: learning rate {} for parameter group '{}' is invalid; "
        "use a value >= 0",
        lr,
        group_name));
  }
}

void check_weight_decay(double weight_decay, const std::string& group_name) {
  if (!(weight_decay >= 0.0)) {
    throw ConfigError(fmt::format(
        "ParamGroup::weight_decay = {} for parameter group '{}' is invalid; use a value >= 0",
        weight_decay,
        group_name));
  }
}

// Looks up a key of a dict read back from a checkpoint, naming what is missing.
IValue require_key(const GenericDict& dict, const std::string& key, const std::string& where) {
  auto it = dict.find(IValue(key));
  if (it == dict.end()) {
    throw CheckpointError(fmt::format(
        "optimizer state_dict: {} has no key '{}'; the checkpoint was not written by a Largo "
        "optimizer or is damaged",
        where,
        key));
  }
  return it->value();
}

double require_number(const IValue& value, const std::string& what) {
  if (value.isDouble()) {
    return value.toDouble();
  }
  if (value.isInt()) {
    return static_cast<double>(value.toInt());
  }
  throw CheckpointError(
      fmt::format("optimizer state_dict: {} must be a number, got {}", what, value.tagKind()));
}

bool same_hyperparameter(const IValue& a, const IValue& b) {
  if ((a.isDouble() || a.isInt()) && (b.isDouble() || b.isInt())) {
    return require_number(a, "") == require_number(b, "");
  }
  if (a.isBool() && b.isBool()) {
    return a.toBool() == b.toBool();
  }
  if (a.isString() && b.isString()) {
    return a.toStringRef() == b.toStringRef();
  }
  if (a.isList() && b.isList()) { // AdamW's and LAMB's betas
    const auto& left = a.toListRef();
    const auto& right = b.toListRef();
    return left.size() == right.size() &&
           std::equal(left.begin(), left.end(), right.begin(), same_hyperparameter);
  }
  return false;
}

std::string describe(const IValue& value) {
  if (value.isDouble()) {
    return fmt::format("{}", value.toDouble());
  }
  if (value.isInt()) {
    return fmt::format("{}", value.toInt());
  }
  if (value.isBool()) {
    return value.toBool() ? "true" : "false";
  }
  if (value.isString()) {
    return value.toStringRef();
  }
  if (value.isList()) {
    std::vector<std::string> elements;
    for (const IValue& element : value.toListRef()) {
      elements.push_back(describe(element));
    }
    return fmt::format("[{}]", fmt::join(elements, ", "));
  }
  return value.tagKind();
}

} // namespace

Optimizer::Optimizer(std::vector<ParamGroup> param_groups)
    : param_groups_(std::move(param_groups)) {
  std::unordered_set<std::string> seen_names;
  for (size_t g = 0; g < param_groups_.size(); ++g) {
    ParamGroup& group = param_groups_[g];
    const std::string group_label = group.name.empty() ? fmt::format("group{}", g) : group.name;
    check_lr(group.lr, group_label);
    check_weight_decay(group.weight_decay, group_label);
    if (group.names.empty()) {
      for (size_t i = 0; i < group.params.size(); ++i) {
        group.names.push_back(fmt::format("{}.{}", group_label, i));
      }
    }
    if (group.names.size() != group.params.size()) {
      throw ConfigError(fmt::format(
          "parameter group '{}' has {} parameters but {} names; give one name per parameter",
          group_label,
          group.params.size(),
          group.names.size()));
    }
    for (size_t i = 0; i < group.params.size(); ++i) {
      if (!group.params[i].defined()) {
        throw ConfigError(fmt::format(
            "parameter '{}' of group '{}' is an undefined tensor", group.names[i], group_label));
      }
      if (!seen_names.insert(group.names[i]).second) {
        throw ConfigError(fmt::format(
            "parameter name '{}' appears twice in the optimizer's parameter groups; names key "
            "the optimizer state and must be unique",
            group.names[i]));
      }
    }
  }
}

void Optimizer::zero_grad(bool set_to_none) {
  for (ParamGroup& group : param_groups()) {
    for (at::Tensor& param : group.params) {
      at::Tensor& grad = param.mutable_grad();
      if (!grad.defined()) {
        continue;
      }
      if (set_to_none) {
        grad.reset();
      } else {
        // As torch.optim: a gradient that is a view (DDP's bucket views, ZeRO's and FSDP's
        // shard views) cannot be detached in place; one without a grad_fn needs no detaching.
        if (grad.grad_fn()) {
          grad.detach_();
        } else {
          grad.requires_grad_(false);
        }
        grad.zero_();
      }
    }
  }
}

void Optimizer::set_lr(double lr) {
  check_lr(lr, "(all groups)");
  for (ParamGroup& group : param_groups()) {
    group.lr = lr;
  }
}

const ParamState* Optimizer::find_state(const std::string& param_name) const {
  auto it = state_.find(param_name);
  return it == state_.end() ? nullptr : &it->second;
}

int64_t Optimizer::state_bytes() const {
  int64_t num_bytes = 0;
  for (const auto& [name, param_state] : state_) {
    for (const auto& [key, tensor] : param_state) {
      if (tensor.defined()) {
        num_bytes += static_cast<int64_t>(tensor.numel() * tensor.element_size());
      }
    }
  }
  return num_bytes;
}

c10::IValue Optimizer::state_dict() const {
  // The tensors share storage with the live state (as in PyTorch); pickle_save or clone
  // the result to keep a snapshot while training goes on.
  GenericDict state = make_string_dict();
  c10::impl::GenericList groups(c10::AnyType::get());
  const auto hyper = hyperparameters();
  for (const ParamGroup& group : param_groups_) {
    GenericDict group_dict = make_string_dict();
    group_dict.insert("name", group.name);
    group_dict.insert("lr", group.lr);
    group_dict.insert("weight_decay", group.weight_decay);
    for (const auto& [key, value] : hyper) {
      group_dict.insert(key, value);
    }
    c10::List<std::string> names;
    for (const std::string& name : group.names) {
      names.push_back(name);
      const ParamState* param_state = find_state(name);
      if (param_state == nullptr || param_state->empty()) {
        continue;
      }
      GenericDict entry = make_string_dict();
      for (const auto& [key, tensor] : *param_state) {
        // The standard layout: a channels-last weight's state is copied, the rest shared
        // (contiguous() returns a contiguous tensor itself).
        entry.insert(key, tensor.contiguous());
      }
      state.insert(name, entry);
    }
    group_dict.insert("params", names);
    groups.push_back(group_dict);
  }
  GenericDict root = make_string_dict();
  root.insert("state", state);
  root.insert("param_groups", groups);
  root.insert("type", type());
  return root;
}

void Optimizer::load_state_dict(const c10::IValue& state_dict) {
  if (!state_dict.isGenericDict()) {
    throw CheckpointError(fmt::format(
        "optimizer state_dict must be a dict with keys 'state', 'param_groups' and 'type', got "
        "{}",
        state_dict.tagKind()));
  }
  const GenericDict root = state_dict.toGenericDict();

  const IValue saved_type = require_key(root, "type", "the top level");
  if (!saved_type.isString() || saved_type.toStringRef() != type()) {
    throw CheckpointError(fmt::format(
        "the checkpoint holds the state of a '{}' optimizer but this optimizer is '{}'; to "
        "resume it, set OptimizerSpec::name to the checkpoint's optimizer; to train on with '{}' "
        "from its weights alone, start a new run that loads only the checkpoint's weights",
        describe(saved_type),
        type(),
        type()));
  }

  // Groups: same count, same parameter names in the same order.
  const IValue saved_groups_value = require_key(root, "param_groups", "the top level");
  if (!saved_groups_value.isList()) {
    throw CheckpointError("optimizer state_dict: 'param_groups' must be a list");
  }
  const c10::List<IValue> saved_groups = saved_groups_value.toList();
  if (saved_groups.size() != param_groups_.size()) {
    throw CheckpointError(fmt::format(
        "the checkpoint's optimizer has {} parameter groups but this optimizer has {}; the "
        "model or the parameter groups' options (ParamGroupOptions) differ from the run that "
        "wrote it",
        saved_groups.size(),
        param_groups_.size()));
  }
  std::vector<std::pair<double, double>> saved_lr_wd;
  const auto hyper = hyperparameters();
  std::unordered_map<std::string, const at::Tensor*> param_by_name;
  for (size_t g = 0; g < param_groups_.size(); ++g) {
    const ParamGroup& group = param_groups_[g];
    const std::string where = fmt::format("param_groups[{}] ('{}')", g, group.name);
    const IValue saved_group_value = saved_groups.get(g);
    if (!saved_group_value.isGenericDict()) {
      throw CheckpointError(fmt::format("optimizer state_dict: {} must be a dict", where));
    }
    const GenericDict saved_group = saved_group_value.toGenericDict();
    const IValue saved_names_value = require_key(saved_group, "params", where);
    if (!saved_names_value.isList()) {
      throw CheckpointError(fmt::format("optimizer state_dict: {}.params must be a list", where));
    }
    std::vector<std::string> saved_names;
    for (const IValue& name : saved_names_value.toListRef()) {
      if (!name.isString()) {
        throw CheckpointError(
            fmt::format("optimizer state_dict: {}.params must hold parameter names", where));
      }
      saved_names.push_back(name.toStringRef());
    }
    if (saved_names != group.names) {
      const std::unordered_set<std::string> saved_set(saved_names.begin(), saved_names.end());
      const std::unordered_set<std::string> current_set(group.names.begin(), group.names.end());
      for (const std::string& name : group.names) {
        if (saved_set.count(name) == 0) {
          throw CheckpointError(fmt::format(
              "parameter '{}' (group '{}') is missing from the checkpoint's optimizer state; "
              "the checkpoint was written for a different model",
              name,
              group.name));
        }
      }
      for (const std::string& name : saved_names) {
        if (current_set.count(name) == 0) {
          throw CheckpointError(fmt::format(
              "the checkpoint's optimizer state has parameter '{}' (group '{}') which this "
              "optimizer does not have; the checkpoint was written for a different model",
              name,
              group.name));
        }
      }
      throw CheckpointError(fmt::format(
          "the parameters of group '{}' are in a different order in the checkpoint ([{}]) than "
          "in this optimizer ([{}])",
          group.name,
          fmt::join(saved_names, ", "),
          fmt::join(group.names, ", ")));
    }
    saved_lr_wd.emplace_back(
        require_number(require_key(saved_group, "lr", where), where + ".lr"),
        require_number(require_key(saved_group, "weight_decay", where), where + ".weight_decay"));
    for (const auto& [key, value] : hyper) {
      auto it = saved_group.find(IValue(key));
      if (it != saved_group.end() && !same_hyperparameter(it->value(), value)) {
        spdlog::warn(
            "optimizer checkpoint was written with {} = {} but this optimizer uses {}; keeping {}",
            key,
            describe(it->value()),
            describe(value),
            describe(value));
      }
    }
    for (size_t i = 0; i < group.params.size(); ++i) {
      param_by_name[group.names[i]] = &group.params[i];
    }
  }

  // State: copied, so that the loaded optimizer owns its tensors.
  const IValue saved_state_value = require_key(root, "state", "the top level");
  if (!saved_state_value.isGenericDict()) {
    throw CheckpointError("optimizer state_dict: 'state' must be a dict");
  }
  std::unordered_map<std::string, ParamState> new_state;
  for (const auto& entry : saved_state_value.toGenericDict()) {
    if (!entry.key().isString()) {
      throw CheckpointError("optimizer state_dict: 'state' must be keyed by parameter name");
    }
    const std::string& name = entry.key().toStringRef();
    auto param_it = param_by_name.find(name);
    if (param_it == param_by_name.end()) {
      throw CheckpointError(fmt::format(
          "the checkpoint's optimizer state has parameter '{}' which this optimizer does not "
          "have",
          name));
    }
    const at::Tensor& param = *param_it->second;
    if (!entry.value().isGenericDict()) {
      throw CheckpointError(
          fmt::format("optimizer state_dict: state of parameter '{}' must be a dict", name));
    }
    ParamState param_state;
    for (const auto& item : entry.value().toGenericDict()) {
      const std::string key = item.key().isString() ? item.key().toStringRef() : "?";
      if (!item.value().isTensor()) {
        throw CheckpointError(fmt::format(
            "optimizer state_dict: state '{}' of parameter '{}' must be a tensor, got {}",
            key,
            name,
            item.value().tagKind()));
      }
      const at::Tensor& saved = item.value().toTensor();
      if (is_scalar_state(key)) {
        param_state[key] = saved.detach().clone();
        continue;
      }
      if (saved.sizes() != param.sizes()) {
        throw CheckpointError(fmt::format(
            "optimizer state '{}' of parameter '{}' has shape [{}] in the checkpoint but the "
            "parameter has shape [{}]; the checkpoint was written for a different model",
            key,
            name,
            fmt::join(saved.sizes(), ", "),
            fmt::join(param.sizes(), ", ")));
      }
      // Laid out like the parameter, as a fresh state is (zeros_like's Preserve), whichever
      // layout the checkpoint's run trained in (channels-last or not).
      at::Tensor value = at::empty_like(param, at::MemoryFormat::Preserve);
      value.copy_(saved.detach());
      param_state[key] = std::move(value);
    }
    new_state.emplace(name, std::move(param_state));
  }

  // Everything checked: commit.
  state_ = std::move(new_state);
  for (size_t g = 0; g < param_groups_.size(); ++g) {
    param_groups_[g].lr = saved_lr_wd[g].first;
    param_groups_[g].weight_decay = saved_lr_wd[g].second;
  }
}

void check_adam_moments(
    const std::array<double, 2>& betas, double eps, const std::string& options_name) {
  for (size_t i = 0; i < betas.size(); ++i) {
    if (!(betas[i] >= 0.0 && betas[i] < 1.0)) {
      throw ConfigError(fmt::format(
          "{}::betas[{}] = {} is invalid; each beta must be in [0, 1)", options_name, i, betas[i]));
    }
  }
  if (!(eps >= 0.0)) {
    throw ConfigError(fmt::format("{}::eps = {} is invalid; use a value >= 0", options_name, eps));
  }
}

} // namespace largo::optim
