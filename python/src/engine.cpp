// kivi.Model, kivi.Session, the generation iterator and kivi.perplexity: the engine of
// src/model and src/runtime from Python. Every computation runs without the GIL; a
// session serializes its own calls (one sequence, one cache).
#include <pybind11/stl.h>

#include <cstring>
#include <fstream>
#include <memory>
#include <mutex>
#include <sstream>

#include "bindings.h"
#include "core/error.h"
#include "core/timer.h"
#include "io/mapped_file.h"
#include "model/model.h"
#include "runtime/perplexity.h"
#include "runtime/sampler.h"
#include "runtime/session.h"

namespace kivi::py {

namespace {

using runtime::SessionOptions;

// The session keywords, their defaults (the CLI's) and their parsing, in one place.
constexpr const char* kSessionKeywords =
    "kv_cache, kv_cache_k, kv_cache_v, int8_granularity, group_size, residual, key_flush, "
    "scale_dtype, attn_precision, window, ctx, threads";

template <typename T>
T keyword(const pb::handle& v, const char* name) {
  try {
    return v.cast<T>();
  } catch (const pb::cast_error&) {
    fail("%s: expected %s, got %s", name,
         std::is_same_v<T, std::string> ? "a string" : "an integer",
         std::string(pb::str(pb::type::handle_of(v).attr("__name__"))).c_str());
  }
}

// Session options from keywords (the CLI's KV and model options); an unknown keyword is an error.
SessionOptions session_options(const pb::kwargs& kw) {
  SessionOptions o;
  std::string base = "f32", gran = "head", flush = "batch", scale = "f16", prec = "exact";
  std::string kfmt, vfmt;
  int group = 32, residual = 128, window = 0, ctx = 0, threads = 0;
  for (const auto& item : kw) {
    const std::string k = pb::str(item.first);
    const pb::handle v = item.second;
    if (k == "kv_cache")
      base = keyword<std::string>(v, "kv_cache");
    else if (k == "kv_cache_k")
      kfmt = v.is_none() ? "" : keyword<std::string>(v, "kv_cache_k");
    else if (k == "kv_cache_v")
      vfmt = v.is_none() ? "" : keyword<std::string>(v, "kv_cache_v");
    else if (k == "int8_granularity")
      gran = keyword<std::string>(v, "int8_granularity");
    else if (k == "group_size")
      group = keyword<int>(v, "group_size");
    else if (k == "residual")
      residual = keyword<int>(v, "residual");
    else if (k == "key_flush")
      flush = keyword<std::string>(v, "key_flush");
    else if (k == "scale_dtype")
      scale = keyword<std::string>(v, "scale_dtype");
    else if (k == "attn_precision")
      prec = keyword<std::string>(v, "attn_precision");
    else if (k == "window")
      window = keyword<int>(v, "window");
    else if (k == "ctx")
      ctx = keyword<int>(v, "ctx");
    else if (k == "threads")
      threads = keyword<int>(v, "threads");
    else
      fail("unknown session option '%s' (valid: %s)", k.c_str(), kSessionKeywords);
  }
  kv::StreamFormat f{kv::parse_format(base, "kv_cache"), kv::parse_granularity(gran)};
  o.cache.k = f;
  o.cache.v = f;
  if (!kfmt.empty()) o.cache.k.format = kv::parse_format(kfmt, "kv_cache_k");
  if (!vfmt.empty()) o.cache.v.format = kv::parse_format(vfmt, "kv_cache_v");
  o.cache.group_size = group;
  o.cache.residual = residual;
  o.cache.key_flush = kv::parse_key_flush(flush);
  o.cache.param_type = kv::parse_param_type(scale);
  o.forward.precision = attn::parse_precision(prec);
  if (window < 0) fail("window = %d, expected >= 0", window);
  if (ctx < 0) fail("ctx = %d, expected >= 0 (0 = the model's context)", ctx);
  if (threads < 0 || threads > 1024) fail("threads = %d, expected 0 (all cores) to 1024", threads);
  o.forward.window = window;
  o.ctx = ctx;
  o.threads = threads;
  return o;
}

class Model {
 public:
  Model(const std::optional<std::string>& path, const std::optional<std::string>& tokenizer) {
    const std::string p = model::default_model_path(path.value_or(""));
    if (p.empty()) {
      fail(
          "no model given and none found: pass a path, set $KIVI_MODEL, or run "
          "scripts/get-model.sh "
          "(looked for models/stories260K.bin and ../shared/models/stories260K.bin)");
    }
    pb::gil_scoped_release nogil;
    m_ = model::Model::load(p, tokenizer.value_or(""));
  }
  const model::Model& get() const { return *m_; }
  const tok::Tokenizer& tok() const {
    if (!m_->has_tokenizer())
      fail("%s: the model has no tokenizer (pass tokenizer=PATH)", m_->path().c_str());
    return m_->tokenizer();
  }

