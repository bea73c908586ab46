#include "runtime/perplexity.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "core/error.h"
#include "io/atomic_file.h"

namespace kivi::runtime {

EvalMode parse_eval_mode(const std::string& s) {
  if (s == "streaming") return EvalMode::kStreaming;
  if (s == "batched") return EvalMode::kBatched;
  fail("--mode: unknown value '%s' (valid: streaming, batched)", s.c_str());
}
const char* eval_mode_name(EvalMode m) {
  return m == EvalMode::kStreaming ? "streaming" : "batched";
}

void log_softmax(const float* x, float* out, int n) {
  float mx = x[0];
  for (int i = 1; i < n; ++i) mx = std::max(mx, x[i]);
  double sum = 0.0;
  for (int i = 0; i < n; ++i) sum += std::exp(static_cast<double>(x[i]) - mx);
  const double lse = mx + std::log(sum);
  for (int i = 0; i < n; ++i) out[i] = static_cast<float>(x[i] - lse);
}

uint64_t hash_tokens(const std::vector<int>& tokens) {
  uint64_t h = 1469598103934665603ull;
  for (int t : tokens) {
    for (int b = 0; b < 4; ++b) {
      h ^= static_cast<uint8_t>(static_cast<uint32_t>(t) >> (8 * b));
      h *= 1099511628211ull;
    }
  }
  return h;
}

PerplexityResult evaluate_perplexity(Session& s, const std::vector<int>& tokens, EvalMode mode,
                                     const LogprobSink& sink,
                                     const std::function<void(int64_t, int64_t)>& progress,
                                     int prompt) {
  const int64_t n = static_cast<int64_t>(tokens.size());
  if (n < 2)
    fail("the text has %lld token%s; perplexity needs at least 2", static_cast<long long>(n),
         n == 1 ? "" : "s");
  const int V = s.vocab();
  const int bos = s.model().tokenizer().bos_id();
  // With an overflow policy the whole text streams through one session whose cache
  // drops old tokens as it goes; otherwise each chunk fills an empty cache.
  const bool streams = s.options().overflow != ContextOverflow::kStop;
  const int chunk = streams ? static_cast<int>(std::min<int64_t>(n, INT32_MAX - 1)) : s.ctx() - 1;
  if (chunk < 1) fail("--ctx %d leaves no room to score tokens (need at least 2)", s.ctx());
  PerplexityResult r;
  r.nll.reserve(static_cast<size_t>(n));
  std::vector<float> lp(V);
  std::vector<float> all;  // batched: [chunk, V]
  if (mode == EvalMode::kBatched) all.resize(static_cast<size_t>(chunk) * V);
  int64_t done = 0;
  auto score = [&](const float* logits, int token) {
    log_softmax(logits, lp.data(), V);
    r.nll.push_back(-lp[token]);
    if (sink) sink(done, token, lp.data());
    ++done;
  };
  for (int64_t c0 = 0; c0 < n; c0 += chunk) {
    const int len = static_cast<int>(std::min<int64_t>(chunk, n - c0));
    s.reset();
    if (mode == EvalMode::kStreaming) {
      // Inputs are BOS then the chunk's tokens; input i predicts token i.
      const int pre = std::min(prompt, len);
      int first = 0;
      const float* logits = nullptr;
      if (pre > 1) {
        std::vector<int> in(1, bos);
        in.insert(in.end(), tokens.begin() + c0, tokens.begin() + c0 + pre - 1);
        all.resize(static_cast<size_t>(pre) * V);
        s.prefill(in, all.data());
        for (int i = 0; i + 1 < pre; ++i) score(&all[static_cast<size_t>(i) * V], tokens[c0 + i]);
        first = pre - 1;
        logits = &all[static_cast<size_t>(pre - 1) * V];
      } else {
        logits = s.decode(bos);
      }
      for (int i = first; i < len; ++i) {
        const int t = tokens[c0 + i];
        score(logits, t);
        if (i + 1 < len) logits = s.decode(t);
        if (progress) progress(done, n);
      }
    } else {
      std::vector<int> in;
      in.reserve(len);
      in.push_back(bos);
      in.insert(in.end(), tokens.begin() + c0, tokens.begin() + c0 + len - 1);
      s.prefill(in, all.data());
      for (int i = 0; i < len; ++i) score(&all[static_cast<size_t>(i) * V], tokens[c0 + i]);
      if (progress) progress(done, n);
    }
    ++r.chunks;
  }
  double sum = 0.0;
  for (float x : r.nll) sum += x;
  r.tokens = static_cast<int64_t>(r.nll.size());
  r.mean_nll = sum / r.tokens;
  double var = 0.0;
  for (float x : r.nll) var += (x - r.mean_nll) * (x - r.mean_nll);
  r.nll_stderr = r.tokens > 1 ? std::sqrt(var / (r.tokens - 1) / r.tokens) : 0.0;
  r.ppl = std::exp(r.mean_nll);
  // The forward pass refuses non-finite logits; a finite mean NLL can still overflow exp.
  if (!std::isfinite(r.mean_nll) || !std::isfinite(r.ppl)) {
    fail("the perplexity is not finite (mean negative log-likelihood %g nats per token)",
         r.mean_nll);
  }
  return r;
}

static const char kMagic[8] = {'K', 'I', 'V', 'I', 'L', 'P', '2', '\0'};
static const char kMagicV1[8] = {'K', 'I', 'V', 'I', 'L', 'P', '1', '\0'};

uint64_t model_fingerprint(const model::Model& m) {
  const auto& c = m.config();
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](const void* p, size_t n) {
    for (size_t i = 0; i < n; ++i) {
      h ^= static_cast<const uint8_t*>(p)[i];
      h *= 1099511628211ull;
    }
  };
  // The whole model's shape also when this process holds a tensor-parallel slice.
  const bool tp = c.tp.size > 1;
  const int32_t shape[] = {c.n_layers,
                           c.dim,
                           tp ? c.tp.hidden_total : c.hidden_dim,
                           tp ? c.tp.n_heads_total : c.n_heads,
                           tp ? c.tp.n_kv_heads_total : c.n_kv_heads,
                           c.vocab_size,
                           c.ctx,
                           c.alibi ? 1 : 0};
  mix(shape, sizeof shape);
  const auto& w = m.weights();
  if (!w.layers.empty())
    mix(w.layers[0].attn_norm.data(), w.layers[0].attn_norm.size() * sizeof(float));
  mix(w.output_norm.data(), w.output_norm.size() * sizeof(float));
  return h;
}

