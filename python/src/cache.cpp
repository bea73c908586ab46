// kivi.Cache: the streaming KIVI cache of kv/kv_cache.h, used like a KIVI KiviManager
// (add_tokens, get_full_cache). A batch of B sequences of H heads is one kv::KvCache of B*H KV
// heads (heads are independent in the cache), so every byte it holds is the engine's.
//   add_tokens(k, v)   k, v [B, H, T, D]: appends T tokens in order; each append applies
//                      the residual window R and the flush rules exactly as decoding does
//   get_full_cache()   the dequantized history plus the full-precision residual, f32
//   stored()           the stored codes and parameters, byte for byte
//   memory_stats()     bytes used and reserved, against an f32 cache
#include <algorithm>
#include <cstring>
#include <memory>
#include <optional>

#include "bindings.h"
#include "runtime/engine_options.h"
#include "core/error.h"
#include "kv/codec.h"
#include "kv/kv_cache.h"

namespace kivi::py {

namespace {

class Cache {
 public:
  Cache(int n_heads, int head_dim, int max_tokens, const std::string& kv_cache,
        const std::optional<std::string>& kv_cache_k, const std::optional<std::string>& kv_cache_v,
        int group_size, int residual, const std::string& key_flush, const std::string& scale_dtype,
        int batch, int n_layers)
      : batch_(batch), n_heads_(n_heads) {
    if (batch < 1) fail("Cache: batch = %d, expected >= 1", batch);
    if (n_heads < 1) fail("Cache: n_heads = %d, expected >= 1", n_heads);
    if (static_cast<int64_t>(batch) * n_heads > (1 << 20))
      fail("Cache: batch * n_heads = %lld is too large", static_cast<long long>(batch) * n_heads);
    // The same parser as sessions and the CLI (runtime/engine_options.h).
    runtime::OptionValues v{{"kv-cache", kv_cache},
                            {"group-size", std::to_string(group_size)},
                            {"residual", std::to_string(residual)},
                            {"key-flush", key_flush},
                            {"scale-dtype", scale_dtype}};
    if (kv_cache_k) v["kv-cache-k"] = *kv_cache_k;
    if (kv_cache_v) v["kv-cache-v"] = *kv_cache_v;
    kv::CacheConfig c = runtime::parse_session_options(v, runtime::OptionSpelling::kKeyword).cache;
    c.n_layers = n_layers;
    c.n_kv_heads = batch * n_heads;
    c.head_dim = head_dim;
    c.ctx = max_tokens;
    for (const auto* f : {&c.k, &c.v}) {
      if (!kv::is_kivi(f->format)) {
        fail("Cache holds KIVI formats (kivi2, kivi4, kivi8); got %s (sessions take every format)",
             kv::format_name(f->format));
      }
    }
    cache_ = std::make_unique<kv::KvCache>(c);  // validates
  }

  const kv::CacheConfig& config() const { return cache_->config(); }
  int n_tokens(int layer) const { return cache_->n_tokens(check_layer(layer)); }

  void add_tokens(const F32Array& k, const F32Array& v, int layer) {
    check_layer(layer);
    const auto& c = config();
    const auto ks = shape_of(k, 4, "add_tokens: k"), vs = shape_of(v, 4, "add_tokens: v");
    if (ks != vs) fail("add_tokens: k and v have different shapes");
    if (ks[0] != batch_ || ks[1] != n_heads_ || ks[3] != c.head_dim) {
      fail(
          "add_tokens: k has shape [%lld, %lld, %lld, %lld]; this cache takes [%d, %d, T, %d] ([B, "
          "H, T, D])",
          static_cast<long long>(ks[0]), static_cast<long long>(ks[1]),
          static_cast<long long>(ks[2]), static_cast<long long>(ks[3]), batch_, n_heads_,
          c.head_dim);
    }
    const int64_t T = ks[2];
    const int n = cache_->n_tokens(layer);
    if (n + T > c.ctx) {
      fail("add_tokens: %lld tokens do not fit: layer %d holds %d of max_tokens = %d",
           static_cast<long long>(T), layer, n, c.ctx);
    }
    const size_t S = static_cast<size_t>(batch_) * n_heads_, D = c.head_dim;
    std::vector<float> kt(S * D), vt(S * D);  // one token of every (batch, head): [B*H, D]
    const float* kp = k.data();
    const float* vp = v.data();
    pb::gil_scoped_release nogil;
    for (int64_t t = 0; t < T; ++t) {
      for (size_t s = 0; s < S; ++s) {
        std::memcpy(&kt[s * D], kp + (s * T + t) * D, D * sizeof(float));
        std::memcpy(&vt[s * D], vp + (s * T + t) * D, D * sizeof(float));
      }
      cache_->append(layer, kt.data(), vt.data());
    }
  }

