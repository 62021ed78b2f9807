// An all-gather that autograd goes through (VISSL's GatherLayer, used by its contrastive
// losses): every rank's [n, ...] `local` tensor, stacked along dim 0 in rank order
// ([world_size * n, ...]), whose backward sums the gathered tensor's gradient over the ranks
// (an all-reduce) and returns this rank's rows. So the gradient each rank gets for its own
// rows is the derivative of the sum over ranks of whatever each rank computed from the
// gathered tensor; data parallelism's averaging of parameter gradients then makes it the
// derivative of the ranks' mean, as for one process on the whole batch.
//
// A collective in forward and in backward: every rank must call it, with tensors of the same
// shape and dtype, and run a backward through the gathered tensor (a rank whose loss does not
// use it would leave the others waiting in the all-reduce). The group must outlive the
// backward. On one process it is the identity.
#pragma once

#include <largo/comm/process_group.h>

#include <ATen/Tensor.h>

namespace largo::comm {

at::Tensor all_gather_with_gradient(const at::Tensor& local, ProcessGroup& group);

} // namespace largo::comm
