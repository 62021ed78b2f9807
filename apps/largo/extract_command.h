// `largo extract CONFIG [KEY=VALUE ...]`: VISSL's extract_features engine from the command
// line (train/feature_extraction.h, docs/feature_extraction.md). Like `largo train`, it starts
// its own workers when DISTRIBUTED.NUM_NODES x NUM_PROC_PER_NODE > 1 and no launcher started it.
#pragma once

#include <largo/core/config.h>

#include <string>
#include <vector>

namespace largo::app {

// `arguments` are the command line after "extract" (the workers get them again). Each rank
// prints what it wrote, per split: the files and their shapes. Returns the exit code (0, or
// the workers' as run_launch returns it); throws what extract_features throws.
int run_extract_command(const Config& config, const std::vector<std::string>& arguments);

} // namespace largo::app
