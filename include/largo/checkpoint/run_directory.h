// The checkpoints of a run directory (CHECKPOINT.DIR): model_iteration{N}.torch,
// model_phase{E}.torch, model_final_checkpoint_phase{E}.torch, and checkpoint.torch, a
// symlink to the latest complete one, which is what a run resumes from; beside them
// model_best.torch, the weights of the best evaluation so far. No collectives.
#pragma once

#include <filesystem>
#include <optional>
#include <string>

namespace largo::checkpoint {

inline constexpr const char* kLatestCheckpointName = "checkpoint.torch";
// The model with the highest test top-1 so far (the Apex ImageNet example's model_best file):
// weights only, never resumed from.
inline constexpr const char* kBestModelName = "model_best.torch";

// Points `dir`/checkpoint.torch at `file_name` (in `dir`): a symlink made aside and renamed
// over the old one, so the name always refers to a complete checkpoint.
void point_latest_checkpoint_at(const std::filesystem::path& dir, const std::string& file_name);

// The checkpoint to resume from: `dir`/checkpoint.torch when it exists (nullopt otherwise).
// A dangling link is returned too, so that loading it reports it rather than starting over.
std::optional<std::filesystem::path> latest_checkpoint(const std::filesystem::path& dir);

} // namespace largo::checkpoint
