#include <largo/models/deepclusterv2_loss.h>

#include <largo/core/error.h>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>

namespace largo::models {

at::Tensor deepclusterv2_loss(
    const at::Tensor& embeddings,
    const std::vector<at::Tensor>& centroids,
    const at::Tensor& targets,
    const DeepClusterV2LossOptions& options) {
  const auto heads = static_cast<int64_t>(centroids.size());
  bool shapes_fit = embeddings.dim() == 2 && heads > 0 && targets.dim() == 2 &&
                    targets.size(0) == heads && targets.size(1) == embeddings.size(0);
  for (const at::Tensor& c : centroids) {
    shapes_fit = shapes_fit && c.dim() == 2 && c.size(1) == embeddings.size(1);
  }
  if (!shapes_fit) {
    throw Error(fmt::format(
        "deepclusterv2_loss: embeddings [{}], {} centroid set(s) and targets [{}] given; "
        "expected embeddings [m, d], centroids [K, d] each and targets [heads, m]",
        fmt::join(embeddings.sizes(), ", "),
        heads,
        fmt::join(targets.sizes(), ", ")));
  }
  if (!(options.temperature > 0.0) || !std::isfinite(options.temperature)) {
    throw OptionError(
        "DeepClusterV2LossOptions::temperature",
        fmt::format("{}", options.temperature),
        "a number > 0");
  }
  const at::Tensor normalized =
      embeddings / embeddings.norm(2, 1, /*keepdim=*/true).clamp_min(1e-12);
  at::Tensor loss = at::zeros({}, embeddings.options());
  for (int64_t h = 0; h < heads; ++h) {
    const at::Tensor scores = at::mm(normalized, centroids[h].detach().t()) / options.temperature;
    loss = loss + at::cross_entropy_loss(
                      scores,
                      targets[h],
                      /*weight=*/{},
                      at::Reduction::Mean,
                      /*ignore_index=*/kDeepClusterV2Unassigned);
  }
  return loss / static_cast<double>(heads);
}

} // namespace largo::models
