#include <largo/models/simclr_info_nce_loss.h>

#include <largo/comm/gather_with_gradient.h>
#include <largo/core/error.h>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <limits>

namespace largo::models {

at::Tensor simclr_info_nce_loss(
    const at::Tensor& embeddings, comm::ProcessGroup& group, const SimclrInfoNceOptions& options) {
  if (embeddings.dim() != 2 || embeddings.size(0) < 2 || embeddings.size(0) % 2 != 0) {
    throw Error(fmt::format(
        "simclr_info_nce_loss: embeddings of shape {} given; expected [2n, d]: two views of "
        "each of n images, view 0 of all n first",
        fmt::join(embeddings.sizes(), "x")));
  }
  if (!(options.temperature > 0.0) || !std::isfinite(options.temperature)) {
    throw OptionError(
        "SimclrInfoNceOptions::temperature",
        fmt::format("{}", options.temperature),
        "a number > 0");
  }
  const int64_t local_rows = embeddings.size(0);
  const int64_t images = local_rows / 2;
  const at::Tensor all = comm::all_gather_with_gradient(embeddings, group);
  const at::Tensor scores = at::mm(embeddings, all.t()) / options.temperature;

  // Row i of this rank is column first + i of the gathered embeddings; its positive is the
  // other view of the same image, n rows away.
  const int64_t first = static_cast<int64_t>(group.rank()) * local_rows;
  const auto index_options = at::TensorOptions().dtype(at::kLong).device(embeddings.device());
  const at::Tensor rows = at::arange(local_rows, index_options);
  const at::Tensor self_columns = rows + first;
  const at::Tensor positive_columns = (rows + images).remainder(local_rows) + first;

  // The anchor itself is neither positive nor negative: its score leaves the sum.
  const at::Tensor self_mask = at::zeros_like(scores, scores.options().dtype(at::kBool))
                                   .index_put_({rows, self_columns}, true);
  const at::Tensor others = scores.masked_fill(self_mask, -std::numeric_limits<double>::infinity());
  const at::Tensor positive = scores.index({rows, positive_columns});
  return (others.logsumexp(1) - positive).mean();
}

} // namespace largo::models
