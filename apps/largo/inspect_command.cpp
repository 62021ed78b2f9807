// `largo inspect sampler`: one rank's sample indices for an epoch, from the same sampler
// classes the trainer uses (data/sampler.h), so an order can be checked against PyTorch's
// DistributedSampler or VISSL's StatefulDistributedSampler without training.
#include "commands.h"

#include <largo/core/error.h>
#include <largo/data/sampler.h>

#include <fmt/format.h>

namespace largo::app {

std::string inspect_sampler(const InspectSamplerArguments& a) {
  auto fail = [](const std::string& message) { throw ConfigError(message); };
  if (a.size < 0) {
    fail(fmt::format("--size = {}: expected the dataset size, >= 0", a.size));
  }
  if (a.world_size < 1) {
    fail(fmt::format("--world_size = {}: expected the number of ranks, >= 1", a.world_size));
  }
  if (a.rank < 0 || a.rank >= a.world_size) {
    fail(fmt::format("--rank = {} with --world_size = {}: expected 0 <= rank < world_size", a.rank,
                     a.world_size));
  }
  if (a.epoch < 0) {
    fail(fmt::format("--epoch = {}: expected >= 0", a.epoch));
  }
  if (a.shuffle != 0 && a.shuffle != 1) {
    fail(fmt::format("--shuffle = {}: expected 0 or 1", a.shuffle));
  }
  std::vector<int64_t> indices;
  if (a.stateful) {
    if (a.shuffle == 0) {
      fail("--stateful --shuffle 0: VISSL's StatefulDistributedSampler always shuffles each "
           "rank's block; leave out --shuffle, or --stateful for PyTorch's DistributedSampler");
    }
    if (a.batch_size != -1 && a.batch_size < 1) {
      fail(fmt::format("--batch_size = {}: expected >= 1", a.batch_size));
    }
    if (a.start_iter != -1 && a.start_iter < 0) {
      fail(fmt::format("--start_iter = {}: expected >= 0", a.start_iter));
    }
    if (a.start_iter > 0 && a.batch_size == -1) {
      fail("--start_iter counts batches: give --batch_size too");
    }
    // --drop_last is implied: the stateful sampler always drops the tail.
    data::StatefulDistributedSampler sampler(a.size, a.world_size, a.rank,
                                             a.batch_size == -1 ? 1 : a.batch_size, a.seed);
    sampler.set_epoch(a.epoch);
    sampler.set_start_iter(a.start_iter == -1 ? 0 : a.start_iter);
    indices = sampler.indices();
  } else {
    if (a.batch_size != -1 || a.start_iter != -1) {
      fail("--batch_size and --start_iter belong to --stateful (VISSL's sampler resumes at a "
           "batch); PyTorch's DistributedSampler has no start iteration");
    }
    data::DistributedSampler sampler(a.size, a.world_size, a.rank, a.shuffle == 1, a.seed,
                                     a.drop_last);
    sampler.set_epoch(a.epoch);
    indices = sampler.indices();
  }
  return fmt::format("{}", fmt::join(indices, " "));
}

} // namespace largo::app
