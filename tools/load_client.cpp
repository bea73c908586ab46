#include "load_client.h"

#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

namespace kivi::tools {

namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

// splitmix64: the same numbers on every platform (std's distributions are not).
uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

const char* const kWords[] = {
    "once", "upon",  "a",     "time", "there",  "was",  "little", "girl",  "named", "lily",
    "she",  "liked", "to",    "play", "with",   "her",  "ball",   "in",    "the",   "park",
    "one",  "day",   "saw",   "big",  "dog",    "and",  "it",     "ran",   "away",  "happy",
    "sad",  "tree",  "bird",  "sang", "sun",    "was",  "warm",   "they",  "went",  "home",
    "mom",  "said",  "we",    "can",  "bake",   "cake", "boy",    "tom",   "found", "box",
    "red",  "blue",  "small", "cat",  "jumped", "over", "fence",  "river", "boat",  "friend"};
constexpr int kNumWords = sizeof(kWords) / sizeof(kWords[0]);

// Runs one request; fills `r`, `gaps` (ms between successive text chunks) and `reply`.
void one_request(httplib::Client& c, const LoadOptions& o, int i, const std::string& prompt,
                 Clock::time_point deadline, RequestResult& r, std::vector<double>& gaps,
                 std::string* reply) {
  json body = {
      {"prompt", prompt},
      {"max_tokens", o.max_tokens},
      {"temperature", o.temperature},
      {"seed", static_cast<int64_t>(mix(o.seed ^ (0x5EEDull + static_cast<uint64_t>(i))) >> 12)},
      {"stream", true},
      {"stream_options", {{"include_usage", true}}}};
  if (o.ignore_eos) body["ignore_eos"] = true;
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  if (!o.api_key.empty()) req.set_header("Authorization", "Bearer " + o.api_key);

  const auto t0 = Clock::now();
  Clock::time_point last;
  std::string pending, raw;
  bool done = false, cut = false, usage = false;
  req.content_receiver = [&](const char* d, size_t n, uint64_t, uint64_t) {
    if (raw.size() < 4096) raw.append(d, std::min(n, 4096 - raw.size()));
    pending.append(d, n);
    for (size_t e; (e = pending.find("\n\n")) != std::string::npos;) {
      const std::string event = pending.substr(0, e);
      pending.erase(0, e + 2);
      if (event.rfind("data: ", 0) != 0) continue;
      const std::string data = event.substr(6);
      if (data == "[DONE]") {
        done = true;
        continue;
      }
      const json j = json::parse(data, nullptr, false);
      if (!j.is_object()) {
        r.error = "an event that is not JSON: " + data.substr(0, 200);
        continue;
      }
      if (j.contains("error")) {
        r.error = j["error"].value("message", std::string("error event"));
        continue;
      }
      if (j.contains("usage") && j["usage"].is_object()) {
        r.prompt_tokens = j["usage"].value("prompt_tokens", 0);
        r.completion_tokens = j["usage"].value("completion_tokens", 0);
        const json& d = j["usage"].contains("prompt_tokens_details")
                            ? j["usage"]["prompt_tokens_details"]
                            : json::object();
        r.cached_tokens = d.is_object() ? d.value("cached_tokens", 0) : 0;
        usage = true;
      }
      if (j.contains("choices") && j["choices"].is_array() && !j["choices"].empty()) {
        const json& ch = j["choices"][0];
        if (ch.contains("text") && ch["text"].is_string() &&
            !ch["text"].get<std::string>().empty()) {
          *reply += ch["text"].get<std::string>();
          const auto now = Clock::now();
          if (r.chunks == 0) {
            r.ttft_ms = ms_between(t0, now);
          } else {
            gaps.push_back(ms_between(last, now));
          }
          last = now;
          ++r.chunks;
        }
      }
    }
    if (Clock::now() > deadline) {
      cut = true;
      return false;
    }
    return true;
  };
  httplib::Response res;
  httplib::Error err = httplib::Error::Success;
  const bool sent = c.send(req, res, err);
  r.total_ms = ms_between(t0, Clock::now());
  r.status = sent ? res.status : 0;
  if (cut || (!sent && Clock::now() >= deadline)) {
    r.outcome = RequestResult::Outcome::kCut;
  } else if (!sent) {
    r.outcome = RequestResult::Outcome::kError;
    r.error = "no response: " + httplib::to_string(err);
  } else if (res.status == 503) {
    r.outcome = RequestResult::Outcome::kRejected;
  } else if (res.status != 200) {
    r.outcome = RequestResult::Outcome::kError;
    const json j = json::parse(raw, nullptr, false);
    r.error = j.is_object() && j.contains("error") && j["error"].is_object()
                  ? j["error"].value("message", raw)
                  : raw.substr(0, 200);
  } else if (done && usage && r.error.empty()) {
    r.outcome = RequestResult::Outcome::kCompleted;
  } else {
    r.outcome = RequestResult::Outcome::kError;
    if (r.error.empty()) r.error = "the stream ended without usage and [DONE]";
  }
}

// Polls /metrics until `stop`, keeping the peaks.
struct Monitor {
  std::atomic<bool> stop{false};
  std::mutex mu;
  double kv_bytes = 0, queue_depth = 0, active = 0, blocks_shared = 0;
  void run(httplib::Client& c, const httplib::Headers& h) {
    while (!stop.load()) {
      const auto res = c.Get("/metrics", h);
      if (res && res->status == 200) {
        const ServerSample s = scrape_metrics(res->body);
        std::lock_guard<std::mutex> lock(mu);
        if (s.ok) {
          kv_bytes = std::max(kv_bytes, s.kv_bytes);
          queue_depth = std::max(queue_depth, s.queue_depth);
          active = std::max(active, s.active);
          blocks_shared = std::max(blocks_shared, s.blocks_shared);
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
};

}  // namespace

Percentiles percentiles(std::vector<double> v) {
  Percentiles p;
  p.count = v.size();
  if (v.empty()) return p;
  std::sort(v.begin(), v.end());
  // Nearest rank: the smallest value with at least q of the values at or below it.
  const auto rank = [&](double q) {
    const size_t k = static_cast<size_t>(std::ceil(q * static_cast<double>(v.size())));
    return v[std::min(v.size() - 1, k == 0 ? 0 : k - 1)];
  };
  p.p50 = rank(0.50);
  p.p99 = rank(0.99);
  double sum = 0;
  for (double x : v) sum += x;
  p.mean = sum / static_cast<double>(v.size());
  p.max = v.back();
  return p;
}

ServerSample scrape_metrics(const std::string& text) {
  ServerSample s;
  int found = 0;
  for (size_t p = 0; p < text.size();) {
    size_t e = text.find('\n', p);
    if (e == std::string::npos) e = text.size();
    const std::string line = text.substr(p, e - p);
    p = e + 1;
    if (line.empty() || line[0] == '#') continue;
    const size_t sp = line.rfind(' ');
    if (sp == std::string::npos) continue;
    std::string name = line.substr(0, sp);
    const size_t brace = name.find('{');
    if (brace != std::string::npos) name.resize(brace);
    const double v = std::strtod(line.c_str() + sp + 1, nullptr);
    double* dst = name == "kivi_requests_admitted_total"  ? &s.admitted
                  : name == "kivi_generated_tokens_total" ? &s.generated_tokens
                  : name == "kivi_kv_bytes"               ? &s.kv_bytes
                  : name == "kivi_kv_bytes_peak"          ? &s.kv_bytes_peak
                  : name == "kivi_queue_depth"            ? &s.queue_depth
                  : name == "kivi_requests_active"        ? &s.active
                  : name == "kivi_kv_blocks_used"         ? &s.blocks_used
                  : name == "kivi_kv_blocks_shared"       ? &s.blocks_shared
                  : name == "kivi_kv_blocks_peak"         ? &s.blocks_peak
                  : name == "kivi_preemptions_total"      ? &s.preemptions
                                                          : nullptr;
    if (dst) {
      *dst = v;
      ++found;
    }
  }
  s.ok = found >= 8;
  return s;
}

std::string load_prompt(const LoadOptions& o, int i, int* words) {
  std::string s;
  uint64_t y =
      mix(o.seed * 0x9E3779B97F4A7C15ull + (o.distinct_system ? static_cast<uint64_t>(i) + 1 : 0));
  for (int k = 0; k < o.system_words; ++k) {
    y = mix(y);
    s += kWords[y % kNumWords];
    s += ' ';
  }
  uint64_t x = mix(o.seed * 0x100000001B3ull + static_cast<uint64_t>(i));
  const int span = std::max(0, o.prompt_words_max - o.prompt_words_min);
  const int n = o.prompt_words_min + static_cast<int>(x % static_cast<uint64_t>(span + 1));
  for (int k = 0; k < n; ++k) {
    x = mix(x);
    if (k) s += ' ';
    s += kWords[x % kNumWords];
  }
  if (words) *words = o.system_words + n;
  return s;
}

LoadReport run_load(const LoadOptions& o) {
  LoadReport rep;
  httplib::Headers auth;
  if (!o.api_key.empty()) auth.emplace("Authorization", "Bearer " + o.api_key);
  const auto make_client = [&] {
    auto c = std::make_unique<httplib::Client>(o.host, o.port);
    c->set_connection_timeout(10, 0);
    // A stream still waiting for its first token at the deadline ends soon after it.
    c->set_read_timeout(static_cast<time_t>(std::min(o.seconds, 3600.0)) + 5, 0);
    c->set_write_timeout(60, 0);
    return c;
  };
  auto mc = make_client();
  ServerSample before;
  if (const auto res = mc->Get("/metrics", auth); res && res->status == 200) {
    before = scrape_metrics(res->body);
  }
  Monitor mon;
  std::thread monitor([&] { mon.run(*mc, auth); });

  const auto start = Clock::now();
  const auto deadline =
      start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o.seconds));
  rep.requests.resize(static_cast<size_t>(std::max(0, o.requests)));
  std::vector<std::vector<double>> gaps(static_cast<size_t>(std::max(1, o.clients)));
  const int turns = std::max(1, o.turns);
  LoadOptions later = o;  // a conversation's later messages: no system prompt
  later.system_words = 0;
  std::atomic<int> next{0}, sent{0}, finished{0};
  std::vector<std::thread> clients;
  for (int t = 0; t < std::max(1, o.clients); ++t) {
    clients.emplace_back([&, t] {
      auto c = make_client();
      if (o.ramp_seconds > 0) {
        const auto at =
            start + std::chrono::duration_cast<Clock::duration>(
                        std::chrono::duration<double>(o.ramp_seconds * t / std::max(1, o.clients)));
        std::this_thread::sleep_until(std::min(at, deadline));
      }
      for (;;) {
        const int first = next.fetch_add(1) * turns;  // a conversation's first request
        std::string history;
        for (int k = 0; k < turns; ++k) {
          const int i = first + k;
          if (i >= o.requests || Clock::now() >= deadline) return;
          RequestResult& r = rep.requests[static_cast<size_t>(i)];
          r.turn = k;
          std::string prompt;
          if (k == 0) {
            prompt = load_prompt(o, i, &r.prompt_words);
          } else {
            prompt = history + " " + load_prompt(later, i, &r.prompt_words);
          }
          std::string reply;
          sent.fetch_add(1);
          r.sent = true;
          one_request(*c, o, i, prompt, deadline, r, gaps[static_cast<size_t>(t)], &reply);
          history = prompt + reply;
          const int f = finished.fetch_add(1) + 1;
          if (o.progress) o.progress(f);
          if (r.outcome != RequestResult::Outcome::kCompleted) break;  // the conversation ends
        }
      }
    });
  }
  for (auto& t : clients) t.join();
  rep.wall_s = std::chrono::duration<double>(Clock::now() - start).count();
  mon.stop = true;
  monitor.join();

  rep.sent = sent.load();
  // Requests never sent (the time limit, or a conversation that ended early) are dropped.
  rep.requests.erase(std::remove_if(rep.requests.begin(), rep.requests.end(),
                                    [](const RequestResult& r) { return !r.sent; }),
                     rep.requests.end());
  std::vector<double> ttft, itl, tpot, ttft_first, ttft_later;
  for (const auto& r : rep.requests) {
    switch (r.outcome) {
      case RequestResult::Outcome::kCompleted:
        ++rep.completed;
        rep.prompt_tokens += static_cast<uint64_t>(r.prompt_tokens);
        rep.completion_tokens += static_cast<uint64_t>(r.completion_tokens);
        rep.cached_tokens += static_cast<uint64_t>(r.cached_tokens);
        if (r.completion_tokens > 1 && r.ttft_ms >= 0)
          tpot.push_back((r.total_ms - r.ttft_ms) / (r.completion_tokens - 1));
        break;
      case RequestResult::Outcome::kRejected:
        ++rep.rejected;
        break;
      case RequestResult::Outcome::kCut:
        ++rep.cut;
        break;
      case RequestResult::Outcome::kError:
        ++rep.errors;
        break;
    }
    if (r.ttft_ms >= 0) {
      ttft.push_back(r.ttft_ms);
      (r.turn == 0 ? ttft_first : ttft_later).push_back(r.ttft_ms);
    }
  }
  for (const auto& g : gaps) itl.insert(itl.end(), g.begin(), g.end());
  rep.ttft_ms = percentiles(ttft);
  rep.itl_ms = percentiles(itl);
  rep.tpot_ms = percentiles(tpot);
  rep.ttft_first_turn_ms = percentiles(ttft_first);
  rep.ttft_later_turns_ms = percentiles(ttft_later);
  rep.tokens_per_second =
      rep.wall_s > 0 ? static_cast<double>(rep.completion_tokens) / rep.wall_s : 0;

  // The server frees a sequence just after its last token: wait (bounded) for the
  // server's count to settle before taking the deltas.
  ServerSample after;
  for (const auto end = Clock::now() + std::chrono::seconds(5);;) {
    const auto res = mc->Get("/metrics", auth);
    if (res && res->status == 200) after = scrape_metrics(res->body);
    if (!after.ok || (after.active == 0 && after.queue_depth == 0) || Clock::now() > end) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  rep.metrics = before.ok && after.ok;
  if (rep.metrics) {
    rep.admitted = after.admitted - before.admitted;
    rep.server_generated_tokens = after.generated_tokens - before.generated_tokens;
    rep.kv_bytes_peak = after.kv_bytes_peak;
    rep.kv_blocks_peak = after.blocks_peak;
    rep.preemptions = after.preemptions - before.preemptions;
    std::lock_guard<std::mutex> lock(mon.mu);
    rep.kv_bytes_peak_seen = mon.kv_bytes;
    rep.queue_depth_peak = mon.queue_depth;
    rep.active_peak = mon.active;
    rep.blocks_shared_peak = mon.blocks_shared;
  }
  return rep;
}

}  // namespace kivi::tools
