#include "model/model.h"

#include <sys/stat.h>

#include <cstdlib>
#include <cstring>
#include <utility>

#include "core/error.h"
#include "core/f16.h"
#include "grammar/token_mask.h"
#include "quant/dequant.h"

namespace kivi::model {

static bool file_exists(const std::string& p) {
  struct stat st;
  return !p.empty() && stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string default_model_path(const std::string& cli_value) {
  if (!cli_value.empty()) return cli_value;
  if (const char* env = std::getenv("KIVI_MODEL"); env && *env) return env;
  for (const char* p : {"models/stories260K.bin", "../shared/models/stories260K.bin"}) {
    if (file_exists(p)) return p;
  }
  return "";
}

std::string default_tokenizer_path(const std::string& model_path) {
  const auto slash = model_path.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "." : model_path.substr(0, slash);
  for (const char* name : {"tok512.bin", "tokenizer.bin"}) {
    const std::string p = dir + "/" + name;
    if (file_exists(p)) return p;
  }
  return "";
}

std::shared_ptr<const grammar::VocabTrie> Model::vocab_trie(bool markup) const {
  if (!tok_) fail("the model has no tokenizer, which a grammar needs");
  const int i = markup ? 1 : 0;
  std::call_once(trie_once_[i],
                 [&] { trie_[i] = std::make_shared<const grammar::VocabTrie>(*tok_, markup); });
  return trie_[i];
}

size_t Model::weight_bytes() const {
  size_t b = w_.token_embd.bytes();
  if (!cfg_.shared_classifier) b += w_.output.bytes();
  for (const auto& L : w_.layers) {
    b += L.wq.bytes() + L.wk.bytes() + L.wv.bytes() + L.wo.bytes() + L.w_gate.bytes() +
         L.w_down.bytes() + L.w_up.bytes() + (L.attn_norm.size() + L.ffn_norm.size()) * 4;
    b += L.router.bytes();
    for (size_t e = 0; e < L.gate_exps.size(); ++e)
      b += L.gate_exps[e].bytes() + L.up_exps[e].bytes() + L.down_exps[e].bytes();
    b += (L.bq.size() + L.bk.size() + L.bv.size() + L.q_norm.size() + L.k_norm.size()) * 4;
  }
  return b + w_.output_norm.size() * 4;
}

ModelConfig llama2c_config(const io::Llama2cCheckpoint& ck) {
  const io::Llama2cHeader& h = ck.header;
  ModelConfig c;
  c.dim = h.dim;
  c.hidden_dim = h.hidden_dim;
  c.n_layers = h.n_layers;
  c.n_heads = h.n_heads;
  c.n_kv_heads = h.n_kv_heads;
  c.vocab_size = h.vocab_size;
  c.ctx = h.seq_len;
  c.shared_classifier = ck.shared_classifier;
  return c;
}

bool Model::copy_weights_to_memory() {
  io::MappedFile* map = gguf_ ? gguf_->mapped() : l2c_ ? l2c_->map.get() : nullptr;
  return map && map->copy_to_memory();
}

std::unique_ptr<Model> Model::load(const std::string& path, const std::string& tok) {
  io::check_regular_file(path, "model");
  if (io::is_gguf_file(path)) return load_gguf(path, tok);
  return load_llama2c(path, tok);
}

// The type of a weight tensor, or an error naming the tensor, its type and the types
// this engine reads.
static const quant::TypeInfo* weight_type(const std::string& path, const io::GgufTensor& t) {
  const quant::TypeInfo* ti = t.type_info();
  if (!ti || !ti->weight || !t.data) {
    fail("%s: tensor '%s' has type %s, which kivi.cpp cannot read as a weight (supported: %s)",
         path.c_str(), t.name.c_str(), io::ggml_type_name(t.type).c_str(),
         quant::supported_weight_types());
  }
  return ti;
}

static ops::Matrix f32_matrix(const float* p, int64_t rows, int64_t cols) {
  return ops::Matrix{p, ops::DType::kF32, rows, cols};
}

std::unique_ptr<Model> Model::load_llama2c(const std::string& path, const std::string& tok_path) {
  auto m = std::unique_ptr<Model>(new Model());
  m->path_ = path;
  m->format_ = "llama2.c";
  m->l2c_ = io::read_llama2c(path);
  const io::Llama2cCheckpoint& ck = *m->l2c_;
  ModelConfig& c = m->cfg_;
  c = llama2c_config(ck);
  c.name = path.substr(path.find_last_of('/') + 1);
  c.validate(path);
  const int64_t dim = c.dim, hid = c.hidden_dim, kv = c.kv_dim();
  Weights& w = m->w_;
  w.token_embd = f32_matrix(ck.token_embd, c.vocab_size, dim);
  w.layers.resize(c.n_layers);
  for (int l = 0; l < c.n_layers; ++l) {
    LayerWeights& L = w.layers[l];
    L.attn_norm.assign(ck.rms_att + l * dim, ck.rms_att + (l + 1) * dim);
    L.ffn_norm.assign(ck.rms_ffn + l * dim, ck.rms_ffn + (l + 1) * dim);
    L.wq = f32_matrix(ck.wq + l * dim * dim, dim, dim);
    L.wk = f32_matrix(ck.wk + l * kv * dim, kv, dim);
    L.wv = f32_matrix(ck.wv + l * kv * dim, kv, dim);
    L.wo = f32_matrix(ck.wo + l * dim * dim, dim, dim);
    L.w_gate = f32_matrix(ck.w1 + l * hid * dim, hid, dim);
    L.w_down = f32_matrix(ck.w2 + l * dim * hid, dim, hid);
    L.w_up = f32_matrix(ck.w3 + l * hid * dim, hid, dim);
  }
  w.output_norm.assign(ck.rms_final, ck.rms_final + dim);
  w.output = f32_matrix(ck.wcls, c.vocab_size, dim);
  const std::string tp = tok_path.empty() ? default_tokenizer_path(path) : tok_path;
  if (tp.empty()) {
    fail(
        "%s: llama2.c checkpoints carry no tokenizer; give one with -t/--tokenizer (looked for "
        "tok%d.bin and tokenizer.bin beside the model)",
        path.c_str(), c.vocab_size);
  }
  m->tok_ = std::make_unique<tok::Tokenizer>(tok::Tokenizer::from_llama2c(tp, c.vocab_size));
  return m;
}

// Sliding-window attention: <arch>.attention.sliding_window (the window W, >= 1) and
// optionally attention.sliding_window_pattern, a u32 N (llama.cpp: layer l is windowed
// iff l % N < N - 1) or an array of one bool or integer per layer (nonzero: windowed).
// Without a pattern every layer is windowed.
static void read_sliding_window(const io::GgufFile& f, const std::string& path,
                                const std::string& A, ModelConfig& c) {
  const std::string wkey = A + "attention.sliding_window", pkey = wkey + "_pattern";
  // Gemma 2 always alternates (window 4096 unless the file says otherwise, every second
  // layer global); Gemma 3 files with a window make every sixth layer global.
  // gpt-oss windows every even layer (the window comes from the file).
  const int default_window = c.arch == "gemma2" ? 4096 : 0;
  const int default_pattern = c.arch == "gemma2" || c.arch == "gpt-oss" ? 2
                              : c.arch == "gemma3"                      ? 6
                                                                        : 0;
  if (!f.has(wkey) && default_window == 0) {
    if (f.has(pkey))
      fail("%s: metadata '%s' without '%s'", path.c_str(), pkey.c_str(), wkey.c_str());
    return;
  }
  const uint64_t w = f.has(wkey) ? f.get_uint(wkey) : static_cast<uint64_t>(default_window);
  if (w < 1 || w > static_cast<uint64_t>(kMaxContext)) {
    fail("%s: metadata '%s' = %llu, expected 1 to %d", path.c_str(), wkey.c_str(),
         (unsigned long long)w, kMaxContext);
  }
  c.sliding_window = static_cast<int>(w);
  const io::GgufValue* p = f.find(pkey);
  if (!p) {
    c.set_swa_pattern(default_pattern);
    return;
  }
  if (p->type != io::GgufType::kArray) {
    const uint64_t n = f.get_uint(pkey);
    if (n < 1 || n > static_cast<uint64_t>(c.n_layers)) {
      fail("%s: metadata '%s' = %llu, expected 1 to the layer count %d", path.c_str(), pkey.c_str(),
           (unsigned long long)n, c.n_layers);
    }
    c.set_swa_pattern(static_cast<int>(n));
    return;
  }
  size_t elem = 0;
  switch (p->elem_type) {
    case io::GgufType::kBool:
    case io::GgufType::kU8:
    case io::GgufType::kI8:
      elem = 1;
      break;
    case io::GgufType::kU32:
    case io::GgufType::kI32:
      elem = 4;
      break;
    default:
      fail("%s: metadata '%s' is an array of %s, expected bools or integers", path.c_str(),
           pkey.c_str(), io::gguf_type_name(p->elem_type));
  }
  if (p->count != static_cast<uint64_t>(c.n_layers)) {
    fail("%s: metadata '%s' has %llu elements, expected one per layer (%d)", path.c_str(),
         pkey.c_str(), (unsigned long long)p->count, c.n_layers);
  }
  if (!p->elems || p->elems_bytes < p->count * elem)
    fail("%s: metadata '%s' is truncated", path.c_str(), pkey.c_str());
  c.swa_layers.assign(c.n_layers, 0);
  for (int l = 0; l < c.n_layers; ++l) {
    uint32_t x = 0;
    std::memcpy(&x, p->elems + static_cast<size_t>(l) * elem, elem);  // little-endian
    c.swa_layers[l] = x != 0;
  }
}

// RoPE frequency scaling from "<arch>.rope.scaling.*": "none", "linear" (angles divided by
// rope.scaling.factor) and "llama3" (llama3_rope_factors from rope.scaling.factor,
// low_freq_factor, high_freq_factor and original_context_length, used when the file
// has no rope_freqs.weight, which llama.cpp's converter writes instead), "yarn" (factor,
// original_context_length, yarn_beta_fast, yarn_beta_slow) and "longrope" (read_long_rope).
// Anything else is an error naming it.
// Gemma's caps, windowed layers' RoPE base and attention scale (llama.cpp's defaults).
static void read_gemma(const io::GgufFile& f, const std::string& path, const std::string& A,
                       ModelConfig& c) {
  const bool g2 = c.arch == "gemma2";
  c.attn_softcap =
      g2 ? static_cast<float>(f.get_float_opt(A + "attn_logit_softcapping").value_or(50.0)) : 0.0f;
  c.final_softcap =
      static_cast<float>(f.get_float_opt(A + "final_logit_softcapping").value_or(g2 ? 30.0 : 0.0));
  if (const auto b = f.get_float_opt(A + "rope.freq_base_swa")) {
    c.rope_theta_swa = static_cast<float>(*b);
  }
  if (g2 && !(c.attn_softcap > 0.0f)) {
    fail("%s: %sattn_logit_softcapping = %g, expected above 0", path.c_str(), A.c_str(),
         c.attn_softcap);
  }
  // Gemma 2's windowed layers keep the global scaling; Gemma 3's are unscaled.
  c.rope_freq_scale_swa = g2 ? c.rope_freq_scale : 1.0f;
  // The 27B models scale queries by 1/sqrt(dim / n_heads), the others by 1/sqrt(head_dim).
  const bool big = c.n_layers == (g2 ? 46 : 62);
  c.attn_scale = big ? 1.0f / std::sqrt(static_cast<float>(c.dim / c.n_heads)) : 0.0f;
}

// LongRoPE: short and long frequency divisors chosen by the context run with, the
// original context that separates them and the attention factor on every cos and sin.
static void read_long_rope(const io::GgufFile& f, const std::string& path, const std::string& A,
                           ModelConfig& c) {
  const io::GgufTensor* lt = f.find_tensor("rope_factors_long.weight");
  const io::GgufTensor* st = f.find_tensor("rope_factors_short.weight");
  if (!lt && !st) return;
  if (!lt || !st) {
    fail("%s: tensor '%s' without '%s' (LongRoPE needs both)", path.c_str(),
         lt ? "rope_factors_long.weight" : "rope_factors_short.weight",
         lt ? "rope_factors_short.weight" : "rope_factors_long.weight");
  }
  if (!c.rope_freq_factors.empty())
    fail("%s: rope_freqs.weight and LongRoPE factors together", path.c_str());
  const uint64_t half = static_cast<uint64_t>(c.rope_dim() / 2);
  auto read = [&](const io::GgufTensor* t, const char* name) {
    if (t->dims.size() != 1 || t->dims[0] != half) {
      fail("%s: tensor '%s' should be a vector of the rotated dims / 2 = %llu elements",
           path.c_str(), name, (unsigned long long)half);
    }
    std::vector<float> v(half);
    quant::dequantize_row(weight_type(path, *t)->type, t->data, v.data(),
                          static_cast<int64_t>(half));
    for (size_t i = 0; i < v.size(); ++i) {
      if (!(v[i] > 0.0f) || !std::isfinite(v[i]))
        fail("%s: %s[%zu] = %g, expected a finite value above 0", path.c_str(), name, i, v[i]);
    }
    return v;
  };
  c.rope_factors_long = read(lt, "rope_factors_long.weight");
  c.rope_freq_factors = read(st, "rope_factors_short.weight");
  const uint64_t orig = f.get_uint_opt(A + "rope.scaling.original_context_length")
                            .value_or(static_cast<uint64_t>(c.ctx));
  if (orig < 1 || orig > static_cast<uint64_t>(kMaxContext)) {
    fail("%s: %srope.scaling.original_context_length = %llu, expected 1 to %d", path.c_str(),
         A.c_str(), (unsigned long long)orig, kMaxContext);
  }
  c.rope_orig_ctx = static_cast<int>(orig);
  const double af = f.get_float_opt(A + "rope.scaling.attn_factor").value_or(1.0);
  if (!(af > 0.0) || af > 100.0)
    fail("%s: %srope.scaling.attn_factor = %g, expected above 0, at most 100", path.c_str(),
         A.c_str(), af);
  c.rope_attn_factor = static_cast<float>(af);
}

static void read_rope_scaling(const io::GgufFile& f, const std::string& path, const std::string& A,
                              ModelConfig& c) {
  const std::string type = f.get_string_opt(A + "rope.scaling.type").value_or("none");
  auto number = [&](const std::string& key, double dflt) {
    return f.get_float_opt(A + "rope.scaling." + key).value_or(dflt);
  };
  if (type == "none" || type == "longrope") return;  // LongRoPE: read_long_rope
  if (type == "linear") {
    const double factor = number("factor", 1.0);
    if (!(factor >= 1.0) || factor > 1e6)
      fail("%s: %srope.scaling.factor = %g, expected 1 to 1e6", path.c_str(), A.c_str(), factor);
    c.rope_freq_scale = static_cast<float>(1.0 / factor);
    return;
  }
  if (type == "yarn") {
    const double factor = number("factor", 1.0);
    if (!(factor >= 1.0) || factor > 1e6)
      fail("%s: %srope.scaling.factor = %g, expected 1 to 1e6", path.c_str(), A.c_str(), factor);
    const double orig = number("original_context_length", c.ctx);
    if (!(orig >= 1.0) || orig > kMaxContext) {
      fail("%s: %srope.scaling.original_context_length = %g, expected 1 to %d", path.c_str(),
           A.c_str(), orig, kMaxContext);
    }
    if (f.has(A + "rope.scaling.yarn_log_multiplier") &&
        number("yarn_log_multiplier", 0.0) != 0.0) {
      fail("%s: %srope.scaling.yarn_log_multiplier is not supported", path.c_str(), A.c_str());
    }
    c.rope_freq_scale = static_cast<float>(1.0 / factor);
    c.yarn_orig_ctx = static_cast<int>(orig);
    c.yarn_beta_fast = static_cast<float>(number("yarn_beta_fast", 32.0));
    c.yarn_beta_slow = static_cast<float>(number("yarn_beta_slow", 1.0));
    return;
  }
  if (type == "llama3") {
    if (f.find_tensor("rope_freqs.weight")) return;  // the stored divisors win
    try {
      c.rope_freq_factors =
          llama3_rope_factors(c.rope_dim(), c.rope_theta, static_cast<float>(number("factor", 8.0)),
                              static_cast<float>(number("low_freq_factor", 1.0)),
                              static_cast<float>(number("high_freq_factor", 4.0)),
                              static_cast<float>(number("original_context_length", 8192.0)));
    } catch (const Error& e) {
      fail("%s: %s", path.c_str(), e.what());
    }
    return;
  }
  fail(
      "%s: %srope.scaling.type = '%s' is not supported (supported: none, linear, llama3, yarn, "
      "longrope)",
      path.c_str(), A.c_str(), type.c_str());
}

// NeoX RoPE pairs channel i of a head with i + D/2; a partial rotary head (rope_dim r < D)
// pairs i with i + r/2 among its first r channels and leaves the rest. Ordering every
// head's query and key channels (both alike, so every score is unchanged) as [0, r/2),
// D/2 - r/2 unrotated ones, [r/2, r), the other unrotated ones turns the rotated pairs
// into (j, j + D/2) for j < r/2, the kernels' whole-head pairing, with the identity in the
// pairs beyond (model/forward.cpp fill_rope_row). Values and outputs keep their order.
std::vector<int> partial_rotary_order(int D, int r) {
  std::vector<int> order(D);
  const int h = r / 2, H = D / 2, pass = H - h;
  for (int j = 0; j < h; ++j) {
    order[j] = j;
    order[H + j] = h + j;
  }
  for (int j = 0; j < pass; ++j) {
    order[h + j] = r + j;
    order[H + h + j] = r + pass + j;
  }
  return order;
}

void Model::reorder_partial_rotary(Model& m) {
  const ModelConfig& c = m.cfg_;
  const int D = c.head_dim();
  const std::vector<int> order = partial_rotary_order(D, c.rope_dim());
  auto rows = [&](const ops::Matrix& w, AlignedBuffer<uint8_t>& buf) {
    const size_t rb = quant::row_bytes(w.dtype, static_cast<uint64_t>(w.cols));
    buf.reset(rb * static_cast<size_t>(w.rows), false);
    for (int64_t r = 0; r < w.rows; ++r)
      std::memcpy(buf.data() + rb * r, w.row(r / D * D + order[r % D]), rb);
    return ops::Matrix{buf.data(), w.dtype, w.rows, w.cols};
  };
  auto vec = [&](std::vector<float>& v) {
    if (v.empty()) return;
    std::vector<float> o(v.size());
    for (size_t i = 0; i < v.size(); ++i) o[i] = v[i / D * D + order[i % D]];
    v = std::move(o);
  };
  m.reordered_.resize(2 * m.w_.layers.size());
  for (size_t l = 0; l < m.w_.layers.size(); ++l) {
    LayerWeights& L = m.w_.layers[l];
    L.wq = rows(L.wq, m.reordered_[2 * l]);
    L.wk = rows(L.wk, m.reordered_[2 * l + 1]);
    for (auto* v : {&L.bq, &L.bk, &L.q_norm, &L.k_norm}) vec(*v);
  }
}

std::unique_ptr<Model> Model::load_gguf(const std::string& path, const std::string& tok_path) {
  auto m = std::unique_ptr<Model>(new Model());
  m->path_ = path;
  m->format_ = "gguf";
  m->gguf_ = std::make_unique<io::GgufFile>(path);
  const io::GgufFile& f = *m->gguf_;
  ModelConfig& c = m->cfg_;
  const std::string arch = f.get_string_opt("general.architecture").value_or("");
  try {
    apply_arch_defaults(c, arch);
  } catch (const Error& e) {
    fail("%s: %s", path.c_str(), e.what());
  }
  // Hyperparameters live under "<arch>.": llama.embedding_length, qwen2.embedding_length, ...
  const std::string A = arch + ".";
  c.name = f.get_string_opt("general.name").value_or(path.substr(path.find_last_of('/') + 1));
  auto get_int = [&](const std::string& key, uint64_t max) -> int {
    const uint64_t v = f.get_uint(key);
    if (v > max)
      fail("%s: metadata '%s' = %llu, expected at most %llu", path.c_str(), key.c_str(),
           (unsigned long long)v, (unsigned long long)max);
    return static_cast<int>(v);
  };
  c.dim = get_int(A + "embedding_length", 1 << 20);
  c.hidden_dim = get_int(A + "feed_forward_length", 1 << 22);
  c.n_layers = get_int(A + "block_count", 1 << 16);
  c.n_heads = get_int(A + "attention.head_count", 1 << 16);
  c.n_kv_heads = f.has(A + "attention.head_count_kv")
                     ? get_int(A + "attention.head_count_kv", 1 << 16)
                     : c.n_heads;
  c.ctx = get_int(A + "context_length", kMaxContext);
  c.rope_theta = static_cast<float>(f.get_float_opt(A + "rope.freq_base").value_or(10000.0));
  c.norm_eps =
      static_cast<float>(f.get_float_opt(A + "attention.layer_norm_rms_epsilon").value_or(1e-5));
  c.synthetic = f.get_bool_opt("kivi.synthetic").value_or(false);
  if (f.has(A + "attention.key_length")) {
    const int kl = get_int(A + "attention.key_length", 1 << 16);
    const int vl =
        f.has(A + "attention.value_length") ? get_int(A + "attention.value_length", 1 << 16) : kl;
    if (vl != kl) {
      fail(
          "%s: %sattention.key_length = %d but value_length = %d; different key and value head "
          "sizes are not "
          "supported",
          path.c_str(), A.c_str(), kl, vl);
    }
    // Kept only when it differs from dim / n_heads.
    if (c.n_heads == 0 || static_cast<int64_t>(kl) * c.n_heads != c.dim) c.key_length = kl;
  }
  if (f.has(A + "expert_count") && f.get_uint(A + "expert_count") > 0) {
    // A mixture of experts: the experts' width, when the file gives it apart from the
    // (then unused) dense FFN's.
    c.n_experts = get_int(A + "expert_count", 1 << 16);
    if (!f.has(A + "expert_used_count"))
      fail("%s: %sexpert_count = %d without %sexpert_used_count", path.c_str(), A.c_str(),
           c.n_experts, A.c_str());
    c.n_experts_used = get_int(A + "expert_used_count", 1 << 16);
    if (f.has(A + "expert_feed_forward_length"))
      c.hidden_dim = get_int(A + "expert_feed_forward_length", 1 << 22);
  } else if (arch == "qwen3moe" || arch == "gpt-oss") {
    fail("%s: architecture %s without %sexpert_count", path.c_str(), arch.c_str(), A.c_str());
  }
  const io::GgufTensor* emb = f.find_tensor("token_embd.weight");
  if (!emb) fail("%s: missing tensor 'token_embd.weight'", path.c_str());
  if (emb->dims.size() != 2)
    fail("%s: tensor 'token_embd.weight' has %zu dimensions, expected 2", path.c_str(),
         emb->dims.size());
  if (f.has(A + "vocab_size")) {
    c.vocab_size = get_int(A + "vocab_size", 1 << 22);
  } else if (f.has("tokenizer.ggml.tokens")) {
    c.vocab_size =
        static_cast<int>(std::min<uint64_t>(f.array_size("tokenizer.ggml.tokens"), 1u << 23));
  } else {
    c.vocab_size = static_cast<int>(std::min<uint64_t>(emb->dims[1], 1u << 23));
  }
  // No output.weight: the classifier is the token embedding (tied), in every architecture.
  c.shared_classifier = f.find_tensor("output.weight") == nullptr;
  // Llama files may carry Q/K/V biases as well (llama.cpp reads them when present).
  if (arch == "llama" && f.find_tensor("blk.0.attn_q.bias")) c.attn_bias = true;
  c.validate(path);
  // Partial rotary embeddings: RoPE turns the first rope.dimension_count channels of a head.
  if (auto rd = f.get_uint_opt(A + "rope.dimension_count");
      rd && *rd != static_cast<uint64_t>(c.head_dim())) {
    if (*rd < 2 || *rd > static_cast<uint64_t>(c.head_dim()) || *rd % 2 != 0) {
      fail(
          "%s: %srope.dimension_count = %llu, expected an even number of 2 to the head "
          "dimension %d",
          path.c_str(), A.c_str(), (unsigned long long)*rd, c.head_dim());
    }
    c.rope_dims = static_cast<int>(*rd);
  }
  if (const io::GgufTensor* rf = f.find_tensor("rope_freqs.weight")) {
    if (rf->dims.size() != 1 || rf->dims[0] > (1u << 16)) {
      fail("%s: tensor 'rope_freqs.weight' should be a vector of the rotated dims / 2 elements",
           path.c_str());
    }
    c.rope_freq_factors.resize(static_cast<size_t>(rf->dims[0]));
    quant::dequantize_row(weight_type(path, *rf)->type, rf->data, c.rope_freq_factors.data(),
                          static_cast<int64_t>(rf->dims[0]));
  }
  c.validate(path);
  read_rope_scaling(f, path, A, c);  // needs the validated head dimension
  // llama.cpp runs phi3 files without their window (the converters' value is not the
  // model's); so does kivi.cpp, to give the same logits.
  if (arch != "phi3") read_sliding_window(f, path, A, c);  // needs the validated layer count
  read_long_rope(f, path, A, c);
  if (arch == "gemma2" || arch == "gemma3") read_gemma(f, path, A, c);
  if (arch == "gpt-oss") {
    // Windowed layers rotate as the global ones unless the file gives them a base.
    c.rope_freq_scale_swa = c.rope_freq_scale;
    if (const auto b = f.get_float_opt(A + "rope.freq_base_swa"))
      c.rope_theta_swa = static_cast<float>(*b);
    if (c.sliding_window == 0)
      fail("%s: architecture gpt-oss without %sattention.sliding_window", path.c_str(), A.c_str());
  }
  c.validate(path);

  const int64_t dim = c.dim, hid = c.hidden_dim, kv = c.kv_dim(), vocab = c.vocab_size,
                qd = c.q_dim();
  // The tensor `name` with GGUF dims `want` and data aligned for its type; its type.
  auto weight =
      [&](const std::string& name,
          const std::vector<int64_t>& want) -> std::pair<const io::GgufTensor*, quant::Type> {
    const io::GgufTensor* t = f.find_tensor(name);
    if (!t) fail("%s: missing tensor '%s'", path.c_str(), name.c_str());
    bool same = t->dims.size() == want.size();
    for (size_t i = 0; same && i < want.size(); ++i)
      same = t->dims[i] == static_cast<uint64_t>(want[i]);
    if (!same) {
      std::string got, exp;
      for (auto d : t->dims) got += (got.empty() ? "" : ", ") + std::to_string(d);
      for (auto d : want) exp += (exp.empty() ? "" : ", ") + std::to_string(d);
      fail("%s: tensor '%s' has shape [%s], expected [%s]", path.c_str(), name.c_str(), got.c_str(),
           exp.c_str());
    }
    const quant::TypeInfo* ti = weight_type(path, *t);
    const size_t align = ti->type == quant::Type::kF32 ? 4 : quant::is_float(ti->type) ? 2 : 1;
    if (reinterpret_cast<uintptr_t>(t->data) % align != 0) {
      fail("%s: tensor '%s' (%s) data is not %zu-byte aligned", path.c_str(), name.c_str(),
           ti->name, align);
    }
    return {t, ti->type};
  };
  // In place: a matrix views the mapped file.
  auto matrix = [&](const std::string& name, int64_t rows, int64_t cols) -> ops::Matrix {
    const auto [t, type] = weight(name, {cols, rows});
    return ops::Matrix{t->data, type, rows, cols};
  };
  // A 3-D tensor [n][rows][cols] (GGUF dims cols, rows, n) as n matrices viewing it.
  auto experts = [&](const std::string& name, int64_t rows, int64_t cols,
                     int64_t n) -> std::vector<ops::Matrix> {
    const auto [t, type] = weight(name, {cols, rows, n});
    std::vector<ops::Matrix> out(static_cast<size_t>(n));
    const size_t bytes = static_cast<size_t>(quant::row_bytes(type, cols)) * rows;
    for (int64_t e = 0; e < n; ++e)
      out[e] = ops::Matrix{static_cast<const uint8_t*>(t->data) + bytes * e, type, rows, cols};
    return out;
  };
  // Rows [r0, r0 + n) of a matrix, in place (a row is whole blocks of every type).
  auto rows_of = [](const ops::Matrix& m, int64_t r0, int64_t n) {
    ops::Matrix v = m;
    v.data = m.row(r0);
    v.rows = n;
    return v;
  };
  auto vec = [&](const std::string& name, int64_t n) -> std::vector<float> {
    const io::GgufTensor* t = f.find_tensor(name);
    if (!t)
      fail("%s: missing tensor '%s' (required by architecture %s)", path.c_str(), name.c_str(),
           arch.c_str());
    if (t->dims.size() != 1 || t->dims[0] != static_cast<uint64_t>(n)) {
      std::string got;
      for (auto d : t->dims) got += (got.empty() ? "" : ", ") + std::to_string(d);
      fail("%s: tensor '%s' has shape [%s], expected a vector of %lld elements", path.c_str(),
           name.c_str(), got.c_str(), static_cast<long long>(n));
    }
    std::vector<float> out(n);
    quant::dequantize_row(weight_type(path, *t)->type, t->data, out.data(), n);
    return out;
  };
  // A 2-D tensor [rows][cols] (GGUF dims cols, rows) as floats, row after row.
  auto mat_f32 = [&](const std::string& name, int64_t rows, int64_t cols) -> std::vector<float> {
    const auto [t, type] = weight(name, {cols, rows});
    std::vector<float> out(static_cast<size_t>(rows * cols));
    const size_t rb = static_cast<size_t>(quant::row_bytes(type, cols));
    for (int64_t r = 0; r < rows; ++r)
      quant::dequantize_row(type, static_cast<const uint8_t*>(t->data) + rb * r,
                            out.data() + r * cols, cols);
    return out;
  };
  Weights& w = m->w_;
  w.token_embd = matrix("token_embd.weight", vocab, dim);
  w.layers.resize(c.n_layers);
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    LayerWeights& L = w.layers[l];
    L.attn_norm = vec(p + "attn_norm.weight", dim);
    if (c.fused_projections && f.find_tensor(p + "attn_qkv.weight")) {
      // Q, K and V rows of one matrix: views, nothing copied.
      L.w_qkv = matrix(p + "attn_qkv.weight", qd + 2 * kv, dim);
      L.wq = rows_of(L.w_qkv, 0, qd);
      L.wk = rows_of(L.w_qkv, qd, kv);
      L.wv = rows_of(L.w_qkv, qd + kv, kv);
    } else {
      L.wq = matrix(p + "attn_q.weight", qd, dim);
      L.wk = matrix(p + "attn_k.weight", kv, dim);
      L.wv = matrix(p + "attn_v.weight", kv, dim);
    }
    if (c.attn_bias) {
      L.bq = vec(p + "attn_q.bias", qd);
      L.bk = vec(p + "attn_k.bias", kv);
      L.bv = vec(p + "attn_v.bias", kv);
    }
    if (c.qk_norm) {
      L.q_norm = vec(p + "attn_q_norm.weight", c.head_dim());
      L.k_norm = vec(p + "attn_k_norm.weight", c.head_dim());
    }
    L.wo = matrix(p + "attn_output.weight", dim, qd);
    if (c.out_bias) {
      L.bo = vec(p + "attn_output.bias", dim);
    } else if (f.find_tensor(p + "attn_output.bias")) {
      fail("%s: tensor '%sattn_output.bias': architecture %s has no output-projection bias",
           path.c_str(), p.c_str(), arch.c_str());
    }
    if (c.head_sinks) L.sinks = vec(p + "attn_sinks.weight", c.n_heads);
    if (c.post_norms) {
      L.attn_post_norm = vec(p + "post_attention_norm.weight", dim);
      L.ffn_post_norm = vec(p + "post_ffw_norm.weight", dim);
    }
    // gpt-oss names the FFN's norm post_attention_norm (it follows attention).
    L.ffn_norm =
        vec(p + (arch == "gpt-oss" ? "post_attention_norm.weight" : "ffn_norm.weight"), dim);
    if (c.n_experts > 0) {
      const int E = c.n_experts;
      L.router = matrix(p + "ffn_gate_inp.weight", E, dim);
      L.gate_exps = experts(p + "ffn_gate_exps.weight", hid, dim, E);
      L.up_exps = experts(p + "ffn_up_exps.weight", hid, dim, E);
      L.down_exps = experts(p + "ffn_down_exps.weight", dim, hid, E);
      if (c.expert_bias) {
        L.router_bias = vec(p + "ffn_gate_inp.bias", E);
        L.gate_exps_bias = mat_f32(p + "ffn_gate_exps.bias", E, hid);
        L.up_exps_bias = mat_f32(p + "ffn_up_exps.bias", E, hid);
        L.down_exps_bias = mat_f32(p + "ffn_down_exps.bias", E, dim);
      }
    } else if (c.fused_projections) {
      // ffn_up holds the gate's rows, then the up projection's (llama.cpp's swiglu split).
      L.w_gate_up = matrix(p + "ffn_up.weight", 2 * hid, dim);
      L.w_gate = rows_of(L.w_gate_up, 0, hid);
      L.w_up = rows_of(L.w_gate_up, hid, hid);
      L.w_down = matrix(p + "ffn_down.weight", dim, hid);
    } else {
      L.w_gate = matrix(p + "ffn_gate.weight", hid, dim);
      L.w_down = matrix(p + "ffn_down.weight", dim, hid);
      L.w_up = matrix(p + "ffn_up.weight", hid, dim);
    }
  }
  w.output_norm = vec("output_norm.weight", dim);
  w.output = c.shared_classifier ? w.token_embd : matrix("output.weight", vocab, dim);
  if (c.rope_style == attn::RopeStyle::kNeox && c.rope_dim() < c.head_dim())
    reorder_partial_rotary(*m);

  if (!tok_path.empty()) {
    m->tok_ =
        std::make_unique<tok::Tokenizer>(tok::Tokenizer::from_llama2c(tok_path, c.vocab_size));
  } else {
    m->tok_ = std::make_unique<tok::Tokenizer>(tok::Tokenizer::from_gguf(f, c.vocab_size));
  }
  return m;
}

}  // namespace kivi::model
