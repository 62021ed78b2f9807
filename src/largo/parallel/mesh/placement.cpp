#include <largo/parallel/mesh/placement.h>

#include <largo/core/error.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <utility>

namespace largo::parallel {

std::string Placement::describe() const {
  switch (kind) {
  case Kind::kReplicate:
    return "Replicate";
  case Kind::kFlatShard:
    return "FlatShard";
  case Kind::kShard:
    return blocks == 1 ? fmt::format("Shard({})", dim)
                       : fmt::format("Shard({}, {} blocks)", dim, blocks);
  case Kind::kOwnedBy:
    return fmt::format("OwnedBy({})", owner);
  }
  return "?";
}

bool Placement::operator==(const Placement& other) const {
  return kind == other.kind && dim == other.dim && blocks == other.blocks && owner == other.owner;
}

std::string describe(const Placements& placements) {
  std::vector<std::string> entries;
  for (const auto& [dimension, placement] : placements) {
    if (placement.kind != Placement::Kind::kReplicate) {
      entries.push_back(fmt::format("{}: {}", dimension, placement.describe()));
    }
  }
  return fmt::format("{{{}}}", fmt::join(entries, ", "));
}

StatePlacements::StatePlacements(std::vector<ParameterPlacement> parameters)
    : parameters_(std::move(parameters)) {}

void StatePlacements::place(
    const std::string& name,
    const std::string& dimension,
    Placement value,
    Placement optimizer_state) {
  auto found =
      std::find_if(parameters_.begin(), parameters_.end(), [&](const ParameterPlacement& p) {
        return p.name == name;
      });
  if (found == parameters_.end()) {
    throw Error(fmt::format(
        "placement over {} of '{}': not a trained parameter of this rank", dimension, name));
  }
  found->value[dimension] = value;
  found->optimizer_state[dimension] = optimizer_state;
}

void StatePlacements::place_all(
    const std::string& dimension, Placement value, Placement optimizer_state) {
  placed_for_all_[dimension] = {value, optimizer_state};
  for (ParameterPlacement& parameter : parameters_) {
    parameter.value[dimension] = value;
    parameter.optimizer_state[dimension] = optimizer_state;
  }
}

namespace {

bool any_placement(
    const std::vector<ParameterPlacement>& parameters,
    Placements ParameterPlacement::*of,
    Placement::Kind kind) {
  return std::any_of(parameters.begin(), parameters.end(), [&](const ParameterPlacement& p) {
    return std::any_of((p.*of).begin(), (p.*of).end(), [kind](const auto& entry) {
      return entry.second.kind == kind;
    });
  });
}

} // namespace

bool StatePlacements::any_value(Placement::Kind kind) const {
  return any_placement(parameters_, &ParameterPlacement::value, kind);
}

bool StatePlacements::any_optimizer_state(Placement::Kind kind) const {
  return any_placement(parameters_, &ParameterPlacement::optimizer_state, kind);
}

bool StatePlacements::module_holds_whole_model() const {
  return !any_value(Placement::Kind::kFlatShard) && !any_value(Placement::Kind::kShard) &&
         !any_value(Placement::Kind::kOwnedBy);
}

bool StatePlacements::module_holds_gathered_copies() const {
  return any_value(Placement::Kind::kFlatShard);
}

bool StatePlacements::cover_whole_model() const {
  return !any_value(Placement::Kind::kOwnedBy);
}

bool StatePlacements::optimizer_state_in_flat_pieces() const {
  return any_optimizer_state(Placement::Kind::kFlatShard) &&
         !any_optimizer_state(Placement::Kind::kShard) &&
         !any_optimizer_state(Placement::Kind::kOwnedBy);
}

std::vector<std::string> StatePlacements::dimensions_to_gather(bool optimizer_state) const {
  std::vector<std::string> dimensions;
  auto list = [&](const std::string& dimension, const Placement& placement, Placement::Kind kind) {
    if (placement.kind == kind &&
        std::find(dimensions.begin(), dimensions.end(), dimension) == dimensions.end()) {
      dimensions.push_back(dimension);
    }
  };
  for (const Placement::Kind kind : {Placement::Kind::kShard, Placement::Kind::kOwnedBy}) {
    for (const auto& [dimension, placements] : placed_for_all_) {
      list(dimension, optimizer_state ? placements.second : placements.first, kind);
    }
    for (const ParameterPlacement& parameter : parameters_) {
      for (const auto& [dimension, placement] :
           optimizer_state ? parameter.optimizer_state : parameter.value) {
        list(dimension, placement, kind);
      }
    }
  }
  return dimensions;
}

std::string StatePlacements::describe() const {
  // Distinct (value, optimizer state) descriptions in order of first appearance, counted.
  std::vector<std::pair<std::string, int>> kinds;
  for (const ParameterPlacement& parameter : parameters_) {
    const std::string text = fmt::format(
        "value {}, optimizer state {}",
        parallel::describe(parameter.value),
        parallel::describe(parameter.optimizer_state));
    auto found = std::find_if(
        kinds.begin(), kinds.end(), [&](const auto& kind) { return kind.first == text; });
    if (found == kinds.end()) {
      kinds.emplace_back(text, 1);
    } else {
      ++found->second;
    }
  }
  std::vector<std::string> lines;
  for (const auto& [text, count] : kinds) {
    lines.push_back(fmt::format("{}: {} parameter{}", text, count, count == 1 ? "" : "s"));
  }
  return lines.empty() ? "no trained parameters" : fmt::format("{}", fmt::join(lines, "; "));
}

} // namespace largo::parallel
