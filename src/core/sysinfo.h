// What the machine offers: memory, disk, terminals.
#pragma once

#include <cstdint>
#include <string>

namespace kivi::sys {

// MemAvailable from /proc/meminfo in bytes, or 0 if unknown.
uint64_t available_memory_bytes();

// The largest cache level's size in bytes (the L3 on x86), or 0 if unknown.
uint64_t last_level_cache_bytes();

// The 1-minute load average from /proc/loadavg, or -1 if unknown (benchmarks on a
// shared machine report it beside their numbers).
double load_average();

// Free bytes on the file system holding `path` (or its parent directory), 0 if unknown.
uint64_t free_disk_bytes(const std::string& path);

// True if the file descriptor is a terminal.
bool is_tty(int fd);

// "1.50 GiB", "512.0 KiB", ...
std::string human_bytes(double bytes);

}  // namespace kivi::sys
