// kivi bench-batch: batched decode steps (continuous batching) per cache format and
// batch size, over random-filled caches in a shared block pool (runtime/bench_batch.h).
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "common.h"
#include "core/cpu.h"
#include "core/error.h"
#include "core/json.h"
#include "core/progress.h"
#include "core/sysinfo.h"
#include "kv/format.h"
#include "runtime/bench_batch.h"

namespace kivi::tools {

namespace {

std::string short_name(const kv::CacheConfig& c) {
  std::string s =
      c.k == c.v ? kv::describe(c.k) : "K " + kv::describe(c.k) + " / V " + kv::describe(c.v);
  if (c.key_rope == kv::KeyRope::kPre) s += "+pre";
  return s;
}

std::string ratio(double x) { return x > 0 ? strfmt("%.2fx", x) : "-"; }

}  // namespace

int cmd_bench_batch(int argc, char** argv) {
  Args a(
      "bench-batch",
      "[-m MODEL] [--batch LIST] [--ctx-fill N] [--kv-cache LIST] [KV options] [-n STEPS] "
      "[--threads N] [--no-probe] [--json]",
      "Times batched decode steps, the step the server runs for continuous batching: B\n"
      "sequences, one token each, through one batched forward pass (every weight matrix read\n"
      "once for the batch) over caches that draw on one shared block pool. Each sequence's\n"
      "cache is first filled with --ctx-fill positions of seeded random keys and values through\n"
      "its format's own quantizer (no prefill; speed only: the tokens mean nothing). Per\n"
      "format, max(--batch) sequences are filled (sequence s gets the same data in every\n"
      "format); batch size B decodes the first B of them.\n"
      "\n"
      "Timing: after an untimed round, each round times one step of every (format, batch)\n"
      "configuration in turn, rotating the start, plus one pass of a memory-read bandwidth\n"
      "probe, so a noisy machine's slow moments fall on all alike. Reported per configuration:\n"
      "median step time, aggregate tokens/s (B / step), tokens/s per sequence, the step split\n"
      "into attention and the rest (matrix products, norms, RoPE), KV bytes per sequence, the\n"
      "ratio to batch 1 of the same format and to f16 at the same batch, and the roofline:\n"
      "(weight bytes + the batch's cache bytes) / probe bandwidth, the least a step can take.");
  a.section("Benchmark");
  a.add("batch", 0, "LIST", "Batch sizes (sequences decoded together).", "1,8");
  a.add("ctx-fill", 0, "N", "Random positions in every sequence's cache before decoding; k = 1024.",
        "4096");
  a.add("n", 'n', "STEPS", "Timed rounds (one step of every configuration each).", "16");
  a.add("seed", 's', "S", "Seed of the fill (sequence s uses S + s) and of the first tokens.",
        "1234");
  a.add_flag("no-probe", 0,
             "Skip the bandwidth probe: the roofline then reads n/a (null in JSON).");
  a.add_flag("json", 0,
             "Print {\"model\", \"ctx_fill\", \"threads\", \"probe_gbps\", \"weight_bytes_step\", "
             "\"results\": [{format, batch, step_ms, agg_tps, seq_tps, attn_ms, rest_ms, "
             "kv_bytes_per_seq, cache_bytes_step, roofline_ms, vs_batch1, vs_f16}]}.");
  add_model_options(a);
  add_kv_options(a, true);
  if (!parse_command_line(a, argc, argv)) return 0;  // --help printed
  const bool json = a.flag("json");
  if (a.given("ctx"))
    fail("--ctx has no effect in bench-batch: every sequence holds --ctx-fill plus the steps");
  if (a.given("window")) fail("--window is not supported by bench-batch");

  runtime::BatchBenchConfig bc;
  for (int64_t b : a.int_list("batch", 1, 4096)) bc.batches.push_back(static_cast<int>(b));
  const auto fill = a.int_list("ctx-fill", 0, model::kMaxContext);
  if (fill.size() != 1) fail("--ctx-fill '%s': expected one number", a.str("ctx-fill").c_str());
  bc.fill = static_cast<int>(fill[0]);
  bc.steps = static_cast<int>(a.integer("n", 1, 1000000));
  bc.seed = static_cast<uint64_t>(a.integer("seed", 0, INT64_MAX));
  bc.threads = threads_option(a);
  bc.probe = !a.flag("no-probe");
  bc.forward.precision = attn::parse_precision(a.str("attn-precision"));
  for (size_t i = 0; i < bc.batches.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      if (bc.batches[i] == bc.batches[j]) fail("--batch lists %d twice", bc.batches[i]);
    }
  }
  for (const auto& f : kv_format_list(a, {"f16", "int8", "kivi2"})) {
    const kv::CacheConfig c = cache_config(a, f);
    if (c.share_every > 1 || !c.share_map.empty())
      fail("--kv-cache %s: cross-layer sharing is not supported by bench-batch", f.c_str());
    for (const auto& n : bc.names) {
      if (n == short_name(c)) fail("--kv-cache lists %s twice", n.c_str());
    }
    bc.caches.push_back(c);
    bc.names.push_back(short_name(c));
  }

