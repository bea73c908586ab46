// A load generator for an OpenAI-compatible server (`kivi bench-serve`): `clients`
// concurrent HTTP clients, each sending streamed completion requests one after another
// until `requests` have been sent or `seconds` have passed, with seeded prompts of mixed
// lengths (request i gets the same prompt whichever client sends it). It measures what
// a user sees: the time to the first token, the gaps between streamed tokens, and the
// aggregate tokens/s counted from the responses' `usage`. It reads the server's
// /metrics before, during (every 50 ms) and after the run for KV memory, admissions,
// queue depth and the server's own token count.
//
// With turns > 1 a client holds conversations: turn k's prompt is turn k-1's prompt,
// its reply and a new message of prompt-words words, as a chat client resends its
// history; the server's prefix cache can then skip the history's prefill (the report
// gives the time to first token of the later turns and the prompt tokens the server
// reports as cached).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace kivi::tools {

struct LoadOptions {
  std::string host = "127.0.0.1";
  int port = 8080;
  std::string api_key;  // sent as "Authorization: Bearer KEY" when not empty
  int clients = 8;
  int requests = 64;    // sent in all
  double seconds = 60;  // no request starts later, and streams still open then are cut
  int prompt_words_min = 8, prompt_words_max = 128;
  // A common system prompt of this many words before every prompt (the same words for
  // every request, or different ones per request with distinct_system).
  int system_words = 0;
  bool distinct_system = false;
  double ramp_seconds = 0;  // client t starts at t / clients * ramp_seconds
  int max_tokens = 64;
  int turns = 1;  // requests per conversation
  double temperature = 0.8;
  bool ignore_eos = true;  // every request generates max_tokens
  uint64_t seed = 1;
  std::function<void(int finished)> progress;  // after each request (any thread)
};

struct RequestResult {
  enum class Outcome { kCompleted, kRejected, kError, kCut };
  Outcome outcome = Outcome::kError;
  int status = 0;  // HTTP status (0: no response)
  int prompt_words = 0;
  int prompt_tokens = 0, completion_tokens = 0;  // from usage (completed requests)
  int cached_tokens = 0;                         // usage.prompt_tokens_details.cached_tokens
  int turn = 0;                                  // within its conversation, from 0
  bool sent = false;
  int chunks = 0;       // streamed text chunks
  double ttft_ms = -1;  // to the first text chunk
  double total_ms = 0;
  std::string error;
};

struct Percentiles {
  size_t count = 0;
  double p50 = 0, p99 = 0, mean = 0, max = 0;
};
Percentiles percentiles(std::vector<double> v);

// What /metrics says (NaN where a sample is missing).
struct ServerSample {
  bool ok = false;
  double admitted = 0, generated_tokens = 0, kv_bytes = 0, kv_bytes_peak = 0, queue_depth = 0,
         active = 0, blocks_used = 0, blocks_shared = 0, blocks_peak = 0, preemptions = 0;
};
ServerSample scrape_metrics(const std::string& prometheus_text);

struct LoadReport {
  double wall_s = 0;
  int sent = 0, completed = 0, rejected = 0, errors = 0, cut = 0;
  uint64_t prompt_tokens = 0, completion_tokens = 0;  // completed requests' usage
  uint64_t cached_tokens = 0;    // of prompt_tokens, those the server took from its prefix cache
  double tokens_per_second = 0;  // completion_tokens / wall_s
  // ttft: to a request's first text chunk; itl: gaps between a request's successive text
  // chunks (a chunk holds the tokens that were ready when the server wrote, usually one);
  // tpot: per completed request, (total - ttft) / (completion_tokens - 1).
  Percentiles ttft_ms, itl_ms, tpot_ms;
  Percentiles ttft_first_turn_ms, ttft_later_turns_ms;  // with turns > 1
  // From /metrics: deltas over the run, peaks seen during it.
  bool metrics = false;
  double admitted = 0, server_generated_tokens = 0;
  double preemptions = 0;    // sequences the server preempted when its pool ran dry
  double kv_bytes_peak = 0;  // the server's peak gauges (since it started)
  double kv_blocks_peak = 0;
  double kv_bytes_peak_seen = 0, queue_depth_peak = 0, active_peak = 0, blocks_shared_peak = 0;
  std::vector<RequestResult> requests;
};

// The prompt of request i: the system words, then prompt_words_min..max words of a
// fixed vocabulary. A conversation's later turns add the message alone (no system words).
std::string load_prompt(const LoadOptions& o, int i, int* words = nullptr);

LoadReport run_load(const LoadOptions& o);

}  // namespace kivi::tools
