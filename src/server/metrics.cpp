#include "server/metrics.h"

#include <cstdio>

#include "core/error.h"

namespace kivi::server {

void HttpCounters::add(const std::string& route, int status) {
  std::lock_guard<std::mutex> lock(mu_);
  ++counts_[{route, status}];
}

std::map<std::pair<std::string, int>, uint64_t> HttpCounters::snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  return counts_;
}

namespace {

// Label values escape backslash, quote and newline.
std::string label(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

class Writer {
 public:
  void family(const char* name, const char* type, const char* help) {
    out_ += strfmt("# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
  }
  void sample(const char* name, const std::string& labels, double v) {
    out_ += name;
    if (!labels.empty()) out_ += "{" + labels + "}";
    char buf[64];
    std::snprintf(buf, sizeof(buf), " %.17g\n", v);
    out_ += buf;
  }
  void one(const char* name, const char* type, const char* help, double v,
           const std::string& labels = "") {
    family(name, type, help);
    sample(name, labels, v);
  }
  // A histogram's cumulative buckets, sum and count.
  void histogram(const char* name, const char* help, const runtime::Histogram& h) {
    family(name, "histogram", help);
    const std::string bucket = std::string(name) + "_bucket";
    uint64_t cum = 0;
    for (size_t i = 0; i < h.counts.size(); ++i) {
      cum += h.counts[i];
      char le[32];
      if (i < h.bounds.size()) {
        std::snprintf(le, sizeof(le), "%g", h.bounds[i]);
      } else {
        std::snprintf(le, sizeof(le), "+Inf");
      }
      sample(bucket.c_str(), std::string("le=\"") + le + "\"", static_cast<double>(cum));
    }
    sample((std::string(name) + "_sum").c_str(), "", h.sum);
    sample((std::string(name) + "_count").c_str(), "", static_cast<double>(h.count));
  }
  std::string str() const { return out_; }

 private:
  std::string out_;
};

}  // namespace

std::string prometheus_text(const runtime::SchedulerStats& s,
                            const std::map<std::pair<std::string, int>, uint64_t>& http,
                            const std::string& model) {
  Writer w;
  const std::string fmt = "format=\"" + label(s.cache_format) + "\"";
  w.family("kivi_http_requests_total", "counter", "HTTP responses by route and status.");
  for (const auto& [k, n] : http) {
    w.sample("kivi_http_requests_total",
             "route=\"" + label(k.first) + "\",status=\"" + std::to_string(k.second) + "\"",
             static_cast<double>(n));
  }
  w.one("kivi_model_info", "gauge", "The model served (its id as a label).", 1,
        "model=\"" + label(model) + "\"");
  w.one("kivi_requests_submitted_total", "counter",
        "Generation requests accepted into the queue or refused as full.",
        static_cast<double>(s.submitted));
  w.one("kivi_requests_admitted_total", "counter", "Requests that left the queue and started.",
        static_cast<double>(s.admitted));
  w.one("kivi_requests_completed_total", "counter",
        "Requests that ended normally (stop or length).", static_cast<double>(s.completed));
  w.one("kivi_requests_cancelled_total", "counter", "Requests whose client went away.",
        static_cast<double>(s.cancelled));
  w.one("kivi_requests_rejected_total", "counter",
        "Requests refused because the queue was full (503).",
        static_cast<double>(s.rejected_queue_full));
  w.one("kivi_requests_failed_total", "counter", "Requests ended by an internal error.",
        static_cast<double>(s.errors));
  w.one("kivi_requests_active", "gauge", "Sequences being generated.", s.active);
  w.one("kivi_requests_prefilling", "gauge", "Sequences still reading their prompt.", s.prefilling);
  w.one("kivi_queue_depth", "gauge", "Requests waiting for a sequence slot or for KV memory.",
        s.queued);
  w.one("kivi_queue_capacity", "gauge", "Requests the queue holds before answering 503.",
        s.queue_capacity);
  w.one("kivi_slots", "gauge", "Sequences decoded together at most (--parallel).", s.parallel);
  w.one("kivi_prompt_tokens_total", "counter", "Prompt tokens of admitted requests.",
        static_cast<double>(s.prompt_tokens));
  w.one("kivi_generated_tokens_total", "counter", "Tokens generated.",
        static_cast<double>(s.generated_tokens));
  w.one("kivi_generated_tokens_per_second", "gauge",
        "Tokens generated per second over the last 10 seconds.", s.tokens_per_second);
  w.one("kivi_preemptions_total", "counter",
        "Sequences preempted when the KV pool ran dry (prefilled again on their return).",
        static_cast<double>(s.preemptions));
  w.one("kivi_recomputed_tokens_total", "counter",
        "Tokens prefilled again for preempted sequences.",
        static_cast<double>(s.recomputed_tokens));
  w.one("kivi_spec_verifications_total", "counter",
        "Speculative steps: a sequence's pending token and draft checked together (--lookup).",
        static_cast<double>(s.spec_verifications));
  w.one("kivi_spec_draft_tokens_total", "counter", "Tokens drafted by --lookup.",
        static_cast<double>(s.spec_drafted));
  w.one("kivi_spec_accepted_tokens_total", "counter",
        "Drafted tokens the sampler chose itself (each saves a step).",
        static_cast<double>(s.spec_accepted));
  w.one("kivi_steps_total", "counter", "Batched forward steps run.", static_cast<double>(s.steps));
  w.one("kivi_kv_blocks_total", "gauge", "Blocks in the KV pool.", s.blocks_total, fmt);
  w.one("kivi_kv_blocks_used", "gauge", "Blocks holding tokens of some sequence.", s.blocks_used,
        fmt);
  w.one("kivi_kv_blocks_free", "gauge", "Blocks not holding tokens.", s.blocks_free, fmt);
  w.one("kivi_kv_blocks_reserved", "gauge",
        "Free blocks promised to active sequences (their prompts and next tokens).",
        s.blocks_reserved, fmt);
  w.one("kivi_kv_blocks_shared", "gauge",
        "Blocks held by more than one sequence (a common prompt prefix).", s.blocks_shared, fmt);
  w.one("kivi_kv_blocks_peak", "gauge", "Most blocks used at once.", s.peak_blocks_used, fmt);
  w.one("kivi_kv_block_tokens", "gauge", "Tokens per block.", s.block_tokens, fmt);
  w.one("kivi_kv_block_bytes", "gauge", "Bytes of one block (every layer, keys and values).",
        static_cast<double>(s.block_bytes), fmt);
  w.one("kivi_kv_tokens", "gauge", "Tokens in the caches of active sequences.",
        static_cast<double>(s.tokens_held), fmt);
  w.one("kivi_kv_bytes", "gauge",
        "KV memory in use: used blocks plus active sequences' residual windows.",
        static_cast<double>(s.bytes_allocated), fmt);
  w.one("kivi_kv_bytes_peak", "gauge", "Most KV memory in use at once.",
        static_cast<double>(s.peak_bytes_allocated), fmt);
  w.one("kivi_kv_compression_ratio", "gauge",
        "Bytes an f16 cache would hold for the active tokens, divided by kivi_kv_bytes.",
        s.compression_vs_f16, fmt);
  w.one("kivi_prefix_cache_queries_total", "counter",
        "Requests admitted while the prefix cache is on.", static_cast<double>(s.prefix_queries));
  w.one("kivi_prefix_cache_hits_total", "counter",
        "Admitted requests that started after cached prompt tokens.",
        static_cast<double>(s.prefix_hits));
  w.one("kivi_prefix_cache_hit_rate", "gauge", "kivi_prefix_cache_hits_total / queries.",
        s.prefix_queries > 0
            ? static_cast<double>(s.prefix_hits) / static_cast<double>(s.prefix_queries)
            : 0.0);
  w.one("kivi_prefill_tokens_saved_total", "counter",
        "Prompt tokens taken from the prefix cache instead of prefilled.",
        static_cast<double>(s.prefill_tokens_saved));
  w.one("kivi_prefix_cache_evictions_total", "counter",
        "Ended sequences the prefix cache kept and then gave up for memory or a slot.",
        static_cast<double>(s.prefix_evictions));
  w.one("kivi_prefix_cache_sequences", "gauge", "Ended sequences the prefix cache keeps.",
        s.cached_sequences);
  w.one("kivi_prefix_cache_blocks", "gauge", "Blocks mapped by the kept sequences.",
        s.cached_blocks, fmt);
  w.one("kivi_prefix_cache_tokens", "gauge", "Tokens held by the kept sequences.",
        static_cast<double>(s.cached_tokens), fmt);
  w.histogram("kivi_request_queue_time_seconds", "From submission to admission (seconds).",
              s.queue_time);
  w.histogram("kivi_time_to_first_token_seconds",
              "From submission to the first generated token (seconds).", s.time_to_first_token);
  w.histogram("kivi_time_per_output_token_seconds",
              "Mean gap between a request's generated tokens after the first (seconds), per "
              "request that ends normally.",
              s.time_per_output_token);
  w.histogram("kivi_e2e_request_latency_seconds",
              "From submission to the end, for requests that end normally (seconds).",
              s.request_latency);
  return w.str();
}

}  // namespace kivi::server
