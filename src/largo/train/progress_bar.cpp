#include <largo/train/progress_bar.h>

#include <cstdio>
#include <unistd.h>

namespace largo::train {

ProgressBar::ProgressBar() : enabled_(::isatty(STDERR_FILENO) == 1) {}

void ProgressBar::update(int64_t done, int64_t total, const std::string& text) {
  if (!enabled_ || total <= 0) {
    return;
  }
  auto now = std::chrono::steady_clock::now();
  if (drawn_ && done < total && now - last_draw_ < std::chrono::milliseconds(100)) {
    return;
  }
  last_draw_ = now;
  constexpr int kWidth = 30;
  int filled = static_cast<int>(kWidth * done / total);
  std::string bar(filled, '#');
  bar.append(kWidth - filled, '.');
  std::fprintf(stderr, "\r\033[K[%s] %3d%% %s", bar.c_str(), static_cast<int>(100 * done / total),
               text.c_str());
  std::fflush(stderr);
  drawn_ = true;
}

void ProgressBar::clear() {
  if (enabled_ && drawn_) {
    std::fprintf(stderr, "\r\033[K");
    std::fflush(stderr);
    drawn_ = false;
  }
}

} // namespace largo::train
