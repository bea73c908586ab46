// Progress of long runs on stderr: done/total, rate and ETA. On a terminal it is a bar
// redrawn in place at most ten times a second. When stderr is not a terminal (a log file,
// a pipe) it is a plain line every few seconds (KIVI_PROGRESS_SECONDS, default 5), so a
// long run still shows it is alive; a run shorter than that prints nothing. Tools pass
// enabled = false for --json.
#pragma once

#include <cstdint>
#include <string>

namespace kivi {

class Progress {
 public:
  // enabled=false makes every call a no-op (--json output).
  Progress(std::string label, int64_t total, std::string unit, bool enabled);
  ~Progress();
  void update(int64_t done);
  void set_total(int64_t total) { total_ = total; }
  void finish();

  // True when stderr is a terminal (then the bar is drawn, else lines are printed).
  static bool stderr_is_terminal();
  // Seconds between lines when stderr is not a terminal: $KIVI_PROGRESS_SECONDS if it is
  // a number >= 0, else 5.
  static double line_interval();

 private:
  void draw(bool final);
  void line(bool final);
  std::string label_, unit_;
  int64_t total_, done_ = 0;
  bool enabled_, terminal_ = false, finished_ = false;
  int lines_ = 0;  // lines printed (non-terminal)
  double start_, last_draw_ = 0, interval_ = 5.0;
};

}  // namespace kivi