  auto m = load_model(a);
  const auto& mc = m->config();
  const int ctx = runtime::bench_batch_ctx(bc);
  if (ctx > mc.ctx && !mc.synthetic) {
    fail("--ctx-fill %d + steps need %d tokens, more than the model's context of %d", bc.fill, ctx,
         mc.ctx);
  }
  // Every format's pool lives at once: check it fits beside the weights before allocating.
  const uint64_t cache_bytes = runtime::bench_batch_cache_bytes(*m, bc, ctx);
  {
    const uint64_t avail = sys::available_memory_bytes();
    const uint64_t need = cache_bytes + (bc.probe ? bc.probe_bytes : 0);
    if (avail > 0 && need + m->weight_bytes() > avail) {
      fail(
          "the caches of %d sequences of %d tokens in %zu formats need %s (with the probe) beside "
          "the weights (%s) but only %s of memory is available; lower --ctx-fill or the largest "
          "--batch, or list fewer formats",
          *std::max_element(bc.batches.begin(), bc.batches.end()), ctx, bc.caches.size(),
          sys::human_bytes(static_cast<double>(need)).c_str(),
          sys::human_bytes(static_cast<double>(m->weight_bytes())).c_str(),
          sys::human_bytes(static_cast<double>(avail)).c_str());
    }
  }
  if (!json) note_if_synthetic(*m, "speeds are real, tokens are not");

  // The decode bar starts with the first step, so its rate and ETA leave the fill out.
  Progress fill_bar("fill", 1, "pos", !json);
  std::unique_ptr<Progress> step_bar;
  const auto r =
      runtime::run_bench_batch(*m, bc, [&](const char* phase, int64_t done, int64_t total) {
        if (std::string(phase) == "fill") {
          fill_bar.set_total(total);
          fill_bar.update(done);
          return;
        }
        if (!step_bar) {
          fill_bar.finish();
          step_bar = std::make_unique<Progress>("decode", total, "step", !json);
        }
        step_bar->update(done);
      });
  fill_bar.finish();
  if (step_bar) step_bar->finish();

