// A one-line progress bar on the terminal, redrawn in place. It draws only when standard
// error is a terminal, so logs captured to files or CI stay clean.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace largo::train {

class ProgressBar {
 public:
  ProgressBar();
  // Redraws at most ~10 times a second: `done` of `total` steps, then `text`.
  void update(int64_t done, int64_t total, const std::string& text);
  // Erase the bar (before a log line is printed, and at the end of a phase).
  void clear();
  bool enabled() const {
    return enabled_;
  }

 private:
  bool enabled_;
  bool drawn_ = false;
  std::chrono::steady_clock::time_point last_draw_;
};

} // namespace largo::train
