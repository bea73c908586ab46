#include <cstdio>
#include <string>
#include <vector>

#include "common.h"
#include "core/error.h"
#include "core/progress.h"
#include "io/gguf_writer.h"
#include "io/llama2c.h"
#include "tokenizer/tokenizer.h"

namespace kivi::tools {

int cmd_convert(int argc, char** argv) {
  Args a("convert", "IN.bin -t TOKENIZER.bin -o OUT.gguf [--outtype f32|f16]",
         "Converts a llama2.c checkpoint and its tokenizer to GGUF v3 with the key and tensor names\n"
         "of the GGUF spec and llama.cpp (llama architecture, 'llama' SentencePiece tokenizer), so\n"
         "other GGUF tools accept the file. Weights keep their layout: llama2.c's rotary pairs are\n"
         "already the interleaved pairs GGUF's llama layout expects.");
  a.add("tokenizer", 't', "FILE", "llama2.c tokenizer file (required).");
  a.add("output", 'o', "FILE", "Output GGUF path (required).");
  a.add("outtype", 0, "TYPE", "Matrix storage: f32 (bit-exact) or f16. Norms stay f32.", "f32");
  a.add("name", 0, "NAME", "general.name (default: the input file name).");
  a.positionals("IN.bin", 1, 1);
  if (!a.parse(argc, argv)) {
    std::fputs(a.help().c_str(), stdout);
    return 0;
  }
  const std::string in = a.positional()[0];
  if (!a.given("tokenizer")) fail("convert: give the tokenizer with -t TOKENIZER.bin");
  if (!a.given("output")) fail("convert: give the output path with -o OUT.gguf");
  const std::string out = a.str("output"), outtype = a.str("outtype");
  if (outtype != "f32" && outtype != "f16") fail("--outtype: unknown value '%s' (valid: f32, f16)", outtype.c_str());
  const bool f16 = outtype == "f16";

  auto ck = io::read_llama2c(in);
  const auto& h = ck->header;
  const auto tk = tok::Tokenizer::from_llama2c(a.str("tokenizer"), h.vocab_size);
  const uint64_t dim = h.dim, hid = h.hidden_dim, kv = static_cast<uint64_t>(h.n_kv_heads) * (h.dim / h.n_heads);
  const int hd = h.dim / h.n_heads;

  io::GgufWriter w;
  w.add_string("general.architecture", "llama");
  w.add_string("general.name", a.given("name") ? a.str("name") : in.substr(in.find_last_of('/') + 1));
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
  Progress bar("convert", static_cast<int64_t>(w.file_size()), "B", Progress::stderr_is_terminal());
  w.write(out, [&](uint64_t done, uint64_t) { bar.update(static_cast<int64_t>(done)); });
  bar.finish();
  std::fprintf(stderr, "wrote %s (%llu bytes, %d tensors, %s)\n", out.c_str(),
               static_cast<unsigned long long>(w.file_size()), 9 * h.n_layers + 2 + (ck->shared_classifier ? 0 : 1),
               outtype.c_str());
  return 0;
}

}  // namespace kivi::tools
