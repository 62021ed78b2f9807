// Swapping submodules of a model after it is built (e.g. every BatchNorm2d for a
// SyncBatchNorm, parallel/data_parallel/sync_batch_norm.h), keeping their parameter names.
//
// Why this needs the parents' help: a libtorch module calls its children through typed
// members (`torch::nn::BatchNorm2d bn1_; ... bn1_(x)`), and a Sequential through its own
// list; Module::replace_module changes neither, so the old child would still run. And the
// member's static type decides which forward runs (forward is not virtual). So:
//  - a Sequential whose children change is rebuilt (same names, same order);
//  - any other parent must implement SwappableChildren and re-point the member that calls
//    the child. Largo's models do (ResNet blocks and stem, small CNN stages, TrunkHeadModel),
//    and call their norm layers through torch::nn::AnyModule members, so that the
//    replacement's own forward runs.
// A module to replace whose parent can do neither is an error naming its path.
// No collectives.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/container/sequential.h>

#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

namespace largo::models {

// What takes a child's place: a module with a plain forward (held by an AnyModule), or a
// rebuilt Sequential (which an AnyModule cannot hold: its forward is a template).
struct SwappedModule {
  torch::nn::AnyModule any;                  // set for a plain module
  torch::nn::Sequential sequential{nullptr}; // set for a Sequential
  std::shared_ptr<torch::nn::Module> module() const {
    return sequential ? sequential.ptr() : any.ptr();
  }
};

// Implemented by modules whose registered children may be swapped.
class SwappableChildren {
 public:
  virtual ~SwappableChildren() = default;
  // Replaces the registered child `name` by `replacement` (Module::replace_module) and
  // re-points the member through which forward calls it. Throws largo::Error for a child it
  // cannot swap, or a replacement of the wrong kind (a Sequential for an AnyModule member).
  virtual void swap_child(const std::string& name, const SwappedModule& replacement) = 0;
};

// The common swap_child of a module whose swappable children are Sequential members: replaces
// the registered child `name` of `parent` and re-points the matching member of `members`
// (child name -> the member that forward calls). Throws largo::Error naming the parent's
// type, `name` and the replacement's type for a child not in `members` or a replacement that
// is not a Sequential.
void swap_sequential_member(
    torch::nn::Module& parent,
    const std::string& name,
    const SwappedModule& replacement,
    std::initializer_list<std::pair<std::string_view, torch::nn::Sequential*>> members);

// Returns the replacement for the module at `path` ("trunk.3.bn1"), or an empty AnyModule
// to keep it (and look inside it).
using ModuleReplacer =
    std::function<torch::nn::AnyModule(const std::string& path, torch::nn::Module& module)>;

// Walks `root`'s tree depth first and swaps every module `replace` returns a replacement
// for (replacements are not walked into). Returns the root: `root` itself, or the
// replacement when the root was replaced or is a Sequential that had to be rebuilt.
// Throws largo::Error naming the path of a module whose parent cannot swap it.
std::shared_ptr<torch::nn::Module>
swap_modules(const std::shared_ptr<torch::nn::Module>& root, const ModuleReplacer& replace);

// The tensor registered as `name` ("weight", "running_mean") directly on `module`, or an
// undefined tensor.
at::Tensor direct_tensor(const torch::nn::Module& module, const std::string& name);

} // namespace largo::models
