// What to tell a user whose collective failed to start, from c10d's reason: a refusal by NCCL
// reads differently from a lost peer, and each needs other advice.
#pragma once

#include <string>

namespace largo::comm::detail {

// The advice that follows "<collective> failed: <c10d_reason>." in a CommError.
std::string launch_failure_advice(const std::string& c10d_reason);

} // namespace largo::comm::detail
