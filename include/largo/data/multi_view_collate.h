// VISSL's two collators for several views per sample, on a loader's multi-view batch
// (Batch::views, one [batch, channels, h_k, w_k] tensor per view k):
//   multicrop_collator  (SwAV) the views as they are, one tensor per crop in crop order --
//                       what the loader delivers already -- and the labels repeated per crop;
//   simclr_collator     the same order concatenated into one tensor, [views * batch, ...]:
//                       sample n's view k at row k * batch + n (needs views of one size).
// Both order labels as VISSL does, view-major: labels of view 0, then of view 1, ...
#pragma once

#include <vector>

#include <ATen/ATen.h>

namespace largo::data {

// [views * batch]: `labels` [batch] repeated once per view (VISSL's output label list).
at::Tensor labels_per_view(const at::Tensor& labels, int64_t num_views);

// VISSL's simclr_collator: the views concatenated along the batch dimension. Throws
// c10::Error (TORCH_CHECK) for no views or views of different shapes.
at::Tensor simclr_collate(const std::vector<at::Tensor>& views);

} // namespace largo::data
