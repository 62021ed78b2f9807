#include <largo/precision/tf32.h>

#include <largo/core/torch_compat.h>

namespace largo::precision {

void apply_tf32(const Tf32Options& options) {
  compat::set_allow_tf32(options.matmul, options.cudnn);
}

} // namespace largo::precision