  // Dequantized keys and values [B, H, n, D] of one layer.
  pb::tuple full_layer(int layer) const {
    check_layer(layer);
    const auto& c = config();
    const int n = cache_->n_tokens(layer), D = c.head_dim;
    F32Array k(std::vector<int64_t>{batch_, n_heads_, n, D});
    F32Array v(std::vector<int64_t>{batch_, n_heads_, n, D});
    float* kp = k.mutable_data();
    float* vp = v.mutable_data();
    {
      pb::gil_scoped_release nogil;
      const kv::LayerView view = cache_->view(layer);
      const size_t ps = kv::param_size(c.param_type);
      const int G = c.group_size, kbits = kv::format_bits(view.k.fmt.format),
                vbits = kv::format_bits(view.v.fmt.format);
      const int gc = view.v.group;
      std::vector<uint8_t> row(view.v.code_row_bytes);
      for (int s = 0; s < view.k.n_heads; ++s) {
        float* ko = kp + static_cast<size_t>(s) * n * D;
        float* vo = vp + static_cast<size_t>(s) * n * D;
        const kv::StreamView& K = view.k;
        for (int t = 0; t < K.n_stored; t += G) {
          const size_t pi = K.group_params(t, s) * ps;
          kv::dequantize_keys(K.group_codes(t, s), K.scales + pi, K.zeros + pi, 1, G, D, G, kbits,
                              c.param_type, ko + static_cast<size_t>(t) * D);
        }
        for (int t = K.n_stored; t < n; ++t)
          std::memcpy(ko + static_cast<size_t>(t) * D, K.residual_row(t, s), D * 4);
        const kv::StreamView& V = view.v;
        for (int t = 0; t < V.n_stored; ++t) {
          const uint8_t* quad = V.quad_row(t, s);
          for (size_t j = 0; j < row.size(); ++j) row[j] = quad[4 * j + t % 4];
          const size_t pi = (V.param_base(t, s) + static_cast<size_t>(t % V.block) * (D / gc)) * ps;
          kv::dequantize_values(row.data(), V.scales + pi, V.zeros + pi, 1, 1, D, gc, vbits,
                                c.param_type, vo + static_cast<size_t>(t) * D);
        }
        for (int t = V.n_stored; t < n; ++t)
          std::memcpy(vo + static_cast<size_t>(t) * D, V.residual_row(t, s), D * 4);
      }
    }
    return pb::make_tuple(k, v);
  }

  pb::object get_full_cache(std::optional<int> layer) const {
    if (layer) return full_layer(*layer);
    pb::list out;
    for (int l = 0; l < config().n_layers; ++l) out.append(full_layer(l));
    return out;
  }

