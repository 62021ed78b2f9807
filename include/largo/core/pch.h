// Precompiled header for Largo's own targets: the heavy, stable headers that almost
// every translation unit includes. Not part of the public API.
#pragma once

#include <torch/torch.h>

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <yaml-cpp/yaml.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>
