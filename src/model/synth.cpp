#include "model/synth.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "core/error.h"
#include "core/f16.h"
#include "core/normal_table.h"
#include "core/rng.h"
#include "core/sysinfo.h"
#include "core/threadpool.h"
#include "io/atomic_file.h"
#include "io/gguf_writer.h"
#include "model/convert.h"
#include "quant/mix.h"
#include "quant/quantize.h"

namespace kivi::model {

namespace {

// Elements per independently seeded block of random numbers (a multiple of 4, so that
// every block starts at a fresh 64-bit draw).
constexpr uint64_t kBlock = 4096;

uint64_t splitmix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

uint64_t block_seed(uint64_t seed, uint64_t tensor, uint64_t block) {
  return splitmix(splitmix(seed) ^ splitmix((tensor << 40) ^ block ^ 0x5EEDull));
}

// Fills dst with elements [first, first + count) of tensor `tensor` from `table`
// (65536 values of the element type T), block by block.
template <class T>
void fill_random(const T* table, uint64_t seed, uint64_t tensor, uint64_t first, uint64_t count,
                 T* dst) {
  T tmp[kBlock];
  uint64_t e = first;
  const uint64_t end = first + count;
  while (e < end) {
    const uint64_t b = e / kBlock, b0 = b * kBlock;
    const uint64_t lo = e - b0, hi = std::min(end - b0, kBlock);
    Rng rng(block_seed(seed, tensor, b));
    // Draw the whole prefix of the block up to hi so element values do not depend on
    // where a chunk starts.
    T* out = lo == 0 ? dst + (e - first) : tmp;
    for (uint64_t i = 0; i < hi; i += 4) {
      const uint64_t r = rng.next_u64();
      out[i] = table[r & 0xFFFF];
      if (i + 1 < hi) out[i + 1] = table[(r >> 16) & 0xFFFF];
      if (i + 2 < hi) out[i + 2] = table[(r >> 32) & 0xFFFF];
      if (i + 3 < hi) out[i + 3] = table[r >> 48];
    }
    if (lo != 0) std::memcpy(dst + (e - first), tmp + lo, (hi - lo) * sizeof(T));
    e = b0 + hi;
  }
}

const char* kAlphabet =
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789!\"#$%&'()*+,-./"
    ":;<=>?@[\\]^_`{|}~";

void range_check(const char* option, long long v, long long lo, long long hi) {
  if (v < lo || v > hi) fail("%s = %lld is out of range (valid: %lld to %lld)", option, v, lo, hi);
}

}  // namespace

void validate_synth_config(const ModelConfig& c) {
  range_check("--layers", c.n_layers, 1, 1024);
  range_check("--dim", c.dim, 2, 65536);
  range_check("--heads", c.n_heads, 1, 4096);
  range_check("--kv-heads", c.n_kv_heads, 1, c.n_heads);
  range_check("--ffn", c.hidden_dim, 1, 1 << 20);
  range_check("--vocab", c.vocab_size, kSynthMinVocab, 1 << 22);
  range_check("--ctx", c.ctx, 1, kMaxContext);
  if (c.key_length > 0) {
    range_check("--head-dim", c.key_length, 2, 1024);
  } else if (c.dim % c.n_heads != 0) {
    fail(
        "--heads %d does not divide --dim %d (the head dimension dim / heads must be a whole "
        "number)",
        c.n_heads, c.dim);
  }
  if (c.n_heads % c.n_kv_heads != 0) {
    fail(
        "--kv-heads %d does not divide --heads %d (each KV head serves a whole number of query "
        "heads)",
        c.n_kv_heads, c.n_heads);
  }
  if ((c.arch == "qwen3moe" || c.arch == "gpt-oss") && c.n_experts == 0)
    fail("--arch %s needs --experts E (and --experts-used K)", c.arch.c_str());
  if (c.n_experts > 0) {
    range_check("--experts", c.n_experts, 1, 4096);
    range_check("--experts-used", c.n_experts_used, 1, c.n_experts);
  } else if (c.n_experts_used != 0) {
    fail("--experts-used needs --experts");
  }
  const int hd = c.head_dim();
  if (hd % 2 != 0)
    fail("the head dimension (--head-dim, else --dim / --heads) = %d is odd; RoPE needs it even",
         hd);
  if (hd > 1024)
    fail(
        "the head dimension (--head-dim, else --dim / --heads) = %d is out of range (valid: 2 to "
        "1024)",
        hd);
  if (!is_supported_architecture(c.arch))
    fail("--arch '%s' is unknown (valid: %s)", c.arch.c_str(), supported_architectures());
  if (!(c.rope_theta > 0.0f) || c.rope_theta > 1e9f)
    fail("--rope-theta = %g is out of range (valid: above 0, at most 1e9)", c.rope_theta);
}

// The type of matrix `t` in a synthetic file of type `ft`.
static quant::Type matrix_type(const quant::FileType& ft, const TensorSpec& t,
                               const ModelConfig& c) {
  // The router stays F32, as llama.cpp's converter and quantizer keep it.
  if (t.role == TensorRole::kFfnGateInp) return quant::Type::kF32;
  return quant::tensor_type(ft, quant::TensorDesc{t.name, t.experts > 0 ? 3 : 2, t.cols},
                            c.n_layers, c.shared_classifier);
}

SynthNeeds synth_needs(const SynthSpec& s) {
  const ModelConfig& c = s.config;
  const quant::FileType& ft = quant::parse_file_type(s.outtype);
  SynthNeeds n;
  auto aligned = [](uint64_t b) {
    return (b + io::kGgufDefaultAlignment - 1) / io::kGgufDefaultAlignment *
           io::kGgufDefaultAlignment;
  };
  uint64_t tensor_table = 0;
  for (const auto& t : llama_tensor_specs(c)) {
    const uint64_t bytes =
        t.is_vector() ? t.rows * 4
        : t.f32       ? t.rows * t.cols * 4
                      : quant::row_bytes(matrix_type(ft, t, c), t.cols) * t.rows * t.matrices();
    n.weight_bytes += bytes;
    n.file_bytes += aligned(bytes);
    tensor_table += 8 + t.name.size() + 4 + 16 + 4 + 8;
  }
  // Metadata: the tokenizer dominates (a piece is at most 8 + 3 + 4 bytes of string at
  // the vocabulary sizes in use, plus a score and a type); 64 KiB covers the rest.
  const uint64_t max_piece = 8 + 16;
  n.file_bytes += tensor_table + static_cast<uint64_t>(c.vocab_size) * (max_piece + 4 + 4) +
                  (64u << 10) + s.tokenizer_bytes;
  n.kv_tokens = std::min(c.ctx, 4096);
  n.kv_bytes = 2ull * c.n_layers * c.kv_dim() * 4ull * n.kv_tokens;
  const uint64_t batch = 64;
  n.activation_bytes = batch * (6ull * c.dim + 2ull * c.kv_dim() + 2ull * c.hidden_dim) * 4 +
                       static_cast<uint64_t>(n.kv_tokens) * c.head_dim() * 4 +
                       static_cast<uint64_t>(c.vocab_size) * 4;
  return n;
}

void check_synth_fits(const SynthNeeds& n, uint64_t available_memory, uint64_t free_disk,
                      const std::string& out) {
  if (available_memory > 0 && n.memory_bytes() > available_memory) {
    fail(
        "the model needs %s of memory to run, only %s available (weights %s, f32 KV cache for %d "
        "tokens %s, "
        "activations %s); choose a smaller shape",
        sys::human_bytes(static_cast<double>(n.memory_bytes())).c_str(),
        sys::human_bytes(static_cast<double>(available_memory)).c_str(),
        sys::human_bytes(static_cast<double>(n.weight_bytes)).c_str(), n.kv_tokens,
        sys::human_bytes(static_cast<double>(n.kv_bytes)).c_str(),
        sys::human_bytes(static_cast<double>(n.activation_bytes)).c_str());
  }
  if (free_disk > 0 && n.file_bytes > free_disk) {
    fail("'%s' would take %s but only %s of disk space is free there", out.c_str(),
         sys::human_bytes(static_cast<double>(n.file_bytes)).c_str(),
         sys::human_bytes(static_cast<double>(free_disk)).c_str());
  }
}

tok::Tokenizer synthetic_tokenizer(int vocab_size, const std::vector<std::string>& controls) {
  const int least = kSynthMinVocab + static_cast<int>(controls.size());
  if (vocab_size < least) {
    fail("--vocab = %d is out of range (valid: %d to %d)", vocab_size, least, 1 << 22);
  }
  vocab_size -= static_cast<int>(controls.size());  // the controls come last
  std::vector<std::string> pieces;
  std::vector<float> scores;
  std::vector<tok::TokenType> types;
  pieces.reserve(vocab_size);
  auto add = [&](std::string p, float score, tok::TokenType t) {
    pieces.push_back(std::move(p));
    scores.push_back(score);
    types.push_back(t);
  };
  add("<unk>", 0.0f, tok::TokenType::kUnknown);
  add("<s>", 0.0f, tok::TokenType::kControl);
  add("</s>", 0.0f, tok::TokenType::kControl);
  for (int b = 0; b < 256; ++b) add(strfmt("<0x%02X>", b), 0.0f, tok::TokenType::kByte);
  const std::string alpha = kAlphabet;
  const int A = static_cast<int>(alpha.size());
  int rank = 0;
  auto add_normal = [&](std::string p) {
    if (static_cast<int>(pieces.size()) < vocab_size)
      add(std::move(p), -static_cast<float>(rank++), tok::TokenType::kNormal);
  };
  // Length n: "U+2581 + (n-1 characters)", then "n characters", each in alphabet order
  // (an odometer over the alphabet, most significant character first).
  for (int n = 1; static_cast<int>(pieces.size()) < vocab_size; ++n) {
    for (int with_space = 1; with_space >= 0 && static_cast<int>(pieces.size()) < vocab_size;
         --with_space) {
      const int chars = with_space ? n - 1 : n;
      std::vector<int> digit(chars, 0);
      for (;;) {
        std::string p = with_space ? std::string(tok::kSpaceMark) : std::string();
        for (int d : digit) p += alpha[d];
        add_normal(std::move(p));
        if (static_cast<int>(pieces.size()) >= vocab_size) break;
        int k = chars - 1;
        while (k >= 0 && ++digit[k] == A) digit[k--] = 0;
        if (k < 0) break;
      }
    }
  }
  for (const auto& c : controls) add(c, 0.0f, tok::TokenType::kControl);
  return tok::Tokenizer(std::move(pieces), std::move(scores), std::move(types), 1, 2, 0);
}

std::vector<std::string> synthetic_controls(const ModelConfig& c) {
  // Phi-3's: llama.cpp's reader of phi3 files looks for <|endoftext|>, and they make the
  // chat turns.
  if (c.arch == "phi3")
    return {"<|endoftext|>", "<|assistant|>", "<|end|>", "<|system|>", "<|user|>"};
  // gpt-oss's harmony markup (o200k_harmony's control tokens, as runtime/chat.h writes turns).
  if (c.arch == "gpt-oss") {
    return {"<|endoftext|>", "<|start|>",  "<|message|>",   "<|channel|>",
            "<|end|>",       "<|return|>", "<|constrain|>", "<|call|>"};
  }
  return {};
}

void synth_matrix_values(uint64_t seed, uint64_t tensor, uint64_t first, uint64_t count, bool f16,
                         void* dst) {
  // 65536 normal quantiles scaled to the weight deviation, in each storage type, so a
  // generated element is one lookup.
  struct Tables {
    std::vector<float> f32 = std::vector<float>(65536);
    std::vector<uint16_t> f16 = std::vector<uint16_t>(65536);
    Tables() {
      const NormalTable& nt = NormalTable::get();
      for (int i = 0; i < 65536; ++i) {
        f32[i] = kSynthWeightStd * nt.quantile(static_cast<uint16_t>(i));
        f16[i] = f32_to_f16(f32[i]);
      }
    }
  };
  static const Tables t;
  if (f16) {
    fill_random(t.f16.data(), seed, tensor, first, count, static_cast<uint16_t*>(dst));
  } else {
    fill_random(t.f32.data(), seed, tensor, first, count, static_cast<float*>(dst));
  }
}

std::string synthetic_name(const std::string& label) {
  return "synthetic " + label + ", random weights";
}

SynthResult write_synthetic_gguf(const SynthSpec& s, const std::string& out,
                                 const std::function<void(uint64_t, uint64_t)>& progress) {
  io::AtomicFile file(out);
  const SynthResult r = write_synthetic_gguf(s, file, progress);
  file.commit();
  return r;
}

SynthResult write_synthetic_gguf(const SynthSpec& s, io::AtomicFile& out,
                                 const std::function<void(uint64_t, uint64_t)>& progress) {
  const ModelConfig& c = s.config;
  validate_synth_config(c);
  const quant::FileType& ft = quant::parse_file_type(s.outtype);
  io::GgufWriter w;
  add_llama_metadata(w, c, synthetic_name(s.label), ft.llama_ftype);
  if (!quant::is_float(ft.base)) w.add_u32("general.quantization_version", 2);
  w.add_bool("kivi.synthetic", true);
  w.add_u64("kivi.synthetic.seed", s.seed);
  w.add_f32("kivi.synthetic.weight_std", kSynthWeightStd);
  if (s.write_tokenizer) {
    s.write_tokenizer(w);
  } else {
    add_tokenizer_metadata(w, synthetic_tokenizer(c.vocab_size, synthetic_controls(c)));
    if (c.arch == "phi3") {
      w.add_string("tokenizer.chat_template",
                   "{% for message in messages %}{{'<|' + message['role'] + '|>\n' + "
                   "message['content'] + '<|end|>\n'}}{% endfor %}{% if add_generation_prompt "
                   "%}{{ '<|assistant|>\n' }}{% endif %}");
    }
    if (c.arch == "gpt-oss") {  // the shape of gpt-oss's template, without its system preamble
      w.add_string("tokenizer.chat_template",
                   "{% for message in messages %}{% if message['role'] == 'assistant' %}"
                   "{{'<|start|>assistant<|channel|>final<|message|>' + message['content'] + "
                   "'<|end|>'}}{% else %}{{'<|start|>' + message['role'] + '<|message|>' + "
                   "message['content'] + '<|end|>'}}{% endif %}{% endfor %}{% if "
                   "add_generation_prompt %}{{ '<|start|>assistant' }}{% endif %}");
    }
  }

  static const float kOne = 1.0f;
  const auto specs = llama_tensor_specs(c);
  auto rope_freqs = std::make_shared<std::vector<float>>(c.rope_freq_factors);
  auto long_freqs = std::make_shared<std::vector<float>>(c.rope_factors_long);
  // Quantized types: the F32 values of each chunk, quantized on every core.
  std::unique_ptr<ThreadPool> pool;
  auto values = std::make_shared<std::vector<float>>();
  for (size_t ti = 0; ti < specs.size(); ++ti) {
    const auto& t = specs[ti];
    if (t.is_vector() || t.f32) {
      const bool bias = t.role == TensorRole::kAttnQBias || t.role == TensorRole::kAttnKBias ||
                        t.role == TensorRole::kAttnVBias || t.role == TensorRole::kAttnOutBias ||
                        t.role == TensorRole::kFfnGateInpBias || t.f32;
      const bool sinks = t.role == TensorRole::kAttnSinks;
      // Per-head and post norms vary around 1 so that a norm applied in the wrong place shows.
      const bool head_norm = t.role == TensorRole::kAttnQNorm || t.role == TensorRole::kAttnKNorm ||
                             t.role == TensorRole::kAttnPostNorm ||
                             t.role == TensorRole::kFfnPostNorm;
      io::GgufWriter::Generator gen;
      if (t.role == TensorRole::kRopeFreqs || t.role == TensorRole::kRopeShort) {
        gen = [rope_freqs](uint64_t first, uint64_t count, void* dst) {
          std::memcpy(dst, rope_freqs->data() + first, count * sizeof(float));
        };
      } else if (t.role == TensorRole::kRopeLong) {
        gen = [long_freqs](uint64_t first, uint64_t count, void* dst) {
          std::memcpy(dst, long_freqs->data() + first, count * sizeof(float));
        };
      } else if (bias || head_norm || sinks) {
        // Biases N(0, kSynthBiasStd^2); head norms 1 + N(0, kSynthHeadNormStd^2); sink
        // logits N(0, kSynthSinkStd^2).
        gen = [seed = s.seed, ti, bias, sinks](uint64_t first, uint64_t count, void* dst) {
          float* o = static_cast<float*>(dst);
          synth_matrix_values(seed, ti, first, count, false, o);
          const float scale = (sinks  ? kSynthSinkStd
                               : bias ? kSynthBiasStd
                                      : kSynthHeadNormStd) /
                              kSynthWeightStd;
          const float base = bias || sinks ? 0.0f : 1.0f;
          for (uint64_t i = 0; i < count; ++i) o[i] = base + scale * o[i];
        };
      } else {
        gen = [](uint64_t, uint64_t count, void* dst) {
          std::fill_n(static_cast<float*>(dst), count, kOne);
        };
      }
      const std::vector<uint64_t> dims =
          t.f32 ? std::vector<uint64_t>{t.cols, t.rows} : std::vector<uint64_t>{t.rows};
      w.add_tensor(t.name, dims, io::GgmlType::kF32, std::move(gen));
      continue;
    }
    const quant::Type type = matrix_type(ft, t, c);
    const std::vector<uint64_t> dims = t.experts > 0
                                           ? std::vector<uint64_t>{t.cols, t.rows, t.experts}
                                           : std::vector<uint64_t>{t.cols, t.rows};
    if (type == quant::Type::kF16 || type == quant::Type::kF32) {
      w.add_tensor(t.name, dims, type,
                   io::GgufWriter::Generator([f16 = type == quant::Type::kF16, seed = s.seed, ti](
                                                 uint64_t first, uint64_t count, void* dst) {
                     synth_matrix_values(seed, ti, first, count, f16, dst);
                   }));
      continue;
    }
    if (!pool) pool = std::make_unique<ThreadPool>(hardware_threads());
    w.add_tensor(t.name, dims, type,
                 io::GgufWriter::Generator([type, seed = s.seed, ti, values, p = pool.get()](
                                               uint64_t first, uint64_t count, void* dst) {
                   values->resize(static_cast<size_t>(count));
                   synth_matrix_values(seed, ti, first, count, false, values->data());
                   quant::quantize_parallel(type, values->data(), dst, static_cast<int64_t>(count),
                                            p);
                 }));
  }
  w.write(out, progress);
  SynthResult r;
  r.bytes = w.file_size();
  r.n_tensors = static_cast<int>(specs.size());
  return r;
}

}  // namespace kivi::model
