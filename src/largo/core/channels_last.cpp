#include <largo/core/channels_last.h>

namespace largo {

bool has_channels_last_strides(const at::Tensor& tensor) {
  return tensor.dim() == 4 &&
         tensor.strides() == at::IntArrayRef(c10::get_channels_last_strides_2d(tensor.sizes()));
}

at::Tensor to_channels_last(const at::Tensor& tensor, bool pinned) {
  TORCH_CHECK(
      tensor.dim() == 4,
      "to_channels_last: a 4-D tensor [N, C, H, W] is needed, got ",
      tensor.dim(),
      "-D");
  if (has_channels_last_strides(tensor) && (!pinned || tensor.is_pinned())) {
    return tensor;
  }
  // Explicit strides: contiguous(ChannelsLast) keeps NCHW's where they are ambiguous.
  at::Tensor result = at::empty(
      tensor.sizes(),
      tensor.options().memory_format(at::MemoryFormat::ChannelsLast).pinned_memory(pinned));
  result.copy_(tensor);
  return result;
}

} // namespace largo
