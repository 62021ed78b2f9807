// YAML files compiled into the library, so the program runs from any directory:
// the defaults tree (configs/defaults.yaml) and the default training job
// (configs/default_job.yaml, used by `largo train` when no config file is given).
#pragma once

namespace largo::embedded {

const char* defaults_yaml();
const char* default_job_yaml();

} // namespace largo::embedded