LogprobWriter::LogprobWriter(const std::string& path, int vocab, int ctx, int64_t n_tokens,
                             uint64_t hash, uint64_t model)
    : file_(std::make_unique<io::AtomicFile>(path)), vocab_(vocab) {
  const uint32_t v = static_cast<uint32_t>(vocab), c = static_cast<uint32_t>(ctx);
  const uint64_t nt = static_cast<uint64_t>(n_tokens);
  file_->write(kMagic, 8);
  file_->write(&v, 4);
  file_->write(&c, 4);
  file_->write(&nt, 8);
  file_->write(&hash, 8);
  file_->write(&model, 8);
}

void LogprobWriter::write(int token, const float* lp) {
  const uint32_t t = static_cast<uint32_t>(token);
  file_->write(&t, 4);
  file_->write(lp, sizeof(float) * static_cast<size_t>(vocab_));
}

void LogprobWriter::close() { file_->commit(); }

LogprobWriter::~LogprobWriter() = default;

LogprobReader::LogprobReader(const std::string& path, int vocab, int ctx, int64_t n_tokens,
                             uint64_t hash, uint64_t model)
    : path_(path), vocab_(vocab) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) fail("cannot open --kld-base file '%s': %s", path.c_str(), std::strerror(errno));
  f_ = f;
  char magic[8];
  uint32_t v = 0, c = 0;
  uint64_t nt = 0, h = 0, mh = 0;
  const bool got = std::fread(magic, 1, 8, f) == 8;
  if (got && std::memcmp(magic, kMagicV1, 8) == 0) {
    fail("%s was written by an older kivi that did not record the model; run --save-logits again",
         path.c_str());
  }
  if (!got || std::memcmp(magic, kMagic, 8) != 0) {
    fail("%s: not a kivi log-probability file (written by 'kivi perplexity --save-logits')",
         path.c_str());
  }
  if (std::fread(&v, 4, 1, f) != 1 || std::fread(&c, 4, 1, f) != 1 ||
      std::fread(&nt, 8, 1, f) != 1 || std::fread(&h, 8, 1, f) != 1 ||
      std::fread(&mh, 8, 1, f) != 1) {
    fail("%s: truncated header", path.c_str());
  }
  if (v != static_cast<uint32_t>(vocab)) {
    fail("%s was written for a vocabulary of %u tokens, this model has %d (another model?)",
         path.c_str(), v, vocab);
  }
  if (mh != model) {
    fail(
        "%s was written with another model (its shape or norm weights differ); KL divergence "
        "compares runs of "
        "one model",
        path.c_str());
  }
  if (c != static_cast<uint32_t>(ctx)) {
    fail(
        "%s was written with a context of %u tokens, this run has %d (--ctx): the chunks and so "
        "every token's "
        "context differ",
        path.c_str(), c, ctx);
  }
  if (nt != static_cast<uint64_t>(n_tokens) || h != hash) {
    fail(
        "%s was written for another text or tokenization (%llu scored tokens, hash %016llx; this "
        "run: %lld, "
        "%016llx)",
        path.c_str(), static_cast<unsigned long long>(nt), static_cast<unsigned long long>(h),
        static_cast<long long>(n_tokens), static_cast<unsigned long long>(hash));
  }
}

