#include "failure_advice.h"

namespace largo::comm::detail {

std::string launch_failure_advice(const std::string& c10d_reason) {
  // NCCL answers "invalid usage" for calls it refuses outright, not for a lost peer: two
  // ranks on one GPU (NCCL wants a GPU per rank), or tensors on another device than the
  // communicator's. Saying a peer died would send the user looking in the wrong place.
  if (c10d_reason.find("NCCL") != std::string::npos &&
      c10d_reason.find("invalid usage") != std::string::npos) {
    return "NCCL refused the call (no peer died): NCCL needs one GPU per rank and every "
           "tensor on this rank's GPU; run with NCCL_DEBUG=WARN to see why, or use "
           "DISTRIBUTED.BACKEND gloo for ranks that share a GPU";
  }
  return "A peer process has probably died or stalled; check the other ranks' logs";
}

} // namespace largo::comm::detail
