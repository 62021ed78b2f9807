#include "extract_command.h"

#include "commands.h"
#include <largo/core/logging.h>
#include <largo/train/feature_extraction.h>
#include <largo/train/worker_launch.h>

#include <cstdio>

namespace largo::app {

int run_extract_command(const Config& config, const std::vector<std::string>& arguments) {
  using Kind = train::TrainLaunchPlan::Kind;
  const train::TrainLaunchPlan launch = train::plan_train_launch(config);
  init_logging(launch.world ? launch.world->rank : 0, config.get_bool("VERBOSE"));
  // Everything the extraction would refuse is refused here, before workers start.
  train::RunPlan plan = train::resolve_extraction(config);
  if (launch.kind == Kind::kSpawnWorkers) {
    return spawn_workers(launch, "extract", arguments);
  }
  const train::ExtractionResult result = train::extract_features(plan);
  std::printf("%s\n", result.describe().c_str());
  return 0;
}

} // namespace largo::app
