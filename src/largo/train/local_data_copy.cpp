#include <largo/train/local_data_copy.h>

#include <largo/core/error.h>
#include <largo/data/local_copy.h>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <utility>
#include <vector>

namespace largo::train {
namespace {

// The sources this run reads that are to be copied, with the key of their split.
std::vector<std::pair<std::string, data::DataSourceOptions*>>
sources_to_copy(TrainerOptions& options) {
  std::vector<std::pair<std::string, data::DataSourceOptions*>> sources;
  if (!options.test_only && !options.train.source.local_copy_dir.empty()) {
    sources.emplace_back("DATA.TRAIN", &options.train.source);
  }
  if (options.reads_test_split() && !options.test.source.local_copy_dir.empty()) {
    sources.emplace_back("DATA.TEST", &options.test.source);
  }
  return sources;
}

// The first rank of each machine's part: the copies, or why they failed ("" when whole).
std::string
copy_sources(const std::vector<std::pair<std::string, data::DataSourceOptions*>>& sources) {
  for (const auto& [key, source] : sources) {
    try {
      data::copy_to_local_disk(source->path, source->local_copy_dir);
      if (!source->label_path.empty()) {
        data::copy_to_local_disk(source->label_path, source->local_copy_dir);
      }
    } catch (const std::exception& error) {
      return fmt::format("{}.COPY_TO_LOCAL_DISK: {}", key, error.what());
    }
  }
  return "";
}

} // namespace

TrainerOptions with_local_data_copies(
    const TrainerOptions& options, comm::ProcessGroup& group, int procs_per_node) {
  TrainerOptions local = options;
  const auto sources = sources_to_copy(local);
  if (sources.empty()) {
    return local;
  }
  const bool copies = group.rank() % std::max(1, procs_per_node) == 0;
  const std::string failure = copies ? copy_sources(sources) : "";
  // Nobody reads before every machine's copies are whole, and a failure stops every rank.
  const at::Tensor failed_ranks = at::tensor({failure.empty() ? 0.0F : 1.0F});
  group.all_reduce(failed_ranks);
  if (!failure.empty()) {
    throw DataError(failure);
  }
  if (failed_ranks.item<float>() > 0) {
    throw DataError(
        "copying the data to the local disk (COPY_TO_LOCAL_DISK) failed on another rank (the "
        "first of its machine, which copies for it); that rank's log says why");
  }
  for (const auto& [key, source] : sources) {
    const std::filesystem::path original = source->path;
    source->path = data::local_copy_path(source->path, source->local_copy_dir);
    if (!source->label_path.empty()) {
      source->label_path = data::local_copy_path(source->label_path, source->local_copy_dir);
    }
    if (group.rank() == 0) {
      spdlog::info(
          "{}: reading {} (the local copy of {})", key, source->path.string(), original.string());
    }
  }
  return local;
}

} // namespace largo::train