  // The stored state of one layer, as the cache holds it.
  pb::dict stored(int layer) const {
    check_layer(layer);
    const auto& c = config();
    const kv::LayerView view = cache_->view(layer);
    const kv::StreamView& K = view.k;
    const kv::StreamView& V = view.v;
    const int n = view.n_tokens, D = c.head_dim, G = c.group_size, S = K.n_heads;
    const size_t ps = kv::param_size(c.param_type);
    const int nk = K.n_stored, nv = V.n_stored, gc = V.group;
    const int64_t wk = static_cast<int64_t>(K.code_row_bytes),
                  wv = static_cast<int64_t>(V.code_row_bytes);
    const int64_t nq = (nv + 3) / 4;
    const pb::dtype pd = param_dtype(c.param_type);
    pb::array kc = new_array(pb::dtype::of<uint8_t>(), {batch_, n_heads_, nk / G, G * wk});
    pb::array ksc = new_array(pd, {batch_, n_heads_, nk / G, D});
    pb::array kz = new_array(pd, {batch_, n_heads_, nk / G, D});
    pb::array vq = new_array(pb::dtype::of<uint8_t>(), {batch_, n_heads_, nq, wv, 4});
    pb::array vsc = new_array(pd, {batch_, n_heads_, nv, D / gc});
    pb::array vz = new_array(pd, {batch_, n_heads_, nv, D / gc});
    F32Array kr(std::vector<int64_t>{batch_, n_heads_, n - nk, D});
    F32Array vr(std::vector<int64_t>{batch_, n_heads_, n - nv, D});
    {
      auto* kcp = static_cast<uint8_t*>(kc.mutable_data());
      auto* kscp = static_cast<uint8_t*>(ksc.mutable_data());
      auto* kzp = static_cast<uint8_t*>(kz.mutable_data());
      auto* vqp = static_cast<uint8_t*>(vq.mutable_data());
      auto* vscp = static_cast<uint8_t*>(vsc.mutable_data());
      auto* vzp = static_cast<uint8_t*>(vz.mutable_data());
      float* krp = kr.mutable_data();
      float* vrp = vr.mutable_data();
      pb::gil_scoped_release nogil;
      const size_t gbytes = static_cast<size_t>(G) * wk, kparams = static_cast<size_t>(D) * ps;
      const size_t vparams = static_cast<size_t>(D / gc) * ps, qbytes = 4 * static_cast<size_t>(wv);
      for (int s = 0; s < S; ++s) {
        for (int g = 0; g < nk / G; ++g) {
          const size_t o = static_cast<size_t>(s) * (nk / G) + g;
          std::memcpy(kcp + o * gbytes, K.group_codes(g * G, s), gbytes);
          std::memcpy(kscp + o * kparams, K.scales + K.group_params(g * G, s) * ps, kparams);
          std::memcpy(kzp + o * kparams, K.zeros + K.group_params(g * G, s) * ps, kparams);
        }
        for (int64_t q = 0; q < nq; ++q) {
          std::memcpy(vqp + (s * nq + q) * qbytes, V.quad_row(static_cast<int>(q * 4), s), qbytes);
        }
        for (int t = 0; t < nv; ++t) {
          const size_t o = static_cast<size_t>(s) * nv + t;
          const size_t pi = (V.param_base(t, s) + static_cast<size_t>(t % V.block) * (D / gc)) * ps;
          std::memcpy(vscp + o * vparams, V.scales + pi, vparams);
          std::memcpy(vzp + o * vparams, V.zeros + pi, vparams);
        }
        for (int t = nk; t < n; ++t) {
          std::memcpy(krp + (static_cast<size_t>(s) * (n - nk) + (t - nk)) * D,
                      K.residual_row(t, s), D * 4);
        }
        for (int t = nv; t < n; ++t) {
          std::memcpy(vrp + (static_cast<size_t>(s) * (n - nv) + (t - nv)) * D,
                      V.residual_row(t, s), D * 4);
        }
      }
    }
    pb::dict d;
    d["n_tokens"] = n;
    d["keys_stored"] = nk;
    d["values_stored"] = nv;
    d["key_codes"] = kc;
    d["key_scales"] = ksc;
    d["key_zeros"] = kz;
    d["value_quads"] = vq;
    d["value_scales"] = vsc;
    d["value_zeros"] = vz;
    d["key_residual"] = kr;
    d["value_residual"] = vr;
    return d;
  }

  pb::dict memory_stats() const {
    const auto& c = config();
    pb::dict d;
    uint64_t f32 = 0;
    pb::list layers;
    for (int l = 0; l < c.n_layers; ++l) {
      const kv::LayerView view = cache_->view(l);
      pb::dict L;
      L["n_tokens"] = view.n_tokens;
      L["keys_quantized"] = view.k.n_stored;
      L["values_quantized"] = view.v.n_stored;
      L["bytes_used"] = cache_->bytes_used(l);
      L["bytes_reserved"] = cache_->bytes_reserved(l);
      layers.append(L);
      f32 += 2ull * view.n_tokens * c.n_kv_heads * c.head_dim * sizeof(float);
    }
    const uint64_t used = cache_->bytes_used();
    d["bytes_used"] = used;
    d["bytes_reserved"] = cache_->bytes_reserved();
    d["f32_bytes"] = f32;
    d["compression"] = used > 0 ? static_cast<double>(f32) / static_cast<double>(used) : 0.0;
    d["bits_per_element_k"] = kv::bits_per_element(c, kv::Stream::kKey);
    d["bits_per_element_v"] = kv::bits_per_element(c, kv::Stream::kValue);
    d["layers"] = layers;
    return d;
  }

  void clear() { cache_->clear(); }
  int batch() const { return batch_; }
  int n_heads() const { return n_heads_; }

 private:
  int check_layer(int layer) const {
    if (layer < 0 || layer >= config().n_layers) {
      fail("layer %d is out of range (the cache has %d layer%s)", layer, config().n_layers,
           config().n_layers == 1 ? "" : "s");
    }
    return layer;
  }