  const double load = sys::load_average();
  if (json) {
    JsonWriter j;
    j.begin_object();
    j.kv("model", m->path()).kv("synthetic", mc.synthetic);
    j.kv("ctx_fill", r.fill).kv("ctx", r.ctx).kv("steps", bc.steps).kv("threads", r.threads);
    j.kv("simd", cpu::current_target_name())
        .kv("attn_precision", attn::precision_name(bc.forward.precision));
    j.kv("weight_bytes_step", r.weight_bytes_step).kv("fill_seconds", r.fill_seconds);
    if (load >= 0) {
      j.kv("load_average", load);
    } else {
      j.key("load_average").null();
    }
    if (r.probe_gbps > 0) {
      j.kv("probe_gbps", r.probe_gbps);
    } else {
      j.key("probe_gbps").null();
    }
    j.key("results").begin_array();
    for (const auto& x : r.rows) {
      j.begin_object();
      j.kv("format", x.name).kv("kv_cache", describe_cache(x.cache)).kv("batch", x.batch);
      j.kv("step_ms", x.step_median * 1e3).kv("agg_tps", x.agg_tps).kv("seq_tps", x.seq_tps);
      j.kv("attn_ms", x.attn_median * 1e3).kv("rest_ms", x.rest_median * 1e3);
      j.kv("kv_bytes_per_seq", x.kv_bytes_per_seq).kv("cache_bytes_step", x.cache_bytes_step);
      if (x.roofline_seconds > 0) {
        j.kv("roofline_ms", x.roofline_seconds * 1e3);
      } else {
        j.key("roofline_ms").null();
      }
      auto opt = [&](const char* k, double v) {
        if (v > 0) {
          j.kv(k, v);
        } else {
          j.key(k).null();
        }
      };
      opt("vs_batch1", x.vs_batch1);
      opt("vs_f16", x.vs_f16);
      j.end_object();
    }
    j.end_array().end_object();
    std::printf("%s\n", j.str().c_str());
    return 0;
  }

  std::printf("model     %s%s\n", m->path().c_str(), mc.synthetic ? " (random weights)" : "");
  std::printf(
      "decode    %d random positions per sequence (filled in %.1f s), %d timed rounds, %d "
      "thread%s, SIMD %s, attention %s\n",
      r.fill, r.fill_seconds, bc.steps, r.threads, r.threads == 1 ? "" : "s",
      cpu::current_target_name().c_str(), attn::precision_name(bc.forward.precision));
  std::printf("weights   %s read per step (layer matrices and classifier)\n",
              sys::human_bytes(static_cast<double>(r.weight_bytes_step)).c_str());
  if (r.probe_gbps > 0) {
    std::printf("probe     %.1f GB/s read (median of %d passes beside the steps)\n", r.probe_gbps,
                bc.steps);
  }
  if (load >= 0) std::printf("load      %.2f (1-minute load average, after the run)\n", load);
  const std::vector<std::string> head = {"format",      "batch",       "step ms",    "agg tok/s",
                                         "seq tok/s",   "attn ms",     "rest ms",    "KV/seq",
                                         "roofline ms", "of roofline", "vs batch 1", "vs f16"};
  std::vector<std::vector<std::string>> rows;
  for (const auto& x : r.rows) {
    rows.push_back({x.name, std::to_string(x.batch), strfmt("%.1f", x.step_median * 1e3),
                    strfmt("%.1f", x.agg_tps), strfmt("%.2f", x.seq_tps),
                    strfmt("%.1f", x.attn_median * 1e3), strfmt("%.1f", x.rest_median * 1e3),
                    sys::human_bytes(static_cast<double>(x.kv_bytes_per_seq)),
                    x.roofline_seconds > 0 ? strfmt("%.1f", x.roofline_seconds * 1e3) : "n/a",
                    x.roofline_seconds > 0
                        ? strfmt("%.0f%%", 100.0 * x.roofline_seconds / x.step_median)
                        : "n/a",
                    ratio(x.vs_batch1), ratio(x.vs_f16)});
  }
  std::vector<size_t> w(head.size());
  for (size_t k = 0; k < head.size(); ++k) {
    w[k] = head[k].size();
    for (const auto& row : rows) w[k] = std::max(w[k], row[k].size());
  }
  auto line = [&](const std::vector<std::string>& c) {
    std::string s;
    for (size_t k = 0; k < c.size(); ++k) {
      s += k == 0 ? c[k] + std::string(w[k] - c[k].size(), ' ')
                  : "  " + std::string(w[k] - c[k].size(), ' ') + c[k];
    }
    std::printf("%s\n", s.c_str());
  };
  line(head);
  for (const auto& row : rows) line(row);
  std::printf(
      "roofline = (weights + the batch's cache bytes) / probe GB/s; 'of roofline' = roofline / "
      "step\n");
  return 0;
}

}  // namespace kivi::tools
