// kivi.Model, kivi.Session, the generation iterator and kivi.perplexity: the engine of
// src/model and src/runtime from Python. Every computation runs without the GIL; a
// session serializes its own calls (one sequence, one cache).
#include <pybind11/stl.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <memory>
#include <mutex>
#include <sstream>

#include "bindings.h"
#include "core/error.h"
#include "core/rng.h"
#include "core/timer.h"
#include "grammar/gbnf.h"
#include "io/mapped_file.h"
#include "model/model.h"
#include "runtime/engine_options.h"
#include "runtime/generation.h"
#include "runtime/perplexity.h"
#include "runtime/sampler.h"
#include "runtime/session.h"

namespace kivi::py {

namespace {

using runtime::SessionOptions;

// Session options from keywords: the CLI's options, named with underscores
// (kv_cache_k for --kv-cache-k), parsed by the library's one parser, and the context
// checked against memory as the CLI checks it. An unknown keyword is an error.
SessionOptions session_options(const model::Model& m, const pb::kwargs& kw) {
  runtime::OptionValues v;
  for (const auto& item : kw) {
    std::string k = pb::str(item.first);
    std::replace(k.begin(), k.end(), '_', '-');
    const pb::handle val = item.second;
    if (val.is_none()) continue;
    const runtime::OptionSpec* spec = runtime::find_session_option(k);
    const std::string name = pb::str(item.first);
    const std::string type = pb::str(pb::type::handle_of(val).attr("__name__"));
    if (!spec) {
      v[k] = "";  // the parser names it and suggests the closest option
    } else if (spec->is_flag()) {
      if (!pb::isinstance<pb::bool_>(val))
        fail("%s: expected True or False, got %s", name.c_str(), type.c_str());
      v[k] = val.cast<bool>() ? "true" : "false";
    } else if (spec->takes_integer()) {
      if (!pb::isinstance<pb::int_>(val) || pb::isinstance<pb::bool_>(val))
        fail("%s: expected an integer, got %s", name.c_str(), type.c_str());
      v[k] = pb::str(val);
    } else {
      if (!pb::isinstance<pb::str>(val))
        fail("%s: expected a string, got %s", name.c_str(), type.c_str());
      v[k] = pb::str(val);
    }
  }
  SessionOptions o = runtime::parse_session_options(v, runtime::OptionSpelling::kKeyword);
  o.ctx = runtime::resolve_context(m, o).ctx;
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

// Generation as an iterator of text pieces (whole UTF-8 characters): the library's
// Generator, so it ends where the CLI and the server end (EOS, BOS, end-of-turn tokens,
// stop strings, max_tokens, a full context); stop_reason says which.
class Generator {
 public:
  Generator(Session& s, std::vector<int> prompt, const runtime::GenerationOptions& o);
  std::string next();
  const std::vector<int>& token_ids() const { return generated_; }
  const std::string& text() const { return text_; }
  std::string stop_reason() const {
    return runtime::stop_reason_name(gen_->continuation().reason());
  }
  int prompt_tokens() const { return n_prompt_; }

 private:
  Session& s_;
  uint64_t epoch_;
  std::vector<int> generated_;
  int n_prompt_;
  std::unique_ptr<runtime::Generator> gen_;
  std::string text_;
};

class Session {
 public:
  Session(const Model& m, const pb::kwargs& kw) : m_(m) {
    const SessionOptions o = session_options(m.get(), kw);
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

Generator::Generator(Session& s, std::vector<int> prompt, const runtime::GenerationOptions& o)
    : s_(s), n_prompt_(static_cast<int>(prompt.size())) {
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
  gen_ = std::make_unique<runtime::Generator>(s.get(), o, prompt.empty() ? -1 : prompt.back());
  gen_->prefill(prompt);
  epoch_ = s.touch();
}

std::string Generator::next() {
  if (gen_->done()) throw pb::stop_iteration();
  if (s_.epoch() != epoch_) {
    fail(
        "generate: the session was used by another call since this generation started; start a new "
        "one");
  }
  std::string piece;
  bool done = false;
  {
    pb::gil_scoped_release nogil;
    std::lock_guard<std::mutex> lock(s_.mutex());
    // Steps that release no text (a character split across tokens, text held back as a
    // possible stop string) are not yielded.
    while (piece.empty() && !done) {
      const runtime::Continuation::Step st = gen_->next();
      if (st.token >= 0) generated_.push_back(st.token);
      piece += st.text;
      done = st.done;
    }
    epoch_ = s_.touch();
  }
  text_ += piece;
  if (piece.empty()) throw pb::stop_iteration();
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
  const SessionOptions opt = session_options(mp->get(), kw);
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

// The session keywords, from the library's option table.
std::string session_doc() {
  std::string d =
      "Session options (keywords; the CLI's options with underscores, and its defaults):\n";
  for (const auto& o : runtime::session_option_specs()) {
    const std::string name = runtime::spell_option(o.name, runtime::OptionSpelling::kKeyword);
    std::string left = "  " + name +
                       (o.is_flag() ? "=False"
                        : o.def[0]  ? "=" + std::string(o.def)
                                    : "=None");
    d += left + "\n      " + o.help + "\n";
  }
  return d;
}

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
           session_doc())
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
       session_doc())
          .c_str())
      .def(pb::init([](const Model& model, const pb::kwargs& kw) {
             return std::make_unique<Session>(model, kw);
           }),
           "model"_a, pb::keep_alive<1, 2>())
      .def(
          "generate",
          [](Session& self, const std::string& prompt, int max_tokens, double temperature,
             int top_k, double top_p, int64_t seed, bool ignore_eos,
             const std::optional<std::vector<std::string>>& stop,
             const std::optional<std::string>& grammar,
             const std::optional<std::string>& json_schema) {
            // The CLI's parser and ranges (runtime/engine_options.h), keywords spelled here.
            runtime::OptionValues v{{"max-tokens", std::to_string(max_tokens)},
                                    {"temp", strfmt("%.17g", temperature)},
                                    {"top-k", std::to_string(top_k)},
                                    {"top-p", strfmt("%.17g", top_p)},
                                    {"seed", std::to_string(seed)},
                                    {"ignore-eos", ignore_eos ? "true" : "false"}};
            if (json_schema) v["json-schema"] = *json_schema;
            runtime::GenerationOptions go =
                runtime::parse_generation_options(v, runtime::OptionSpelling::kKeyword);
            if (stop) go.stop = *stop;
            if (grammar) {
              if (json_schema) fail("grammar and json_schema both constrain the reply; give one");
              try {
                go.grammar =
                    std::make_shared<const grammar::Grammar>(grammar::Grammar::parse(*grammar));
              } catch (const grammar::GrammarError& e) {
                fail("grammar: %s", e.what());
              }
            }
            const auto& tk = self.model().tok();
            return std::make_unique<Generator>(self, tk.encode(prompt, tk.add_bos()), go);
          },
          pb::keep_alive<0, 1>(), "prompt"_a, "max_tokens"_a = 256, "temperature"_a = 0.8,
          "top_k"_a = 40, "top_p"_a = 0.95, "seed"_a = 42, "ignore_eos"_a = false,
          "stop"_a = pb::none(), "grammar"_a = pb::none(), "json_schema"_a = pb::none(),
          "Generates from `prompt` (BOS prepended as the vocabulary asks; the cache is emptied "
          "first) and\n"
          "returns an iterator of text pieces, each whole UTF-8 characters. temperature 0 is "
          "greedy; the\n"
          "defaults are the CLI's. The same seed gives the same text (seed -1: a random one). "
          "The reply\n"
          "ends at an end token (EOS, BOS, end of turn), a stop string, max_tokens (-1: no "
          "limit) or a full\n"
          "context; ignore_eos never samples the end tokens. grammar (GBNF text) or json_schema "
          "(JSON text\n"
          "or a file) makes the reply a sentence of the grammar, ending where it ends.")
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
         session_doc())
            .c_str());
}

}  // namespace kivi::py