int LogprobReader::read(float* lp) {
  FILE* f = static_cast<FILE*>(f_);
  uint32_t t = 0;
  if (std::fread(&t, 4, 1, f) != 1 || std::fread(lp, 4, vocab_, f) != static_cast<size_t>(vocab_)) {
    fail("%s: truncated (fewer records than its header says)", path_.c_str());
  }
  return static_cast<int>(t);
}

LogprobReader::~LogprobReader() {
  if (f_) std::fclose(static_cast<FILE*>(f_));
}

double kl_divergence(const float* base, const float* lp, int n) {
  double kl = 0.0;
  for (int i = 0; i < n; ++i) {
    const double pb = std::exp(static_cast<double>(base[i]));
    if (pb > 0.0) kl += pb * (static_cast<double>(base[i]) - lp[i]);
  }
  return std::max(0.0, kl);
}

KldStats summarize_kld(const std::vector<double>& kld, const std::vector<char>& agree) {
  KldStats s;
  s.tokens = static_cast<int64_t>(kld.size());
  if (kld.empty()) return s;
  double sum = 0.0;
  int64_t same = 0;
  for (size_t i = 0; i < kld.size(); ++i) {
    sum += kld[i];
    same += agree[i];
    if (!agree[i] && s.first_disagree < 0) s.first_disagree = static_cast<int64_t>(i);
  }
  std::vector<double> sorted = kld;
  std::sort(sorted.begin(), sorted.end());
  auto quantile = [&](double q) {
    const double pos = q * (sorted.size() - 1);
    const size_t lo = static_cast<size_t>(pos);
    const size_t hi = std::min(sorted.size() - 1, lo + 1);
    return sorted[lo] + (pos - lo) * (sorted[hi] - sorted[lo]);
  };
  s.mean = sum / kld.size();
  s.median = quantile(0.5);
  s.p99 = quantile(0.99);
  s.max = sorted.back();
  s.top1_agree = 100.0 * same / kld.size();
  return s;
}

}  // namespace kivi::runtime
