#include "runtime/kv_sensitivity.h"

#include <algorithm>
#include <memory>

#include "core/error.h"
#include "runtime/engine_options.h"
#include "runtime/sampler.h"

namespace kivi::runtime {

namespace {

// Base distributions beyond this are refused: the sweep keeps them in memory.
constexpr uint64_t kMaxBaseBytes = 4ull << 30;

// One run of the text with the cache map `map` (empty: the options' own cache): its
// perplexity and, against `base` ([tokens][vocab] log-probabilities), its mean KL.
struct Scored {
  double ppl = 0, kl = 0;
};

Scored score(const model::Model& m, SessionOptions opt, const std::string& map,
             const std::vector<int>& tokens, EvalMode mode, std::vector<float>* base,
             const std::function<void(int64_t)>& step) {
  opt.cache.layer_map = map;
  Session s(m, opt);
  const int V = m.config().vocab_size;
  double kl = 0;
  int64_t n = 0;
  const bool record = base->empty();
  if (record) {
    const uint64_t bytes = static_cast<uint64_t>(tokens.size()) * V * sizeof(float);
    if (bytes > kMaxBaseBytes)
      fail(
          "--kv-sensitivity keeps the f32 distributions of every scored token in memory: %zu "
          "tokens x %d entries take %.1f GiB (at most 4); score a shorter text",
          tokens.size(), V, bytes / 1073741824.0);
    base->reserve(tokens.size() * static_cast<size_t>(V));
  }
  auto sink = [&](int64_t i, int, const float* lp) {
    if (record) {
      base->insert(base->end(), lp, lp + V);
    } else {
      kl += kl_divergence(base->data() + static_cast<size_t>(i) * V, lp, V);
    }
    ++n;
  };
  const PerplexityResult r =
      evaluate_perplexity(s, tokens, mode, sink, [&](int64_t d, int64_t) { step(d); });
  return {r.ppl, n > 0 ? kl / n : 0.0};
}

// Bits per element of one stream in format f at this cache's shape.
double stream_bits(kv::CacheConfig c, kv::Format f, bool key, kv::Int8Granularity g) {
  c.layer_formats.clear();
  c.layer_map.clear();
  c.k = c.v = {f, g};
  return kv::bits_per_element(c, key ? kv::Stream::kKey : kv::Stream::kValue);
}

}  // namespace

SensitivityReport kv_sensitivity(const model::Model& m, const SessionOptions& base_opt,
                                 const std::vector<int>& tokens, const SensitivityOptions& o,
                                 const std::function<void(int64_t, int64_t)>& progress) {
  if (o.formats.empty()) fail("--kv-sensitivity: no formats to try");
  SessionOptions opt = base_opt;
  opt.cache.k.format = opt.cache.v.format = kv::Format::kF32;
  opt.cache.layer_map.clear();
  SensitivityReport rep;
  rep.tokens = static_cast<int64_t>(tokens.size());
  std::vector<float> base;

  // The cache's shape: which layers store a cache, and each format's bits.
  const kv::CacheConfig shape =
      cache_shape_for(m.config(), opt.cache, Session::context_for(m, opt));
  const std::vector<int> owners = kv::layer_owners(shape);
  for (int l = 0; l < shape.n_layers; ++l)
    if (owners[l] == l) rep.layers.push_back(l);
  const kv::Int8Granularity gran = base_opt.cache.k.granularity;
  const int nf = static_cast<int>(o.formats.size()), nl = static_cast<int>(rep.layers.size());

  // A budget below every stream's cheapest format is refused before any run.
  if (o.budget_bits > 0) {
    double least = 0;  // keys and values each at their cheapest
    for (bool key : {true, false}) {
      double b = 1e9;
      for (kv::Format f : o.formats) b = std::min(b, stream_bits(shape, f, key, gran));
      least += b / 2;
    }
    if (o.budget_bits < least - 1e-9)
      fail("--kv-budget %.3f: below the cheapest mix of these formats (%.3f bits per element)",
           o.budget_bits, least);
  }
  const int64_t runs = 1 + 2LL * nl * nf + nf + (o.budget_bits > 0 ? 1 : 0);
  int64_t done = 0;
  auto step = [&](int64_t d) {
    if (progress) progress(done + d, runs * rep.tokens);
  };
  auto run = [&](const std::string& map) {
    const Scored s = score(m, opt, map, tokens, o.mode, &base, step);
    done += rep.tokens;
    return s;
  };
  rep.base_ppl = run("").ppl;

  // Cells: one stream of one layer in a format, the rest f32.
  auto name = [](kv::Format f) { return std::string(kv::format_name(f)); };
  for (int l : rep.layers) {
    for (bool key : {true, false}) {
      for (kv::Format f : o.formats) {
        SensitivityCell c;
        c.layer = l;
        c.key = key;
        c.format = f;
        c.bits = stream_bits(shape, f, key, gran);
        const std::string map = strfmt("%d:%s/%s;*:f32", l, key ? name(f).c_str() : "f32",
                                       key ? "f32" : name(f).c_str());
        const Scored s = run(map);
        c.kl = s.kl;
        c.ppl = s.ppl;
        rep.cells.push_back(c);
      }
    }
  }
  auto cell = [&](int li, bool key, int fi) -> const SensitivityCell& {
    return rep.cells[(static_cast<size_t>(li) * 2 + (key ? 0 : 1)) * nf + fi];
  };

  // Uniform caches, for comparison.
  for (int fi = 0; fi < nf; ++fi) {
    SensitivityRun u;
    u.map = "*:" + name(o.formats[fi]);
    for (int li = 0; li < nl; ++li) {
      u.bits += cell(li, true, fi).bits + cell(li, false, fi).bits;
      u.predicted_kl += cell(li, true, fi).kl + cell(li, false, fi).kl;
    }
    u.bits /= 2.0 * nl;
    const Scored s = run(u.map);
    u.kl = s.kl;
    u.ppl = s.ppl;
    rep.uniform.push_back(u);
  }

  if (o.budget_bits > 0) {
    // Greedy: every stream at its cheapest format, then the best KL per bit upgrades.
    std::vector<int> pick(2 * nl);
    double total = 0;
    for (int i = 0; i < 2 * nl; ++i) {
      int best = 0;
      for (int fi = 1; fi < nf; ++fi)
        if (cell(i / 2, i % 2 == 0, fi).bits < cell(i / 2, i % 2 == 0, best).bits) best = fi;
      pick[i] = best;
      total += cell(i / 2, i % 2 == 0, best).bits;
    }
    const double cap = o.budget_bits * 2 * nl;
    if (total > cap + 1e-9)
      fail("--kv-budget %.3f: below the cheapest mix of these formats (%.3f bits per element)",
           o.budget_bits, total / (2 * nl));
    for (;;) {
      int bi = -1, bf = -1;
      double best_rate = 0;
      for (int i = 0; i < 2 * nl; ++i) {
        const SensitivityCell& cur = cell(i / 2, i % 2 == 0, pick[i]);
        for (int fi = 0; fi < nf; ++fi) {
          const SensitivityCell& up = cell(i / 2, i % 2 == 0, fi);
          const double cost = up.bits - cur.bits, gain = cur.kl - up.kl;
          if (cost <= 0 || gain <= 0 || total + cost > cap + 1e-9) continue;
          if (gain / cost > best_rate) {
            best_rate = gain / cost;
            bi = i;
            bf = fi;
          }
        }
      }
      if (bi < 0) break;
      total += cell(bi / 2, bi % 2 == 0, bf).bits - cell(bi / 2, bi % 2 == 0, pick[bi]).bits;
      pick[bi] = bf;
    }
    SensitivityRun& p = rep.proposal;
    for (int li = 0; li < nl; ++li) {
      const SensitivityCell &k = cell(li, true, pick[2 * li]),
                            &v = cell(li, false, pick[2 * li + 1]);
      if (!p.map.empty()) p.map += ";";
      p.map += strfmt("%d:%s/%s", rep.layers[li], name(k.format).c_str(), name(v.format).c_str());
      p.predicted_kl += k.kl + v.kl;
    }
    // Layers that borrow another's cache read it whatever their entry says.
    if (nl < shape.n_layers) p.map += ";*:f32";
    p.bits = total / (2 * nl);
    const Scored s = run(p.map);
    p.kl = s.kl;
    p.ppl = s.ppl;
    rep.proposed = true;
  }
  return rep;
}

}  // namespace kivi::runtime
