#include "core/sysinfo.h"

#include <sys/statvfs.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>

namespace kivi::sys {

uint64_t available_memory_bytes() {
  std::ifstream f("/proc/meminfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("MemAvailable:", 0) == 0) {
      std::istringstream is(line.substr(13));
      uint64_t kb = 0;
      is >> kb;
      return kb * 1024;
    }
  }
  return 0;
}

uint64_t last_level_cache_bytes() {
  long best = 0;
  for (int name : {_SC_LEVEL4_CACHE_SIZE, _SC_LEVEL3_CACHE_SIZE, _SC_LEVEL2_CACHE_SIZE}) {
    const long v = sysconf(name);
    if (v > best) best = v;
  }
  return static_cast<uint64_t>(best);
}

double load_average() {
  std::ifstream f("/proc/loadavg");
  double v = -1;
  if (!(f >> v)) return -1;
  return v;
}

uint64_t free_disk_bytes(const std::string& path) {
  struct statvfs st;
  std::string dir = path;
  if (statvfs(dir.c_str(), &st) != 0) {
    const auto slash = dir.find_last_of('/');
    dir = slash == std::string::npos ? "." : (slash == 0 ? "/" : dir.substr(0, slash));
    if (statvfs(dir.c_str(), &st) != 0) return 0;
  }
  return static_cast<uint64_t>(st.f_bavail) * st.f_frsize;
}

bool is_tty(int fd) { return isatty(fd) == 1; }

std::string human_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024.0 && u < 4) {
    bytes /= 1024.0;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.2f %s", bytes, units[u]);
  return buf;
}

}  // namespace kivi::sys
