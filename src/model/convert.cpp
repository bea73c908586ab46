#include "model/convert.h"

#include <vector>

#include "core/error.h"
#include "core/f16.h"
#include "io/gguf_writer.h"
#include "io/llama2c.h"
#include "tokenizer/tokenizer.h"

namespace kivi::model {

ConvertResult convert_llama2c_to_gguf(const std::string& in, const std::string& tok_path,
                                      const std::string& out, bool f16, const std::string& name,
                                      const std::function<void(uint64_t, uint64_t)>& progress) {
  auto ck = io::read_llama2c(in);
  const auto& h = ck->header;
  const auto tk = tok::Tokenizer::from_llama2c(tok_path, h.vocab_size);
  const uint64_t dim = h.dim, hid = h.hidden_dim, kv = static_cast<uint64_t>(h.n_kv_heads) * (h.dim / h.n_heads);
  const int hd = h.dim / h.n_heads;

  io::GgufWriter w;
  w.add_string("general.architecture", "llama");
  w.add_string("general.name", !name.empty() ? name : in.substr(in.find_last_of('/') + 1));
  w.add_u32("general.file_type", f16 ? 1 : 0);
  w.add_u32("general.alignment", io::kGgufDefaultAlignment);
  w.add_u32("llama.context_length", h.seq_len);
  w.add_u32("llama.embedding_length", h.dim);
  w.add_u32("llama.block_count", h.n_layers);
  w.add_u32("llama.feed_forward_length", h.hidden_dim);
  w.add_u32("llama.rope.dimension_count", hd);
  w.add_u32("llama.attention.head_count", h.n_heads);
  w.add_u32("llama.attention.head_count_kv", h.n_kv_heads);
  w.add_f32("llama.attention.layer_norm_rms_epsilon", 1e-5f);
  w.add_f32("llama.rope.freq_base", 10000.0f);
  w.add_u32("llama.vocab_size", h.vocab_size);
  w.add_string("tokenizer.ggml.model", "llama");
  w.add_string_array("tokenizer.ggml.tokens", tk.pieces());
  w.add_f32_array("tokenizer.ggml.scores", tk.scores());
  std::vector<int32_t> types;
  for (int i = 0; i < tk.vocab_size(); ++i) types.push_back(static_cast<int32_t>(tk.type(i)));
  w.add_i32_array("tokenizer.ggml.token_type", types);
  w.add_u32("tokenizer.ggml.bos_token_id", tk.bos_id());
  w.add_u32("tokenizer.ggml.eos_token_id", tk.eos_id());
  w.add_u32("tokenizer.ggml.unknown_token_id", tk.unk_id());
  w.add_bool("tokenizer.ggml.add_bos_token", true);
  w.add_bool("tokenizer.ggml.add_eos_token", false);
  w.add_bool("tokenizer.ggml.add_space_prefix", true);

  const io::GgmlType mt = f16 ? io::GgmlType::kF16 : io::GgmlType::kF32;
  auto mat = [&](const std::string& name, const float* p, uint64_t rows, uint64_t cols) {
    if (!f16) {
      w.add_tensor(name, {cols, rows}, mt, static_cast<const void*>(p));
    } else {
      w.add_tensor(name, {cols, rows}, mt, io::GgufWriter::Generator([p](uint64_t first, uint64_t count, void* dst) {
                     auto* o = static_cast<uint16_t*>(dst);
                     for (uint64_t i = 0; i < count; ++i) o[i] = f32_to_f16(p[first + i]);
                   }));
    }
  };
  auto vec = [&](const std::string& name, const float* p) {
    w.add_tensor(name, {dim}, io::GgmlType::kF32, static_cast<const void*>(p));
  };
  mat("token_embd.weight", ck->token_embd, h.vocab_size, dim);
  for (int l = 0; l < h.n_layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    vec(p + "attn_norm.weight", ck->rms_att + l * dim);
    mat(p + "attn_q.weight", ck->wq + l * dim * dim, dim, dim);
    mat(p + "attn_k.weight", ck->wk + l * kv * dim, kv, dim);
    mat(p + "attn_v.weight", ck->wv + l * kv * dim, kv, dim);
    mat(p + "attn_output.weight", ck->wo + l * dim * dim, dim, dim);
    vec(p + "ffn_norm.weight", ck->rms_ffn + l * dim);
    mat(p + "ffn_gate.weight", ck->w1 + l * hid * dim, hid, dim);
    mat(p + "ffn_down.weight", ck->w2 + l * dim * hid, dim, hid);
    mat(p + "ffn_up.weight", ck->w3 + l * hid * dim, hid, dim);
  }
  vec("output_norm.weight", ck->rms_final);
  if (!ck->shared_classifier) mat("output.weight", ck->wcls, h.vocab_size, dim);
  w.write(out, progress);
  ConvertResult r;
  r.bytes = w.file_size();
  r.n_tensors = 9 * h.n_layers + 2 + (ck->shared_classifier ? 0 : 1);
  return r;
}

}  // namespace kivi::model
