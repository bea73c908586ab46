#include "core/progress.h"

#include <cstdio>
#include <cstdlib>

#include "core/sysinfo.h"
#include "core/timer.h"

namespace kivi {

bool Progress::stderr_is_terminal() { return sys::is_tty(2); }

double Progress::line_interval() {
  if (const char* s = std::getenv("KIVI_PROGRESS_SECONDS"); s && *s) {
    char* end = nullptr;
    const double v = std::strtod(s, &end);
    if (*end == '\0' && v >= 0.0 && v < 1e9) return v;
  }
  return 5.0;
}

Progress::Progress(std::string label, int64_t total, std::string unit, bool enabled)
    : label_(std::move(label)), unit_(std::move(unit)), total_(total), enabled_(enabled) {
  start_ = now_seconds();
  if (enabled_) {
    terminal_ = stderr_is_terminal();
    interval_ = line_interval();
    last_draw_ = start_;
  }
}

// Unwinding from an error: end the bar's line so the error starts on its own, but do
// not report a run that did not finish.
Progress::~Progress() {
  if (enabled_ && !finished_ && terminal_) std::fputc('\n', stderr);
}

void Progress::update(int64_t done) {
  done_ = done;
  if (!enabled_ || finished_) return;
  const double t = now_seconds();
  if (terminal_) {
    if (t - last_draw_ < 0.1 && done_ < total_) return;
    last_draw_ = t;
    draw(false);
  } else if (t - last_draw_ >= interval_) {
    last_draw_ = t;
    line(false);
  }
}

void Progress::finish() {
  if (!enabled_ || finished_) return;
  finished_ = true;
  if (terminal_) {
    draw(true);
    std::fputc('\n', stderr);
    std::fflush(stderr);
  } else if (lines_ > 0) {
    line(true);  // the run was long enough to report: say that it ended
  }
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

void Progress::line(bool final) {
  const double elapsed = now_seconds() - start_;
  const double rate = elapsed > 0 ? done_ / elapsed : 0.0;
  const double pct = total_ > 0 ? 100.0 * static_cast<double>(done_) / total_ : 0.0;
  if (final) {
    std::fprintf(stderr, "%s: %lld/%lld %s (%.0f%%), %.1f %s/s, took %.0f s\n", label_.c_str(),
                 static_cast<long long>(done_), static_cast<long long>(total_), unit_.c_str(), pct,
                 rate, unit_.c_str(), elapsed);
  } else {
    const double eta = rate > 0 ? (total_ - done_) / rate : 0.0;
    std::fprintf(stderr, "%s: %lld/%lld %s (%.0f%%), %.1f %s/s, ETA %.0f s\n", label_.c_str(),
                 static_cast<long long>(done_), static_cast<long long>(total_), unit_.c_str(), pct,
                 rate, unit_.c_str(), eta);
  }
  std::fflush(stderr);
  ++lines_;
}

}  // namespace kivi
