#include <largo/train/resume_policy.h>

#include <largo/checkpoint/sharded_checkpoint.h>
#include <largo/checkpoint/zip_archive.h>
#include <largo/core/error.h>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <ctime>
#include <regex>

namespace largo::train {
namespace fs = std::filesystem;
namespace {

bool ends_with(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() &&
         text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool is_shard_file(const std::string& name) {
  static const std::regex shard(R"(.*_shard[0-9]+\.torch)");
  return name.size() < 4096 && std::regex_match(name, shard);
}

// "<file>.tmp.<pid>" -> pid, else 0.
pid_t temporary_writer(const std::string& name) {
  const size_t at = name.rfind(".tmp.");
  if (at == std::string::npos || at + 5 >= name.size() ||
      name.find_first_not_of("0123456789", at + 5) != std::string::npos || name.size() - at > 15) {
    return 0;
  }
  return static_cast<pid_t>(std::stoll(name.substr(at + 5)));
}

void require_entry(
    bool ok,
    const fs::path& path,
    const std::string& key,
    const std::string& expected,
    const c10::IValue* value) {
  if (!ok) {
    throw CheckpointError(fmt::format(
        "{} is not a Largo training checkpoint: its entry '{}' is {}, expected {}",
        path.string(),
        key,
        value == nullptr ? "missing" : fmt::format("a {}", value->tagKind()),
        expected));
  }
}

// The shard files a ZeRO checkpoint's optimizer entry lists must be beside it and intact.
void check_shards(const checkpoint::StateDict& state, const fs::path& path) {
  const c10::IValue& optimizer = state.at("optimizer");
  if (!checkpoint::is_sharded_optimizer_entry(optimizer)) {
    return;
  }
  auto files = optimizer.toGenericDict().find("shard_files");
  require_entry(
      files != optimizer.toGenericDict().end() && files->value().isList(),
      path,
      "optimizer.shard_files",
      "a list of file names",
      nullptr);
  for (const c10::IValue& file : files->value().toListRef()) {
    require_entry(file.isString(), path, "optimizer.shard_files", "a list of file names", &file);
    const fs::path shard = path.parent_path() / file.toStringRef();
    if (!fs::is_regular_file(shard)) {
      throw CheckpointError(fmt::format(
          "{} needs its optimizer shard {}, which is missing", path.string(), shard.string()));
    }
    checkpoint::ZipArchive(shard).verify_all();
  }
}

std::string utc_time_stamp() {
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char text[32];
  std::strftime(text, sizeof text, "%Y%m%dT%H%M%SZ", &utc);
  return text;
}

} // namespace

void check_training_checkpoint(const checkpoint::StateDict& state, const fs::path& path) {
  const auto entry = [&](const char* key) -> const c10::IValue* {
    auto it = state.find(key);
    return it == state.end() ? nullptr : &it->value();
  };
  const c10::IValue* model = entry("model");
  bool model_ok = model != nullptr && model->isGenericDict();
  if (model_ok) {
    for (const auto& item : model->toGenericDict()) {
      model_ok = model_ok && item.key().isString() && item.value().isTensor();
    }
  }
  require_entry(model_ok, path, "model", "a dict of parameter name -> tensor", model);
  const c10::IValue* optimizer = entry("optimizer");
  require_entry(optimizer && optimizer->isGenericDict(), path, "optimizer", "a dict", optimizer);
  for (const char* key : {"epoch", "iteration_in_epoch", "iteration", "iterations_per_epoch"}) {
    require_entry(entry(key) && entry(key)->isInt(), path, key, "an integer", entry(key));
  }
  require_entry(
      entry("complete") && entry("complete")->isBool(),
      path,
      "complete",
      "a boolean",
      entry("complete"));
  require_entry(
      entry("rng_state") && entry("rng_state")->isTensor(),
      path,
      "rng_state",
      "a tensor",
      entry("rng_state"));
  const auto optional = [&](const char* key,
                            bool (c10::IValue::*is)() const,
                            const char* expected,
                            bool none_allowed) {
    const c10::IValue* value = entry(key);
    require_entry(
        !value || (value->*is)() || (none_allowed && value->isNone()), path, key, expected, value);
  };
  optional("world_size", &c10::IValue::isInt, "an integer", false);
  optional("rng_states", &c10::IValue::isTensor, "a tensor", false);
  for (const char* key : {"top1", "top5", "best_top1"}) {
    optional(key, &c10::IValue::isDouble, "a number or None", true);
  }
}

std::vector<fs::path> checkpoint_files(const fs::path& run_dir) {
  std::vector<std::pair<fs::file_time_type, fs::path>> found;
  std::error_code ec;
  for (fs::directory_iterator it(run_dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (!ends_with(name, ".torch") || name == checkpoint::kLatestCheckpointName ||
        name == checkpoint::kBestModelName || is_shard_file(name) || !it->is_regular_file(ec)) {
      continue;
    }
    found.emplace_back(fs::last_write_time(it->path(), ec), it->path());
  }
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second > b.second;
  });
  std::vector<fs::path> files;
  for (auto& [time, path] : found) {
    files.push_back(std::move(path));
  }
  return files;
}

checkpoint::StateDict load_intact_checkpoint(const fs::path& path) {
  checkpoint::StateDict state = checkpoint::load_checkpoint(path);
  check_training_checkpoint(state, path);
  check_shards(state, path);
  return state;
}

// checkpoint.torch must be free for the link the run writes: a directory there would make the
// first checkpoint fail after an epoch of training.
void check_link_name_is_free(const fs::path& run_dir) {
  std::error_code ec;
  const fs::path link = run_dir / checkpoint::kLatestCheckpointName;
  if (fs::is_directory(fs::symlink_status(link, ec))) {
    throw CheckpointError(fmt::format(
        "{} is a directory; Largo keeps the link to the newest checkpoint under that name. "
        "Move or rename the directory",
        link.string()));
  }
}

std::optional<ResumeChoice> choose_resume_checkpoint(const fs::path& run_dir) {
  check_link_name_is_free(run_dir);
  const fs::path link = run_dir / checkpoint::kLatestCheckpointName;
  std::error_code ec;
  const fs::file_status link_status = fs::symlink_status(link, ec);
  std::string link_problem; // why checkpoint.torch is not used, for the warning
  fs::path link_target;
  if (!fs::exists(link_status)) {
    link_problem = fmt::format("{} is missing", link.string());
  } else if (fs::is_symlink(link_status) && !fs::exists(link, ec)) {
    link_problem = fmt::format(
        "{} points to {}, which does not exist",
        link.string(),
        fs::read_symlink(link, ec).string());
  } else {
    link_target = fs::is_symlink(link_status) ? fs::canonical(link, ec) : link;
    try {
      return ResumeChoice{link_target, load_intact_checkpoint(link_target), ""};
    } catch (const CheckpointError& e) {
      link_problem = e.what();
    }
  }
  std::vector<std::string> refused;
  for (const fs::path& candidate : checkpoint_files(run_dir)) {
    if (!link_target.empty() && fs::equivalent(candidate, link_target, ec)) {
      continue; // refused above
    }
    try {
      checkpoint::StateDict state = load_intact_checkpoint(candidate);
      std::string reasons = link_problem;
      for (const std::string& reason : refused) {
        reasons += "; and " + reason;
      }
      while (!reasons.empty() && reasons.back() == '.') {
        reasons.pop_back();
      }
      return ResumeChoice{
          candidate,
          std::move(state),
          fmt::format(
              "resuming from {}, the newest intact checkpoint, because "
              "{}. What was trained after it is trained again.",
              candidate.string(),
              reasons)};
    } catch (const CheckpointError& e) {
      refused.push_back(e.what());
    }
  }
  if (refused.empty() && link_target.empty()) {
    return std::nullopt; // no checkpoint at all: a first run
  }
  std::string reasons = link_target.empty() ? "" : "\n  " + link_problem;
  for (const std::string& reason : refused) {
    reasons += "\n  " + reason;
  }
  throw CheckpointError(fmt::format(
      "{} holds checkpoints but none is intact, so there is nothing to resume from:{}\nRestore "
      "a good copy, or start a new run in another CHECKPOINT.DIR (or set "
      "CHECKPOINT.AUTO_RESUME=False and CHECKPOINT.OVERWRITE_EXISTING=True to start over, "
      "keeping the old files in previous_runs/).",
      run_dir.string(),
      reasons));
}

std::optional<fs::path> prepare_fresh_start(const fs::path& run_dir, bool overwrite_existing) {
  check_link_name_is_free(run_dir);
  std::vector<fs::path> files = checkpoint_files(run_dir);
  std::error_code ec;
  if (fs::is_regular_file(run_dir / checkpoint::kBestModelName, ec)) {
    files.push_back(run_dir / checkpoint::kBestModelName); // history too: never overwritten
  }
  if (files.empty()) {
    return std::nullopt;
  }
  if (!overwrite_existing) {
    throw CheckpointError(fmt::format(
        "{} holds {} checkpoint file(s) (newest: {}) and this run starts from scratch, which "
        "would overwrite them. Resume instead (CHECKPOINT.AUTO_RESUME=True), choose another "
        "CHECKPOINT.DIR, or set CHECKPOINT.OVERWRITE_EXISTING=True to start over (the old "
        "files are moved into {}/previous_runs/, not deleted).",
        run_dir.string(),
        files.size(),
        files.front().filename().string(),
        run_dir.string()));
  }
  const fs::path aside = run_dir / "previous_runs" / utc_time_stamp();
  fs::create_directories(aside);
  std::vector<fs::path> moved;
  for (fs::directory_iterator it(run_dir), end; it != end; ++it) {
    const std::string name = it->path().filename().string();
    if (ends_with(name, ".torch") || ends_with(name, ".manifest.json") || name == "metrics.jsonl") {
      fs::rename(it->path(), aside / name);
      moved.push_back(aside / name);
    }
  }
  spdlog::warn(
      "starting from scratch (CHECKPOINT.OVERWRITE_EXISTING): the previous run's {} "
      "files (checkpoints, metrics.jsonl) were moved into {}",
      moved.size(),
      aside.string());
  return aside;
}

std::vector<fs::path> remove_stale_temporaries(const fs::path& run_dir) {
  std::vector<fs::path> removed;
  std::error_code ec;
  for (fs::directory_iterator it(run_dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const pid_t writer = temporary_writer(name);
    const bool stale_link = name == std::string(checkpoint::kLatestCheckpointName) + ".tmp";
    // kill(pid, 0): 0 or EPERM means a process has that pid (perhaps another user's).
    const bool writer_gone = writer > 0 && ::kill(writer, 0) != 0 && errno == ESRCH;
    if (stale_link || writer_gone) {
      std::error_code remove_error;
      if (fs::remove(it->path(), remove_error)) {
        removed.push_back(it->path());
      }
    }
  }
  if (!removed.empty()) {
    spdlog::info(
        "removed {} temporary file(s) left in {} by interrupted writes",
        removed.size(),
        run_dir.string());
  }
  return removed;
}

} // namespace largo::train
