#include "model/convert.h"

#include "model/model.h"

#include <vector>

#include "core/error.h"
#include "core/f16.h"
#include "io/atomic_file.h"
#include "io/gguf_writer.h"
#include "io/llama2c.h"
#include "tokenizer/tokenizer.h"

namespace kivi::model {

void add_llama_metadata(io::GgufWriter& w, const ModelConfig& c, const std::string& name,
                        bool f16) {
  add_llama_metadata(w, c, name, f16 ? 1 : 0);
}

void add_llama_metadata(io::GgufWriter& w, const ModelConfig& c, const std::string& name,
                        int file_type) {
  // llama.cpp's key names (llama-arch.cpp LLM_KV_*), under the architecture's prefix.
  const std::string A = c.arch + ".";
  w.add_string("general.architecture", c.arch);
  w.add_string("general.name", name);
  w.add_u32("general.file_type", static_cast<uint32_t>(file_type));
  w.add_u32("general.alignment", io::kGgufDefaultAlignment);
  w.add_u32(A + "context_length", c.ctx);
  w.add_u32(A + "embedding_length", c.dim);
  w.add_u32(A + "block_count", c.n_layers);
  w.add_u32(A + "feed_forward_length", c.hidden_dim);
  if (c.n_experts > 0) {
    w.add_u32(A + "expert_count", c.n_experts);
    w.add_u32(A + "expert_used_count", c.n_experts_used);
    w.add_u32(A + "expert_feed_forward_length", c.hidden_dim);
  }
  w.add_u32(A + "rope.dimension_count", c.rope_dim());
  w.add_u32(A + "attention.head_count", c.n_heads);
  w.add_u32(A + "attention.head_count_kv", c.n_kv_heads);
  if (c.key_length > 0) {
    w.add_u32(A + "attention.key_length", c.key_length);
    w.add_u32(A + "attention.value_length", c.key_length);
  }
  w.add_f32(A + "attention.layer_norm_rms_epsilon", c.norm_eps);
  if (c.sliding_window > 0) {
    // The window, and which layers have it: every layer (no pattern), a period N
    // (llama.cpp's u32 pattern) when one reproduces the layers, else one i32 per layer.
    w.add_u32(A + "attention.sliding_window", c.sliding_window);
    bool all = true;
    for (int l = 0; l < c.n_layers; ++l) all = all && c.layer_window(l) > 0;
    // Gemma files always say which layers have it (their readers default to a pattern).
    const bool gemma = c.arch == "gemma2" || c.arch == "gemma3";
    if (!all || gemma) {
      int period = 0;
      for (int n = 1; n <= c.n_layers && period == 0; ++n) {
        ModelConfig t = c;
        t.set_swa_pattern(n);
        if (t.swa_layers == c.swa_layers) period = n;
      }
      if (period > 0) {
        w.add_u32(A + "attention.sliding_window_pattern", period);
      } else {
        w.add_i32_array(A + "attention.sliding_window_pattern",
                        std::vector<int32_t>(c.swa_layers.begin(), c.swa_layers.end()));
      }
    }
  }
  w.add_f32(A + "rope.freq_base", c.rope_theta);
  if (c.yarn_orig_ctx > 0) {
    w.add_string(A + "rope.scaling.type", "yarn");
    w.add_f32(A + "rope.scaling.factor", 1.0f / c.rope_freq_scale);
    w.add_u32(A + "rope.scaling.original_context_length", c.yarn_orig_ctx);
  } else if (c.rope_freq_scale != 1.0f) {
    w.add_string(A + "rope.scaling.type", "linear");
    w.add_f32(A + "rope.scaling.factor", 1.0f / c.rope_freq_scale);
  }
  if (!c.rope_factors_long.empty()) {
    w.add_string(A + "rope.scaling.type", "longrope");
    w.add_u32(A + "rope.scaling.original_context_length", c.rope_orig_ctx);
    w.add_f32(A + "rope.scaling.attn_factor", c.rope_attn_factor);
  }
  if (c.rope_theta_swa > 0.0f) w.add_f32(A + "rope.freq_base_swa", c.rope_theta_swa);
  // Gemma readers default to caps of their own: the file states them (0: none).
  if (c.arch == "gemma2") w.add_f32(A + "attn_logit_softcapping", c.attn_softcap);
  if (c.arch == "gemma2" || c.arch == "gemma3")
    w.add_f32(A + "final_logit_softcapping", c.final_softcap);
  w.add_u32(A + "vocab_size", c.vocab_size);
}

void add_tokenizer_metadata(io::GgufWriter& w, const tok::Tokenizer& tk) {
  w.add_string("tokenizer.ggml.model", "llama");
  w.add_string_array("tokenizer.ggml.tokens", tk.pieces());
  w.add_f32_array("tokenizer.ggml.scores", tk.scores());
  std::vector<int32_t> types;
  types.reserve(tk.vocab_size());
  for (int i = 0; i < tk.vocab_size(); ++i) types.push_back(static_cast<int32_t>(tk.type(i)));
  w.add_i32_array("tokenizer.ggml.token_type", types);
  w.add_u32("tokenizer.ggml.bos_token_id", tk.bos_id());
  w.add_u32("tokenizer.ggml.eos_token_id", tk.eos_id());
  w.add_u32("tokenizer.ggml.unknown_token_id", tk.unk_id());
  w.add_bool("tokenizer.ggml.add_bos_token", true);
  w.add_bool("tokenizer.ggml.add_eos_token", false);
  w.add_bool("tokenizer.ggml.add_space_prefix", tk.add_dummy_prefix());
}

std::vector<TensorSpec> llama_tensor_specs(const ModelConfig& c) {
  const uint64_t dim = c.dim, hid = c.hidden_dim, kv = c.kv_dim(), vocab = c.vocab_size,
                 qd = c.q_dim();
  std::vector<TensorSpec> t;
  t.reserve(14 * c.n_layers + 4);
  t.push_back({"token_embd.weight", TensorRole::kTokenEmbd, -1, vocab, dim});
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    t.push_back({p + "attn_norm.weight", TensorRole::kAttnNorm, l, dim, 0});
    if (c.fused_projections) {
      t.push_back({p + "attn_qkv.weight", TensorRole::kAttnQkv, l, qd + 2 * kv, dim});
    } else {
      t.push_back({p + "attn_q.weight", TensorRole::kAttnQ, l, qd, dim});
    }
    if (c.attn_bias) t.push_back({p + "attn_q.bias", TensorRole::kAttnQBias, l, qd, 0});
    if (!c.fused_projections) t.push_back({p + "attn_k.weight", TensorRole::kAttnK, l, kv, dim});
    if (c.attn_bias) t.push_back({p + "attn_k.bias", TensorRole::kAttnKBias, l, kv, 0});
    if (!c.fused_projections) t.push_back({p + "attn_v.weight", TensorRole::kAttnV, l, kv, dim});
    if (c.attn_bias) t.push_back({p + "attn_v.bias", TensorRole::kAttnVBias, l, kv, 0});
    if (c.qk_norm) {
      t.push_back({p + "attn_q_norm.weight", TensorRole::kAttnQNorm, l,
                   static_cast<uint64_t>(c.head_dim()), 0});
      t.push_back({p + "attn_k_norm.weight", TensorRole::kAttnKNorm, l,
                   static_cast<uint64_t>(c.head_dim()), 0});
    }
    t.push_back({p + "attn_output.weight", TensorRole::kAttnOutput, l, dim, qd});
    if (c.out_bias) t.push_back({p + "attn_output.bias", TensorRole::kAttnOutBias, l, dim, 0});
    if (c.head_sinks) {
      t.push_back({p + "attn_sinks.weight", TensorRole::kAttnSinks, l,
                   static_cast<uint64_t>(c.n_heads), 0});
    }
    if (c.post_norms)
      t.push_back({p + "post_attention_norm.weight", TensorRole::kAttnPostNorm, l, dim, 0});
    // gpt-oss calls the FFN's norm post_attention_norm.
    t.push_back({p + (c.arch == "gpt-oss" ? "post_attention_norm.weight" : "ffn_norm.weight"),
                 TensorRole::kFfnNorm, l, dim, 0});
    if (c.n_experts > 0) {
      const uint64_t E = c.n_experts;
      t.push_back({p + "ffn_gate_inp.weight", TensorRole::kFfnGateInp, l, E, dim});
      t.push_back({p + "ffn_gate_exps.weight", TensorRole::kFfnGateExps, l, hid, dim, E});
      t.push_back({p + "ffn_down_exps.weight", TensorRole::kFfnDownExps, l, dim, hid, E});
      t.push_back({p + "ffn_up_exps.weight", TensorRole::kFfnUpExps, l, hid, dim, E});
      if (c.expert_bias) {
        t.push_back({p + "ffn_gate_inp.bias", TensorRole::kFfnGateInpBias, l, E, 0});
        t.push_back({p + "ffn_gate_exps.bias", TensorRole::kFfnGateExpsBias, l, E, hid, 0, true});
        t.push_back({p + "ffn_down_exps.bias", TensorRole::kFfnDownExpsBias, l, E, dim, 0, true});
        t.push_back({p + "ffn_up_exps.bias", TensorRole::kFfnUpExpsBias, l, E, hid, 0, true});
      }
    } else if (c.fused_projections) {
      t.push_back({p + "ffn_down.weight", TensorRole::kFfnDown, l, dim, hid});
      t.push_back({p + "ffn_up.weight", TensorRole::kFfnUp, l, 2 * hid, dim});
    } else {
      t.push_back({p + "ffn_gate.weight", TensorRole::kFfnGate, l, hid, dim});
      t.push_back({p + "ffn_down.weight", TensorRole::kFfnDown, l, dim, hid});
      t.push_back({p + "ffn_up.weight", TensorRole::kFfnUp, l, hid, dim});
    }
    if (c.post_norms)
      t.push_back({p + "post_ffw_norm.weight", TensorRole::kFfnPostNorm, l, dim, 0});
  }
  t.push_back({"output_norm.weight", TensorRole::kOutputNorm, -1, dim, 0});
  if (!c.shared_classifier) t.push_back({"output.weight", TensorRole::kOutput, -1, vocab, dim});
  // Last, so that the other tensors keep their index (and synthetic values) with or without it.
  if (!c.rope_factors_long.empty()) {
    t.push_back(
        {"rope_factors_long.weight", TensorRole::kRopeLong, -1, c.rope_factors_long.size(), 0});
    t.push_back(
        {"rope_factors_short.weight", TensorRole::kRopeShort, -1, c.rope_freq_factors.size(), 0});
  } else if (!c.rope_freq_factors.empty()) {
    t.push_back({"rope_freqs.weight", TensorRole::kRopeFreqs, -1, c.rope_freq_factors.size(), 0});
  }
  return t;
}