 private:
  std::unique_ptr<model::Model> m_;
};

std::vector<int> tokens_of(const Model& m, const pb::object& tokens) {
  if (pb::isinstance<pb::str>(tokens)) return m.tok().encode(tokens.cast<std::string>(), true);
  std::vector<int> t;
  try {
    t = tokens.cast<std::vector<int>>();
  } catch (const pb::cast_error&) {
    fail("tokens: expected a string (encoded with BOS) or a sequence of token ids");
  }
  return t;
}

class Session;

// Generation as an iterator of text pieces; stops at an end-of-text token, after
// max_tokens, or when the context is full (stop_reason says which).
class Generator {
 public:
  Generator(Session& s, std::vector<int> prompt, int max_tokens, const runtime::SamplerOptions& so);
  std::string next();
  const std::vector<int>& token_ids() const { return generated_; }
  const std::string& text() const { return text_; }
  const std::string& stop_reason() const { return stop_; }
  int prompt_tokens() const { return n_prompt_; }

 private:
  Session& s_;
  uint64_t epoch_;
  std::vector<int> tokens_, generated_;
  int n_prompt_, max_tokens_;
  runtime::Sampler sampler_;
  const float* logits_ = nullptr;
  bool pending_ = false;  // the last generated token still needs its forward pass
  std::string text_, stop_;
};

class Session {
 public:
  Session(const Model& m, const pb::kwargs& kw) : m_(m) {
    const SessionOptions o = session_options(kw);
    pb::gil_scoped_release nogil;
    s_ = std::make_unique<runtime::Session>(m.get(), o);
  }

  const Model& model() const { return m_; }
  runtime::Session& get() { return *s_; }
  std::mutex& mutex() { return mu_; }
  // Incremented by every call that changes the cache, so a generator notices another user.
  uint64_t epoch() const { return epoch_; }
  uint64_t touch() { return ++epoch_; }

  pb::array logits(const pb::object& tokens, const std::string& mode) {
    const std::vector<int> t = tokens_of(m_, tokens);
    if (mode != "prefill" && mode != "stream")
      fail("logits: mode '%s' (valid: prefill, stream)", mode.c_str());
    const int n = static_cast<int>(t.size()), V = s_->vocab();
    if (n == 0) fail("logits: no tokens");
    if (n > s_->ctx()) fail("logits: %d tokens do not fit in the context of %d", n, s_->ctx());
    F32Array out(std::vector<int64_t>{n, V});
    float* o = out.mutable_data();
    {
      pb::gil_scoped_release nogil;
      std::lock_guard<std::mutex> lock(mu_);
      touch();
      s_->reset();
      if (mode == "prefill") {
        s_->prefill(t, o);
      } else {
        for (int i = 0; i < n; ++i)
          std::memcpy(o + static_cast<size_t>(i) * V, s_->decode(t[i]), V * sizeof(float));
      }
    }
    return out;
  }

  pb::array prefill(const pb::object& tokens) {
    const std::vector<int> t = tokens_of(m_, tokens);
    F32Array out(std::vector<int64_t>{s_->vocab()});
    {
      pb::gil_scoped_release nogil;
      std::lock_guard<std::mutex> lock(mu_);
      touch();
      const float* l = s_->prefill(t);
      std::memcpy(out.mutable_data(), l, sizeof(float) * s_->vocab());
    }
    return out;
  }

  pb::array decode(int token) {
    F32Array out(std::vector<int64_t>{s_->vocab()});
    {
      pb::gil_scoped_release nogil;
      std::lock_guard<std::mutex> lock(mu_);
      touch();
      const float* l = s_->decode(token);
      std::memcpy(out.mutable_data(), l, sizeof(float) * s_->vocab());
    }
    return out;
  }

