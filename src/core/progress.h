// A progress bar on stderr for long runs: done/total, rate and ETA. It draws only
// when stderr is a terminal and the tool was not asked for --json, and redraws at
// most ten times a second.
#pragma once

#include <cstdint>
#include <string>

namespace kivi {

class Progress {
 public:
  // enabled=false makes every call a no-op (use for --json and non-terminals).
  Progress(std::string label, int64_t total, std::string unit, bool enabled);
  ~Progress();
  void update(int64_t done);
  void set_total(int64_t total) { total_ = total; }
  void finish();

  // True when stderr is a terminal: the default for `enabled`.
  static bool stderr_is_terminal();

 private:
  void draw(bool final);
  std::string label_, unit_;
  int64_t total_, done_ = 0;
  bool enabled_, finished_ = false;
  double start_, last_draw_ = 0;
};

}  // namespace kivi