  int batch_, n_heads_;
  std::unique_ptr<kv::KvCache> cache_;
};

}  // namespace

void bind_cache(pb::module_& m) {
  using namespace pybind11::literals;
  pb::class_<Cache>(m, "Cache",
                    R"(The streaming KIVI KV cache of the engine, for [B, H, T, D] arrays.

Keys are quantized per channel in groups of G tokens, values per token in groups of
min(G, D) channels; the last R tokens stay in full precision (the residual window).
Each appended token applies the flush rules exactly as the engine does while decoding:
  key_flush="batch": when the key residual reaches max(R, G), all of it is quantized;
  key_flush="group": when the key residual exceeds R (holding at least G), the oldest
                     G keys are quantized;
  values: when the value residual would exceed R, the oldest value is quantized.
All storage for max_tokens tokens is allocated here.)")
      .def(pb::init<int, int, int, const std::string&, const std::optional<std::string>&,
                    const std::optional<std::string>&, int, int, const std::string&,
                    const std::string&, int, int>(),
           "n_heads"_a, "head_dim"_a, "max_tokens"_a, "kv_cache"_a = "kivi2",
           "kv_cache_k"_a = pb::none(), "kv_cache_v"_a = pb::none(), "group_size"_a = 32,
           "residual"_a = 128, "key_flush"_a = "batch", "scale_dtype"_a = "f16", "batch"_a = 1,
           "n_layers"_a = 1)
      .def(
          "add_tokens", &Cache::add_tokens, "k"_a, "v"_a, "layer"_a = 0,
          "Appends T tokens of keys and values [B, H, T, D] (post-RoPE keys) to `layer`, in order.")
      .def(
          "get_full_cache", &Cache::get_full_cache, "layer"_a = pb::none(),
          "The cache as attention reads it: (k, v) float32 [B, H, n, D] of one layer, dequantized\n"
          "history then the full-precision residual; without `layer`, a list of every layer's (k, "
          "v).")
      .def("stored", &Cache::stored, "layer"_a = 0,
           R"(The stored state of one layer, byte for byte:
  key_codes   uint8 [B, H, Nk/G, G*W]  the quantized key groups, rows interleaved (as quantize_keys)
  key_scales, key_zeros  [B, H, Nk/G, D]
  value_quads uint8 [B, H, ceil(Nv/4), W, 4]  value rows interleaved by quads of tokens: byte j of
              token t is value_quads[..., t // 4, j, t % 4] (slots past Nv are unused)
  value_scales, value_zeros  [B, H, Nv, D/min(G, D)]
  key_residual, value_residual  float32 [B, H, n - Nk|Nv, D]
  keys_stored (Nk), values_stored (Nv), n_tokens.)")
      .def("memory_stats", &Cache::memory_stats,
           "bytes_used, bytes_reserved, f32_bytes (an f32 cache of the same tokens), compression,\n"
           "bits_per_element_k/v, and per layer n_tokens, keys_quantized, values_quantized, bytes.")
      .def("n_tokens", &Cache::n_tokens, "layer"_a = 0, "Tokens held by `layer`.")
      .def("clear", &Cache::clear, "Forgets every token (storage is kept).")
      .def_property_readonly("batch", &Cache::batch)
      .def_property_readonly("n_heads", &Cache::n_heads)
      .def_property_readonly("head_dim", [](const Cache& c) { return c.config().head_dim; })
      .def_property_readonly("max_tokens", [](const Cache& c) { return c.config().ctx; })
      .def_property_readonly("n_layers", [](const Cache& c) { return c.config().n_layers; })
      .def_property_readonly("group_size", [](const Cache& c) { return c.config().group_size; })
      .def_property_readonly("residual", [](const Cache& c) { return c.config().residual; })
      .def_property_readonly("key_bits",
                             [](const Cache& c) { return kv::format_bits(c.config().k.format); })
      .def_property_readonly("value_bits",
                             [](const Cache& c) { return kv::format_bits(c.config().v.format); })
      .def_property_readonly(
          "key_flush",
          [](const Cache& c) { return std::string(kv::key_flush_name(c.config().key_flush)); })
      .def_property_readonly(
          "scale_dtype",
          [](const Cache& c) { return std::string(kv::param_type_name(c.config().param_type)); })
      .def("__repr__", [](const Cache& c) {
        return strfmt(
            "kivi.Cache(batch=%d, n_heads=%d, head_dim=%d, max_tokens=%d, %s, n_tokens=%d)",
            c.batch(), c.n_heads(), c.config().head_dim, c.config().ctx,
            describe_cache(c.config()).c_str(), c.n_tokens(0));
      });
}

}  // namespace kivi::py