ConvertResult convert_llama2c_to_gguf(const std::string& in, const std::string& tok_path,
                                      const std::string& out, bool f16, const std::string& name,
                                      const std::function<void(uint64_t, uint64_t)>& progress) {
  io::check_output_is_not_input(out, {in, tok_path}, "-o");
  auto ck = io::read_llama2c(in);
  const auto& h = ck->header;
  const auto tk = tok::Tokenizer::from_llama2c(tok_path, h.vocab_size);
  const ModelConfig c = llama2c_config(*ck);

  io::GgufWriter w;
  add_llama_metadata(w, c, !name.empty() ? name : in.substr(in.find_last_of('/') + 1), f16);
  add_tokenizer_metadata(w, tk);

  const uint64_t dim = c.dim, hid = c.hidden_dim, kv = c.kv_dim();
  // Where each tensor starts in the checkpoint (llama2.c stores every layer's tensor of
  // one kind together).
  auto source = [&](const TensorSpec& s) -> const float* {
    const uint64_t l = s.layer < 0 ? 0 : static_cast<uint64_t>(s.layer);
    switch (s.role) {
      case TensorRole::kTokenEmbd:
        return ck->token_embd;
      case TensorRole::kAttnNorm:
        return ck->rms_att + l * dim;
      case TensorRole::kAttnQ:
        return ck->wq + l * dim * dim;
      case TensorRole::kAttnK:
        return ck->wk + l * kv * dim;
      case TensorRole::kAttnV:
        return ck->wv + l * kv * dim;
      case TensorRole::kAttnOutput:
        return ck->wo + l * dim * dim;
      case TensorRole::kFfnNorm:
        return ck->rms_ffn + l * dim;
      case TensorRole::kFfnGate:
        return ck->w1 + l * hid * dim;
      case TensorRole::kFfnDown:
        return ck->w2 + l * dim * hid;
      case TensorRole::kFfnUp:
        return ck->w3 + l * hid * dim;
      case TensorRole::kOutputNorm:
        return ck->rms_final;
      case TensorRole::kOutput:
        return ck->wcls;
      case TensorRole::kAttnQBias:
      case TensorRole::kAttnKBias:
      case TensorRole::kAttnVBias:
      case TensorRole::kAttnQNorm:
      case TensorRole::kAttnKNorm:
      case TensorRole::kRopeFreqs:
      case TensorRole::kFfnGateInp:
      case TensorRole::kFfnGateExps:
      case TensorRole::kFfnDownExps:
      case TensorRole::kFfnUpExps:
      case TensorRole::kAttnPostNorm:
      case TensorRole::kFfnPostNorm:
      case TensorRole::kAttnQkv:
      case TensorRole::kRopeLong:
      case TensorRole::kRopeShort:
      case TensorRole::kAttnOutBias:
      case TensorRole::kAttnSinks:
      case TensorRole::kFfnGateInpBias:
      case TensorRole::kFfnGateExpsBias:
      case TensorRole::kFfnDownExpsBias:
      case TensorRole::kFfnUpExpsBias:
        break;  // not in llama2.c checkpoints
    }
    return nullptr;
  };
  const auto specs = llama_tensor_specs(c);
  for (const auto& s : specs) {
    const float* p = source(s);
    if (s.is_vector() || !f16) {
      const std::vector<uint64_t> dims =
          s.is_vector() ? std::vector<uint64_t>{s.rows} : std::vector<uint64_t>{s.cols, s.rows};
      w.add_tensor(s.name, dims, io::GgmlType::kF32, static_cast<const void*>(p));
    } else {
      w.add_tensor(s.name, {s.cols, s.rows}, io::GgmlType::kF16,
                   io::GgufWriter::Generator([p](uint64_t first, uint64_t count, void* dst) {
                     auto* o = static_cast<uint16_t*>(dst);
                     for (uint64_t i = 0; i < count; ++i) o[i] = f32_to_f16(p[first + i]);
                   }));
    }
  }
  w.write(out, progress);
  ConvertResult r;
  r.bytes = w.file_size();
  r.n_tensors = static_cast<int>(specs.size());
  return r;
}

}  // namespace kivi::model
