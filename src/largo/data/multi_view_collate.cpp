// VISSL's multicrop_collator and simclr_collator orders (multi_view_collate.h).
#include "largo/data/multi_view_collate.h"

namespace largo::data {

at::Tensor labels_per_view(const at::Tensor& labels, int64_t num_views) {
  TORCH_CHECK(labels.dim() == 1, "labels_per_view: labels must be [batch], got ", labels.sizes());
  TORCH_CHECK(num_views >= 1, "labels_per_view: num_views must be >= 1, got ", num_views);
  return labels.repeat({num_views});
}

at::Tensor simclr_collate(const std::vector<at::Tensor>& views) {
  TORCH_CHECK(!views.empty(), "simclr_collate: no views");
  for (size_t k = 1; k < views.size(); ++k) {
    TORCH_CHECK(
        views[k].sizes() == views[0].sizes(),
        "simclr_collate: view ",
        k,
        " has shape ",
        views[k].sizes(),
        " but view 0 has ",
        views[0].sizes(),
        "; SimCLR's collator stacks views of one size (use the views as they are for "
        "multi-crop)");
  }
  return at::cat(views, 0);
}

} // namespace largo::data
