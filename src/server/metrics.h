// GET /metrics: the server's state in Prometheus' text exposition format (version
// 0.0.4): HTTP requests by route and status, the scheduler's requests and tokens, the
// queue, the KV block pool (blocks used, free, reserved, shared, labelled with the
// cache format) and its compression against an f16 cache of the same tokens.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "runtime/scheduler.h"

namespace kivi::server {

// HTTP responses counted by (route, status), from any thread.
class HttpCounters {
 public:
  void add(const std::string& route, int status);
  std::map<std::pair<std::string, int>, uint64_t> snapshot() const;

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, uint64_t> counts_;
};

std::string prometheus_text(const runtime::SchedulerStats& s,
                            const std::map<std::pair<std::string, int>, uint64_t>& http,
                            const std::string& model);

}  // namespace kivi::server
