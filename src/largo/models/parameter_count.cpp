#include <largo/models/parameter_count.h>

#include <unordered_set>

namespace largo::models {

int64_t count_parameters(const torch::nn::Module& module) {
  std::unordered_set<const void*> seen;
  int64_t total = 0;
  for (const auto& parameter : module.parameters(/*recurse=*/true)) {
    if (seen.insert(parameter.unsafeGetTensorImpl()).second) {
      total += parameter.numel();
    }
  }
  return total;
}

} // namespace largo::models
