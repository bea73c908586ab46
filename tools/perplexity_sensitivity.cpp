// `kivi perplexity --kv-sensitivity`: the per-layer sweep (runtime/kv_sensitivity.h) as a table
// or JSON.
#include <cstdio>
#include <string>
#include <vector>

#include "common.h"
#include "core/json.h"
#include "core/progress.h"
#include "kv/format.h"
#include "runtime/kv_sensitivity.h"

namespace kivi::tools {

void add_kv_sensitivity_options(Args& a) {
  a.add("kv-sensitivity", 0, "FORMATS",
        "Instead of one run: per layer, the KL divergence against an f32 cache of each format "
        "(comma-separated, e.g. kivi2,kivi4,tq3) for its keys alone and its values alone, every "
        "other stream in f32; then each format for every layer. The f32 distributions of all "
        "scored tokens are kept in memory.");
  a.add("kv-budget", 0, "BITS",
        "With --kv-sensitivity: propose a --kv-cache-layers mix of those formats within BITS "
        "bits per element on average (greedy on the per-stream costs, taken as additive), and "
        "measure it.");
}

int report_kv_sensitivity(const Args& a, const model::Model& m, const runtime::SessionOptions& opt,
                          const std::vector<int>& tokens, runtime::EvalMode mode, bool json) {
  runtime::SensitivityOptions o;
  for (const std::string& f : a.list("kv-sensitivity"))
    o.formats.push_back(kv::parse_format(f, "--kv-sensitivity"));
  if (a.given("kv-budget")) o.budget_bits = a.number("kv-budget", 0.5, 64.0);
  o.mode = mode;
  Progress bar("kv sensitivity", 1, "tok", !json);
  const runtime::SensitivityReport r =
      runtime::kv_sensitivity(m, opt, tokens, o, [&](int64_t d, int64_t total) {
        bar.set_total(total);
        bar.update(d);
      });
  bar.finish();
  const int nf = static_cast<int>(o.formats.size());
  if (json) {
    JsonWriter j;
    j.begin_object();
    j.kv("base_ppl", r.base_ppl).kv("tokens", r.tokens);
    j.key("cells").begin_array();
    for (const auto& c : r.cells) {
      j.begin_object();
      j.kv("layer", c.layer)
          .kv("stream", c.key ? "k" : "v")
          .kv("format", kv::format_name(c.format));
      j.kv("bits", c.bits).kv("kl", c.kl).kv("ppl", c.ppl);
      j.end_object();
    }
    j.end_array();
    auto run = [&](const runtime::SensitivityRun& u) {
      j.begin_object();
      j.kv("map", u.map).kv("bits", u.bits).kv("kl", u.kl).kv("ppl", u.ppl);
      j.kv("predicted_kl", u.predicted_kl);
      j.end_object();
    };
    j.key("uniform").begin_array();
    for (const auto& u : r.uniform) run(u);
    j.end_array();
    if (r.proposed) {
      j.kv("budget_bits", o.budget_bits);
      j.key("proposal");
      run(r.proposal);
    }
    j.end_object();
    std::printf("%s\n", j.str().c_str());
    return 0;
  }
  std::printf(
      "KV sensitivity: mean KL divergence against an f32 cache (perplexity %.4f, %lld "
      "tokens)\nwith one stream of one layer in the format and every other in f32\n\n",
      r.base_ppl, static_cast<long long>(r.tokens));
  std::printf("%-6s", "layer");
  for (const char* s : {"K", "V"})
    for (kv::Format f : o.formats)
      std::printf(" %12s", (std::string(s) + " " + kv::format_name(f)).c_str());
  std::printf("\n");
  for (size_t li = 0; li < r.layers.size(); ++li) {
    std::printf("%-6d", r.layers[li]);
    for (int s = 0; s < 2; ++s)
      for (int fi = 0; fi < nf; ++fi) std::printf(" %12.5f", r.cells[(li * 2 + s) * nf + fi].kl);
    std::printf("\n");
  }
  std::printf("%-6s", "bits");
  for (int s = 0; s < 2; ++s)
    for (int fi = 0; fi < nf; ++fi) std::printf(" %12.3f", r.cells[s * nf + fi].bits);
  std::printf("\n%8s %10s %10s %10s  %s\n", "bits", "KL", "sum of KL", "perplexity",
              "cache (--kv-cache-layers)");
  auto row = [](const runtime::SensitivityRun& u) {
    std::printf("%8.3f %10.5f %10.5f %10.4f  %s\n", u.bits, u.kl, u.predicted_kl, u.ppl,
                u.map.c_str());
  };
  for (const auto& u : r.uniform) row(u);
  if (r.proposed) {
    std::printf("\nproposed for %.3f bits per element:\n", o.budget_bits);
    row(r.proposal);
  }
  return 0;
}

}  // namespace kivi::tools
