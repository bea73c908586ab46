#include "core/progress.h"

#include <cstdio>

#include "core/sysinfo.h"
#include "core/timer.h"

namespace kivi {

bool Progress::stderr_is_terminal() { return sys::is_tty(2); }

Progress::Progress(std::string label, int64_t total, std::string unit, bool enabled)
    : label_(std::move(label)), unit_(std::move(unit)), total_(total), enabled_(enabled) {
  start_ = now_seconds();
}

Progress::~Progress() { finish(); }

void Progress::update(int64_t done) {
  done_ = done;
  if (!enabled_) return;
  const double t = now_seconds();
  if (t - last_draw_ < 0.1 && done_ < total_) return;
  last_draw_ = t;
  draw(false);
}

void Progress::finish() {
  if (!enabled_ || finished_) return;
  finished_ = true;
  draw(true);
  std::fputc('\n', stderr);
  std::fflush(stderr);
}

void Progress::draw(bool final) {
  const double elapsed = now_seconds() - start_;
  const double rate = elapsed > 0 ? done_ / elapsed : 0.0;
  const double frac = total_ > 0 ? static_cast<double>(done_) / total_ : 0.0;
  const int width = 30;
  const int filled = static_cast<int>(frac * width + 0.5);
  char bar[width + 1];
  for (int i = 0; i < width; ++i) bar[i] = i < filled ? '#' : '.';
  bar[width] = '\0';
  const double eta = rate > 0 ? (total_ - done_) / rate : 0.0;
  std::fprintf(stderr, "\r%s [%s] %lld/%lld %s  %.1f %s/s  %s %.0fs   ", label_.c_str(), bar,
               static_cast<long long>(done_), static_cast<long long>(total_), unit_.c_str(), rate,
               unit_.c_str(), final ? "took" : "ETA", final ? elapsed : eta);
  std::fflush(stderr);
}

}  // namespace kivi
