#include <largo/models/attention_backend.h>

#include <ATen/Context.h>

#include <algorithm>
#include <array>
#include <stdexcept>

namespace largo::models {
namespace {

using Order = std::array<at::SDPBackend, at::num_sdp_backends>;

// ATen's order before Largo's first change: read once, so that kAuto restores it.
const Order& original_order() {
  static const Order order = at::globalContext().sDPPriorityOrder();
  return order;
}

at::SDPBackend aten_backend(AttentionBackend backend) {
  switch (backend) {
  case AttentionBackend::kFlash:
    return at::SDPBackend::flash_attention;
  case AttentionBackend::kMemoryEfficient:
    return at::SDPBackend::efficient_attention;
  case AttentionBackend::kCudnn:
    return at::SDPBackend::cudnn_attention;
  case AttentionBackend::kMath:
  case AttentionBackend::kAuto:
    break;
  }
  return at::SDPBackend::math;
}

// The names in AttentionBackend's order.
const std::array<const char*, 5> kNames = {"auto", "flash", "efficient", "cudnn", "math"};

} // namespace

void prefer_attention_backend(AttentionBackend backend) {
  Order order = original_order();
  if (backend != AttentionBackend::kAuto) {
    const auto first = std::find(order.begin(), order.end(), aten_backend(backend));
    std::rotate(order.begin(), first, first + 1); // it moves to the front, the rest keep order
  }
  std::vector<int64_t> ranks;
  for (at::SDPBackend entry : order) {
    ranks.push_back(static_cast<int64_t>(entry));
  }
  at::globalContext().setSDPPriorityOrder(ranks);
}

AttentionBackend preferred_attention_backend() {
  const Order order = at::globalContext().sDPPriorityOrder();
  if (order == original_order()) {
    return AttentionBackend::kAuto;
  }
  for (AttentionBackend backend :
       {AttentionBackend::kFlash,
        AttentionBackend::kMemoryEfficient,
        AttentionBackend::kCudnn,
        AttentionBackend::kMath}) {
    if (order.front() == aten_backend(backend)) {
      return backend;
    }
  }
  return AttentionBackend::kAuto; // an order set outside Largo, led by a backend it has no name for
}

std::vector<std::string> attention_backend_names() {
  return {kNames.begin(), kNames.end()};
}

AttentionBackend attention_backend_from_name(const std::string& name) {
  const auto found = std::find(kNames.begin(), kNames.end(), name);
  if (found == kNames.end()) {
    throw std::invalid_argument("no attention backend named " + name);
  }
  return static_cast<AttentionBackend>(found - kNames.begin());
}

} // namespace largo::models
