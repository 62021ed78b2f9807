// Per-tensor norms computed from partial sums, and the hook that completes them across
// ranks. LARC (||p||, ||g||), LAMB (||p||, ||update||) and global-norm gradient clipping
// all need norms of whole parameters; under ZeRO a rank holds only a subset of the
// parameters or 1-D pieces of them, so each rank computes *partial* quantities of what it
// holds (sums of squares, or a maximum) and a reducer completes them across ranks before
// anything is decided from them (e.g. "is this norm zero?").
//
// The reducer is injectable: an unsharded optimizer uses none (the identity); a sharded
// wrapper sets one that all-reduces (SUM or MAX) over its process group. It is called once
// per step with every partial of that step in one tensor, so a step costs one collective.
// Collective: whatever the installed reducer issues; every rank must call the optimizer's
// step() (or clip_grad_norm) so that the reducers are reached in the same order.
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <vector>

namespace largo::optim {

enum class NormReduceOp { sum, max };

// Receives this rank's partials (1-D, float64, on the tensors' device) and returns the
// completed values, same shape: the element-wise SUM (sums of squares, sums of |x|^p) or MAX
// (infinity norms) over all ranks. An empty function means the identity (one rank, or every
// rank holds whole tensors and nothing needs completing).
using PartialNormReducer =
    std::function<at::Tensor(const at::Tensor& local_partials, NormReduceOp op)>;

// Applies `reducer` to `partials`, or returns them unchanged when it is empty.
at::Tensor reduce_partials(
    const PartialNormReducer& reducer, const at::Tensor& partials, NormReduceOp op);

// [tensors.size()] float64 on the tensors' device: sum of x^2 over each tensor. CPU
// float32/float64 tensors go through one multi-threaded pass (blocks of 64 summed in the
// tensor's type, block sums in float64) whose result does not depend on the thread count;
// other tensors use ATen's norm in float64. All tensors must be on
// one device. An empty list gives an empty CPU tensor.
at::Tensor squared_norms(const std::vector<at::Tensor>& tensors);

} // namespace largo::optim
