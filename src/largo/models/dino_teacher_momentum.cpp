#include <largo/models/dino_teacher_momentum.h>

#include <largo/core/error.h>

#include <fmt/format.h>

#include <cmath>

namespace largo::models {

double dino_teacher_momentum(double base, int64_t iteration, int64_t max_iteration) {
  require_option(
      base >= 0.0 && base <= 1.0,
      "dino_teacher_momentum(base)",
      fmt::format("{}", base),
      "a number in [0, 1]");
  require_option(
      max_iteration > 0,
      "dino_teacher_momentum(max_iteration)",
      std::to_string(max_iteration),
      "an integer > 0");
  require_option(
      iteration >= 0,
      "dino_teacher_momentum(iteration)",
      std::to_string(iteration),
      "an integer >= 0");
  // Python's math.pi * iteration / max_iteration: the product first, then the quotient.
  const double angle = M_PI * static_cast<double>(iteration) / static_cast<double>(max_iteration);
  return 1.0 - 0.5 * (1.0 - base) * (std::cos(angle) + 1.0);
}

} // namespace largo::models