  void reset() {
    pb::gil_scoped_release nogil;
    std::lock_guard<std::mutex> lock(mu_);
    touch();
    s_->reset();
  }

  pb::dict memory_stats() const {
    pb::dict d;
    d["n_tokens"] = s_->pos();
    d["bytes_used"] = s_->cache().bytes_used();
    d["bytes_reserved"] = s_->cache().bytes_reserved();
    d["f32_bytes"] = 2ull * s_->pos() * s_->cache().config().n_layers *
                     s_->cache().config().n_kv_heads * s_->cache().config().head_dim *
                     sizeof(float);
    return d;
  }

 private:
  const Model& m_;
  std::unique_ptr<runtime::Session> s_;
  std::mutex mu_;
  uint64_t epoch_ = 0;
};

Generator::Generator(Session& s, std::vector<int> prompt, int max_tokens,
                     const runtime::SamplerOptions& so)
    : s_(s),
      tokens_(std::move(prompt)),
      n_prompt_(static_cast<int>(tokens_.size())),
      max_tokens_(max_tokens),
      sampler_(so, s.get().vocab()) {
  if (max_tokens < 0) fail("generate: max_tokens = %d, expected >= 0", max_tokens);
  const int ctx = s.get().ctx();
  if (n_prompt_ >= ctx) {
    fail(
        "the prompt is %d tokens (with BOS), longer than the context can hold with room to "
        "generate (ctx %d)",
        n_prompt_, ctx);
  }
  pb::gil_scoped_release nogil;
  std::lock_guard<std::mutex> lock(s.mutex());
  s.get().reset();
  logits_ = s.get().prefill(tokens_);
  epoch_ = s.touch();
  if (max_tokens_ == 0) stop_ = "length";
}

std::string Generator::next() {
  if (!stop_.empty()) throw pb::stop_iteration();
  if (s_.epoch() != epoch_) {
    fail(
        "generate: the session was used by another call since this generation started; start a new "
        "one");
  }
  const auto& tk = s_.model().tok();
  std::string piece;
  {
    pb::gil_scoped_release nogil;
    std::lock_guard<std::mutex> lock(s_.mutex());
    if (pending_) {
      logits_ = s_.get().decode(tokens_.back());
      pending_ = false;
    }
    const int next = sampler_.sample(logits_);
    if (next == tk.eos_id() || next == tk.bos_id()) {
      stop_ = "eos";
    } else {
      piece = tk.decode(tokens_.back(), next);
      tokens_.push_back(next);
      generated_.push_back(next);
      text_ += piece;
      if (static_cast<int>(generated_.size()) == max_tokens_) {
        stop_ = "length";
      } else if (static_cast<int>(tokens_.size()) > s_.get().ctx()) {
        stop_ = "context";  // the new token has no room in the cache
      } else {
        pending_ = true;
      }
    }
    epoch_ = s_.touch();
  }
  if (stop_ == "eos") throw pb::stop_iteration();
  return piece;
}

std::string read_text(const std::string& path) {
  io::check_regular_file(path, "text");
  std::ifstream f(path, std::ios::binary);
  if (!f) fail("cannot read text file '%s'", path.c_str());
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// kivi.perplexity: what `kivi perplexity --json` prints, as a dict with the same fields.
pb::dict perplexity(const pb::object& model_or_path, const std::optional<std::string>& file,
                    const std::optional<std::string>& text, const std::string& mode_name,
                    const std::optional<std::string>& save_logits,
                    const std::optional<std::string>& kld_base, const pb::kwargs& kw) {
  std::unique_ptr<Model> own;
  const Model* mp = nullptr;
  if (pb::isinstance<Model>(model_or_path)) {
    mp = &model_or_path.cast<const Model&>();
  } else if (pb::isinstance<pb::str>(model_or_path) || model_or_path.is_none()) {
    own = std::make_unique<Model>(
        model_or_path.is_none() ? std::nullopt
                                : std::optional<std::string>(model_or_path.cast<std::string>()),
        std::nullopt);
    mp = own.get();
  } else {
    fail("perplexity: model must be a kivi.Model or a path");
  }
  if (file.has_value() == text.has_value()) fail("perplexity: give exactly one of file= and text=");
  const auto mode = runtime::parse_eval_mode(mode_name);
  const SessionOptions opt = session_options(kw);
  const std::string label = file ? *file : std::string("text");
  runtime::PerplexityResult r;
  kv::CacheConfig cc;
  int ctx = 0;
  int64_t clamped = 0;
  runtime::KldStats ks;
  double secs = 0;
  {
    pb::gil_scoped_release nogil;
    const std::string body = file ? read_text(*file) : *text;
    const model::Model& m = mp->get();
    runtime::Session s(m, opt);
    const std::vector<int> tokens = mp->tok().encode(body, false);
    if (tokens.size() < 2) {
      fail("%s: the text has %zu token%s; perplexity needs at least 2", label.c_str(),
           tokens.size(), tokens.size() == 1 ? "" : "s");
    }
    const int V = m.config().vocab_size;
    const uint64_t hash = runtime::hash_tokens(tokens);
    std::unique_ptr<runtime::LogprobWriter> writer;
    std::unique_ptr<runtime::LogprobReader> reader;
    if (save_logits) {
      writer = std::make_unique<runtime::LogprobWriter>(*save_logits, V, s.ctx(),
                                                        static_cast<int64_t>(tokens.size()), hash,
                                                        runtime::model_fingerprint(m));
    }
    if (kld_base)
      reader = std::make_unique<runtime::LogprobReader>(*kld_base, V, s.ctx(),
                                                        static_cast<int64_t>(tokens.size()), hash,
                                                        runtime::model_fingerprint(m));
    std::vector<float> base(V);
    std::vector<double> kld;
    std::vector<char> agree;
    auto sink = [&](int64_t, int token, const float* lp) {
      if (writer) writer->write(token, lp);
      if (reader) {
        const int bt = reader->read(base.data());
        if (bt != token)
          fail("%s: token mismatch at a scored position (file %d, text %d)", kld_base->c_str(), bt,
               token);
        kld.push_back(runtime::kl_divergence(base.data(), lp, V));
        agree.push_back(runtime::argmax(base.data(), V) == runtime::argmax(lp, V));
      }
    };
    const double t0 = now_seconds();
    r = runtime::evaluate_perplexity(s, tokens, mode, sink);
    secs = now_seconds() - t0;
    if (writer) writer->close();
    if (reader) ks = runtime::summarize_kld(kld, agree);
    cc = s.options().cache;
    ctx = s.ctx();
    clamped = s.cache().clamped();
  }
  pb::dict d;
  d["ppl"] = r.ppl;
  d["mean_nll"] = r.mean_nll;
  d["nll_stderr"] = r.nll_stderr;
  d["tokens"] = r.tokens;
  d["mode"] = runtime::eval_mode_name(mode);
  d["ctx"] = ctx;
  d["chunks"] = r.chunks;
  d["kv_cache"] = describe_cache(cc);
  d["bits_per_element_k"] = kv::bits_per_element(cc, kv::Stream::kKey);
  d["bits_per_element_v"] = kv::bits_per_element(cc, kv::Stream::kValue);
  d["int8_clamped"] = clamped;
  d["seconds"] = secs;
  d["tokens_per_second"] = r.tokens / secs;
  if (kld_base) {
    d["kld_mean"] = ks.mean;
    d["kld_median"] = ks.median;
    d["kld_p99"] = ks.p99;
    d["kld_max"] = ks.max;
    d["top1_agree"] = ks.top1_agree;
    d["first_disagree"] = ks.first_disagree;
  }
  return d;
}

pb::dict config_dict(const model::ModelConfig& c) {
  pb::dict d;
  d["arch"] = c.arch;
  d["name"] = c.name;
  d["dim"] = c.dim;
  d["hidden_dim"] = c.hidden_dim;
  d["n_layers"] = c.n_layers;
  d["n_heads"] = c.n_heads;
  d["n_kv_heads"] = c.n_kv_heads;
  d["head_dim"] = c.head_dim();
  d["vocab_size"] = c.vocab_size;
  d["ctx"] = c.ctx;
  d["rope_theta"] = c.rope_theta;
  d["norm_eps"] = c.norm_eps;
  d["shared_classifier"] = c.shared_classifier;
  return d;
}

constexpr const char* kSessionDoc = R"(Session options (keywords, the CLI's defaults):
  kv_cache="f32"        f32, f16, int8, kivi2, kivi4, kivi8 (keys and values)
  kv_cache_k=None, kv_cache_v=None   per-stream formats overriding kv_cache
  int8_granularity="head"  tensor, token, head, group
  group_size=32         G: KIVI key groups (tokens), value and int8 groups (channels)
  residual=128          R: the last R tokens stay in full precision (a multiple of G)
  key_flush="batch"     batch or group
  scale_dtype="f16"     f16 or f32 scales and zero points
  attn_precision="exact"  exact or fast
  window=0              sliding-window attention over the last N tokens (0 = full)
  ctx=0                 tokens the cache holds (0 = the model's context)
  threads=0             worker threads (0 = all cores))";

}  // namespace

void bind_engine(pb::module_& m) {
  using namespace pybind11::literals;
  pb::class_<Model>(
      m, "Model", "A loaded model: a llama2.c checkpoint (.bin) or a GGUF file, and its tokenizer.")
      .def(pb::init<const std::optional<std::string>&, const std::optional<std::string>&>(),
           "path"_a = pb::none(), "tokenizer"_a = pb::none(),
           "Loads `path` (default: $KIVI_MODEL, models/stories260K.bin, "
           "../shared/models/stories260K.bin);\n"
           "llama2.c models take their tokenizer from `tokenizer` or tok<vocab>.bin beside the "
           "model.")
      .def(
          "session",
          [](const Model& self, const pb::kwargs& kw) {
            return std::make_unique<Session>(self, kw);
          },
          pb::keep_alive<0, 1>(),
          (std::string("A new session (cache, activations, threads) over this model.\n") +
           kSessionDoc)
              .c_str())
      .def(
          "tokenize",
          [](const Model& self, const std::string& text, bool bos) {
            return self.tok().encode(text, bos);
          },
          "text"_a, "bos"_a = true,
          "Token ids of `text` (BOS first when bos; a dummy-prefix space before the text).")
      .def(
          "detokenize",
          [](const Model& self, const std::vector<int>& ids) {
            const int V = self.get().config().vocab_size;
            for (int t : ids) {
              if (t < 0 || t >= V)
                fail("detokenize: token id %d outside the vocabulary (0 to %d)", t, V - 1);
            }
            return self.tok().decode_all(ids);
          },
          "tokens"_a,
          "The text of a sequence of token ids (BOS and other control tokens give no text).")
      .def_property_readonly("path", [](const Model& self) { return self.get().path(); })
      .def_property_readonly("format", [](const Model& self) { return self.get().format(); })
      .def_property_readonly(
          "config", [](const Model& self) { return config_dict(self.get().config()); },
          "The hyperparameters: dim, hidden_dim, n_layers, n_heads, n_kv_heads, head_dim, ...")
      .def_property_readonly("vocab_size",
                             [](const Model& self) { return self.get().config().vocab_size; })
      .def_property_readonly("ctx", [](const Model& self) { return self.get().config().ctx; })
      .def_property_readonly("bos_id", [](const Model& self) { return self.tok().bos_id(); })
      .def_property_readonly("eos_id", [](const Model& self) { return self.tok().eos_id(); })
      .def("__repr__", [](const Model& self) {
        const auto& c = self.get().config();
        return strfmt(
            "kivi.Model('%s', %s, dim=%d, n_layers=%d, n_heads=%d, n_kv_heads=%d, vocab=%d, "
            "ctx=%d)",
            self.get().path().c_str(), self.get().format().c_str(), c.dim, c.n_layers, c.n_heads,
            c.n_kv_heads, c.vocab_size, c.ctx);
      });

  pb::class_<Generator>(
      m, "Generator",
      "An iterator of generated text pieces; token_ids, text and stop_reason ('eos', 'length',\n"
      "'context', or '' while running) describe the generation so far.")
      .def("__iter__", [](Generator& g) -> Generator& { return g; })
      .def("__next__", &Generator::next)
      .def_property_readonly("token_ids", &Generator::token_ids)
      .def_property_readonly("text", &Generator::text)
      .def_property_readonly("stop_reason", &Generator::stop_reason)
      .def_property_readonly("prompt_tokens", &Generator::prompt_tokens);

  pb::class_<Session>(
      m, "Session",
      (std::string(
           "One sequence being generated or scored: the model, a KV cache and worker threads.\n") +
       kSessionDoc)
          .c_str())
      .def(pb::init([](const Model& model, const pb::kwargs& kw) {
             return std::make_unique<Session>(model, kw);
           }),
           "model"_a, pb::keep_alive<1, 2>())
      .def(
          "generate",
          [](Session& self, const std::string& prompt, int max_tokens, double temperature,
             int top_k, double top_p, uint64_t seed) {
            if (!(temperature >= 0.0))
              fail("generate: temperature = %g, expected >= 0", temperature);
            if (top_k < 0) fail("generate: top_k = %d, expected >= 0", top_k);
            if (!(top_p >= 0.0 && top_p <= 1.0))
              fail("generate: top_p = %g, expected 0 to 1", top_p);
            runtime::SamplerOptions so;
            so.temperature = static_cast<float>(temperature);  // as the CLI parses --temp
            so.top_k = top_k;
            so.top_p = static_cast<float>(top_p);
            so.seed = seed;
            return std::make_unique<Generator>(self, self.model().tok().encode(prompt, true),
                                               max_tokens, so);
          },
          pb::keep_alive<0, 1>(), "prompt"_a, "max_tokens"_a = 256, "temperature"_a = 0.8,
          "top_k"_a = 40, "top_p"_a = 0.95, "seed"_a = 42,
          "Generates from `prompt` (BOS prepended; the cache is emptied first) and returns an "
          "iterator of\n"
          "text pieces. temperature 0 is greedy; the defaults are the CLI's. The same seed gives "
          "the same text.")
      .def("logits", &Session::logits, "tokens"_a, "mode"_a = "prefill",
           "Logits float32 [n, vocab] after every position of `tokens` (ids, or a string encoded "
           "with BOS),\n"
           "from an empty cache: mode 'prefill' (batched, as `kivi logits`) or 'stream' (one at a "
           "time).")
      .def("prefill", &Session::prefill, "tokens"_a,
           "Feeds tokens after those in the cache; the last logits [vocab].")
      .def("decode", &Session::decode, "token"_a, "Feeds one token; its logits [vocab].")
      .def("reset", &Session::reset, "Empties the cache.")
      .def("memory_stats", &Session::memory_stats,
           "KV cache bytes used and reserved, and an f32 cache's bytes.")
      .def_property_readonly(
          "pos", [](Session& s) { return s.get().pos(); }, "Tokens in the cache.")
      .def_property_readonly("ctx", [](Session& s) { return s.get().ctx(); })
      .def_property_readonly("vocab_size", [](Session& s) { return s.get().vocab(); })
      .def_property_readonly(
          "kv_cache", [](Session& s) { return describe_cache(s.get().options().cache); },
          "The cache configuration, as the CLI describes it.")
      .def("__repr__", [](Session& s) {
        return strfmt("kivi.Session(kv_cache='%s', ctx=%d, pos=%d)",
                      describe_cache(s.get().options().cache).c_str(), s.get().ctx(),
                      s.get().pos());
      });

  m.def("perplexity", &perplexity, "model"_a = pb::none(), pb::kw_only(), "file"_a = pb::none(),
        "text"_a = pb::none(), "mode"_a = "streaming", "save_logits"_a = pb::none(),
        "kld_base"_a = pb::none(),
        (std::string("Scores a text (file= or text=) exactly as `kivi perplexity --json` does, and "
                     "returns its\n"
                     "fields: ppl, mean_nll, nll_stderr, tokens, mode, ctx, chunks, kv_cache, "
                     "bits_per_element_k,\n"
                     "bits_per_element_v, int8_clamped, seconds, tokens_per_second (and kld_mean, "
                     "kld_median,\n"
                     "kld_p99, kld_max, top1_agree, first_disagree with kld_base=).\n"
                     "model: a kivi.Model or a path (None: the default model). mode: streaming or "
                     "batched.\n") +
         kSessionDoc)
            .c_str());
}

}  // namespace kivi::py
