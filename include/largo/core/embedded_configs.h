// YAML files compiled into the library, so the program runs from any directory:
// the defaults tree (configs/defaults.yaml), VISSL's keys that it lacks
// (configs/vissl_keys.yaml, see core/vissl_keys.h) and the default training job
// (configs/default_job.yaml, used by `largo train` when no config file is given).
#pragma once

namespace largo::embedded {

const char* defaults_yaml();
const char* vissl_keys_yaml();
const char* default_job_yaml();

} // namespace largo::embedded
