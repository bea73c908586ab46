#include "kv/format.h"

#include <algorithm>

#include "core/error.h"

namespace kivi::kv {

const char* format_name(Format f) {
  switch (f) {
    case Format::kF32:
      return "f32";
    case Format::kF16:
      return "f16";
    case Format::kInt8:
      return "int8";
    case Format::kKivi2:
      return "kivi2";
    case Format::kKivi4:
      return "kivi4";
    case Format::kKivi8:
      return "kivi8";
    case Format::kTq2:
      return "tq2";
    case Format::kTq3:
      return "tq3";
    case Format::kTq4:
      return "tq4";
    case Format::kTq25:
      return "tq2.5";
    case Format::kTq35:
      return "tq3.5";
  }
  return "?";
}

const char* granularity_name(Int8Granularity g) {
  switch (g) {
    case Int8Granularity::kTensor:
      return "tensor";
    case Int8Granularity::kToken:
      return "token";
    case Int8Granularity::kHead:
      return "head";
    case Int8Granularity::kGroup:
      return "group";
  }
  return "?";
}

const char* key_flush_name(KeyFlush k) { return k == KeyFlush::kBatch ? "batch" : "group"; }
const char* param_type_name(ParamType p) { return p == ParamType::kF16 ? "f16" : "f32"; }
const char* key_rope_name(KeyRope k) { return k == KeyRope::kPre ? "pre" : "post"; }
const char* kv_rotate_name(KvRotate r) { return r == KvRotate::kHadamard ? "hadamard" : "none"; }

KvRotate parse_kv_rotate(const std::string& s) {
  if (s == "none") return KvRotate::kNone;
  if (s == "hadamard") return KvRotate::kHadamard;
  fail("--kv-rotate: unknown rotation '%s' (valid: none, hadamard)", s.c_str());
}

void check_bits(int bits) {
  if (bits != 2 && bits != 4 && bits != 8) {
    fail("quantization bits = %d is not supported (valid: 2, 4, 8)", bits);
  }
}

Format parse_format(const std::string& s, const char* option) {
  if (s == "f32" || s == "fp32") return Format::kF32;
  if (s == "f16" || s == "fp16") return Format::kF16;
  if (s == "int8" || s == "q8") return Format::kInt8;
  if (s.rfind("kivi", 0) == 0 && s.size() > 4) {
    const std::string b = s.substr(4);
    int bits = -1;
    if (b.find_first_not_of("0123456789") == std::string::npos && b.size() <= 3)
      bits = std::stoi(b);
    if (bits == 2) return Format::kKivi2;
    if (bits == 4) return Format::kKivi4;
    if (bits == 8) return Format::kKivi8;
    fail("%s %s: KIVI bits '%s' not in {2, 4, 8}", option, s.c_str(), b.c_str());
  }
  if (s.rfind("tq", 0) == 0 && s.size() > 2) {
    const std::string b = s.substr(2);
    if (b == "2") return Format::kTq2;
    if (b == "3") return Format::kTq3;
    if (b == "4") return Format::kTq4;
    if (b == "2.5") return Format::kTq25;
    if (b == "3.5") return Format::kTq35;
    fail("%s %s: tq bits '%s' not in {2, 2.5, 3, 3.5, 4}", option, s.c_str(), b.c_str());
  }
  fail(
      "%s: unknown KV cache format '%s' (valid: f32, f16, int8, kivi2, kivi4, kivi8, tq2, tq2.5, "
      "tq3, tq3.5, tq4)",
      option, s.c_str());
}

Int8Granularity parse_granularity(const std::string& s) {
  if (s == "tensor") return Int8Granularity::kTensor;
  if (s == "token") return Int8Granularity::kToken;
  if (s == "head") return Int8Granularity::kHead;
  if (s == "group") return Int8Granularity::kGroup;
  fail("--int8-granularity: unknown value '%s' (valid: tensor, token, head, group)", s.c_str());
}

KeyFlush parse_key_flush(const std::string& s) {
  if (s == "batch") return KeyFlush::kBatch;
  if (s == "group") return KeyFlush::kGroup;
  fail("--key-flush: unknown value '%s' (valid: batch, group)", s.c_str());
}

ParamType parse_param_type(const std::string& s) {
  if (s == "f16") return ParamType::kF16;
  if (s == "f32") return ParamType::kF32;
  fail("--scale-dtype: unknown value '%s' (valid: f16, f32)", s.c_str());
}

KeyRope parse_key_rope(const std::string& s) {
  if (s == "post") return KeyRope::kPost;
  if (s == "pre") return KeyRope::kPre;
  fail("--key-rope: unknown value '%s' (valid: post, pre)", s.c_str());
}

int format_bits(Format f) {
  switch (f) {
    case Format::kF32:
      return 32;
    case Format::kF16:
      return 16;
    case Format::kInt8:
      return 8;
    case Format::kKivi2:
      return 2;
    case Format::kKivi4:
      return 4;
    case Format::kKivi8:
      return 8;
    case Format::kTq2:
    case Format::kTq25:
      return 2;
    case Format::kTq3:
    case Format::kTq35:
      return 3;
    case Format::kTq4:
      return 4;
  }
  return 32;
}

double format_code_bits(Format f) {
  if (f == Format::kTq25 || f == Format::kTq35) return format_bits(f) + 0.25;
  return format_bits(f);
}

size_t code_row_bytes(Format f, int head_dim) {
  const size_t D = static_cast<size_t>(head_dim);
  if (is_tq(f)) {  // a bit stream: a quarter of the coordinates (rounded down) one bit wider
    const size_t b = static_cast<size_t>(format_bits(f));
    const size_t wide = f == Format::kTq25 || f == Format::kTq35 ? D / 4 : 0;
    return (D * b + wide + 7) / 8;
  }
  return D * static_cast<size_t>(format_bits(f)) / 8;
}

std::string describe(const StreamFormat& s) {
  if (s.format == Format::kInt8) return std::string("int8/") + granularity_name(s.granularity);
  return format_name(s.format);
}

int CacheConfig::block() const {
  if (block_tokens > 0) return block_tokens;
  // 128 tokens rounded up to a multiple of lcm(G, 4): whole key groups, whole quads of
  // interleaved value tokens.
  const int g = std::max(1, group_size);
  const int unit = g % 4 == 0 ? g : g % 2 == 0 ? 2 * g : 4 * g;
  return (128 + unit - 1) / unit * unit;
}

bool CacheConfig::has_window() const {
  for (int w : layer_window)
    if (w > 0) return true;
  return false;
}

int layer_blocks(const CacheConfig& c, int layer) {
  const int B = c.block();
  const int all = (c.ctx + B - 1) / B;
  const int w = c.window(layer);
  if (w <= 0) return all;
  const CacheConfig one = c.at_layer(layer);
  const int64_t held = std::max<int64_t>({w, key_ring_capacity(one), value_ring_capacity(one)}) +
                       static_cast<int64_t>(B);
  return static_cast<int>(std::min<int64_t>(all, (held + B - 1) / B));
}

int CacheConfig::channel_group() const { return std::min(group_size, head_dim); }

CacheConfig CacheConfig::at_layer(int l) const {
  CacheConfig c = *this;
  if (mixed()) {
    c.k = layer_formats.at(static_cast<size_t>(l)).k;
    c.v = layer_formats.at(static_cast<size_t>(l)).v;
    c.layer_formats.clear();
    c.layer_map.clear();
  }
  return c;
}

std::vector<CacheConfig::LayerFormats> CacheConfig::formats() const {
  if (mixed()) return layer_formats;
  return {LayerFormats{k, v}};
}

bool CacheConfig::has_residual() const {
  return any_stream([](const StreamFormat& f, bool) { return uses_ring(f.format); });
}

void CacheConfig::validate() const {
  if (n_layers < 1) fail("KV cache: n_layers = %d, expected >= 1", n_layers);
  if (!layer_map.empty() && !mixed()) {
    fail(
        "--kv-cache-layers: this command's caches take one format for every layer (use "
        "--kv-cache, --kv-cache-k, --kv-cache-v)");
  }
  if (mixed()) {
    if (static_cast<int>(layer_formats.size()) != n_layers)
      fail("--kv-cache-layers: %zu layers' formats for a model of %d layers", layer_formats.size(),
           n_layers);
    for (int l = 0; l < n_layers; ++l) at_layer(l).validate();
    return;
  }
  if (n_kv_heads < 1) fail("KV cache: n_kv_heads = %d, expected >= 1", n_kv_heads);
  if (head_dim < 1 || head_dim > 1024)
    fail("KV cache: head_dim = %d, expected 1 to 1024", head_dim);
  if (ctx < 1) fail("--ctx = %d, expected >= 1", ctx);
  const std::vector<int> owners = layer_owners(*this);  // throws on a bad sharing map
  if (!layer_window.empty()) {
    if (static_cast<int>(layer_window.size()) != n_layers) {
      fail("KV cache: %zu sliding windows for %d layers", layer_window.size(), n_layers);
    }
    for (int l = 0; l < n_layers; ++l) {
      if (layer_window[l] < 0) fail("KV cache: layer %d has a window of %d", l, layer_window[l]);
      if (owners[l] != l && (layer_window[l] > 0 || layer_window[owners[l]] > 0)) {
        fail(
            "--kv-share: layer %d would read layer %d's cache, but sliding-window layers keep "
            "only their window and share with no layer",
            l, owners[l]);
      }
    }
  }
  const bool kivi = is_kivi(k.format) || is_kivi(v.format);
  const bool grouped = kivi ||
                       (k.format == Format::kInt8 && k.granularity == Int8Granularity::kGroup) ||
                       (v.format == Format::kInt8 && v.granularity == Int8Granularity::kGroup);
  if (group_size < 1 || group_size > 65536) {
    fail("--group-size = %d, expected 1 to 65536", group_size);
  }
  if (grouped && group_size > ctx) {
    fail("--group-size = %d is larger than the context (%d tokens); valid range: 1 to %d",
         group_size, ctx, ctx);
  }
  if (has_residual() && residual < 0) fail("--residual = %d, expected >= 0", residual);
  if (kivi) {
    if (residual % group_size != 0) {
      fail("--residual = %d must be a multiple of --group-size = %d (valid: 0, %d, %d, ...)",
           residual, group_size, group_size, 2 * group_size);
    }
  }
  const int cg = channel_group();
  auto check_stream = [&](const StreamFormat& s, const char* which) {
    if (is_kivi(s.format)) {
      const int per_byte = 8 / format_bits(s.format);
      if (head_dim % per_byte != 0) {
        fail("%s format %s packs %d values per byte but head_dim = %d is not a multiple of %d",
             which, format_name(s.format), per_byte, head_dim, per_byte);
      }
    }
    if (is_tq(s.format) && head_dim < 4) {
      fail("%s format %s needs head_dim >= 4 (head_dim = %d)", which, format_name(s.format),
           head_dim);
    }
    const bool channel_grouped =
        (is_kivi(s.format) && which[0] == 'v') ||
        (s.format == Format::kInt8 && s.granularity == Int8Granularity::kGroup);
    if (channel_grouped && head_dim % cg != 0) {
      fail(
          "--group-size = %d: the %s channel group min(G, head_dim) = %d must divide head_dim = %d",
          group_size, which, cg, head_dim);
    }
  };
  check_stream(k, "key");
  check_stream(v, "value");
  if (block_tokens < 0 ||
      (block_tokens > 0 && (block_tokens % group_size != 0 || block_tokens % 4 != 0))) {
    fail("KV block size = %d must be a positive multiple of 4 and of --group-size = %d",
         block_tokens, group_size);
  }
}

// Parameter bytes per token per head (amortized for per-channel key groups).
static double param_bytes_per_token_head(const CacheConfig& c, Stream s) {
  const StreamFormat& f = s == Stream::kKey ? c.k : c.v;
  const double ps = static_cast<double>(param_size(c.param_type));
  if (f.format == Format::kInt8) {
    switch (f.granularity) {
      case Int8Granularity::kTensor:
        return 0.0;
      case Int8Granularity::kToken:
        return ps / c.n_kv_heads;
      case Int8Granularity::kHead:
        return ps;
      case Int8Granularity::kGroup:
        return ps * (c.head_dim / c.channel_group());
    }
  }
  if (is_kivi(f.format)) {
    if (s == Stream::kKey) return 2.0 * ps * c.head_dim / c.group_size;
    return 2.0 * ps * (c.head_dim / c.channel_group());
  }
  if (is_tq(f.format)) return ps;  // one scale per token and head
  return 0.0;
}

double stream_bytes_per_token(const CacheConfig& c, Stream s) {
  if (c.mixed()) {  // the mean over the layers that store a cache
    const std::vector<int> owners = layer_owners(c);
    double sum = 0.0;
    int n = 0;
    for (int l = 0; l < c.n_layers; ++l) {
      if (owners[l] != l) continue;
      sum += stream_bytes_per_token(c.at_layer(l), s);
      ++n;
    }
    return sum / std::max(n, 1);
  }
  const StreamFormat& f = s == Stream::kKey ? c.k : c.v;
  const double codes = static_cast<double>(code_row_bytes(f.format, c.head_dim));
  return c.n_kv_heads * (codes + param_bytes_per_token_head(c, s));
}

double layer_bytes_per_token(const CacheConfig& c) {
  return stream_bytes_per_token(c, Stream::kKey) + stream_bytes_per_token(c, Stream::kValue);
}

double bits_per_element(const CacheConfig& c, Stream s) {
  return stream_bytes_per_token(c, s) * 8.0 / (static_cast<double>(c.n_kv_heads) * c.head_dim);
}

int keys_quantized_after(const CacheConfig& c, int n) {
  if (c.mixed()) fail("keys_quantized_after: a configuration with per-layer formats");
  if (is_tq(c.k.format)) return std::max(0, n - c.residual);  // token by token, as values
  if (!is_kivi(c.k.format)) return n;
  const int G = c.group_size, R = c.residual;
  if (c.key_flush == KeyFlush::kBatch) {
    const int r = std::max(R, G);
    return n / r * r;
  }
  const int t = std::max(R + 1, G);  // residual size that triggers a flush of G keys
  if (n < t) return 0;
  return ((n - t) / G + 1) * G;
}

int values_quantized_after(const CacheConfig& c, int n) {
  if (c.mixed()) fail("values_quantized_after: a configuration with per-layer formats");
  if (!uses_ring(c.v.format)) return n;
  return std::max(0, n - c.residual);
}

int key_ring_capacity(const CacheConfig& c) {
  if (c.mixed()) {
    int m = 0;
    for (int l = 0; l < c.n_layers; ++l) m = std::max(m, key_ring_capacity(c.at_layer(l)));
    return m;
  }
  if (is_tq(c.k.format)) return c.residual > 0 ? c.residual + c.ring_slack : 0;
  if (!is_kivi(c.k.format)) return 0;
  const int G = c.group_size, R = c.residual;
  // Whole groups: a flushed group's rows are contiguous in the ring (they start at a
  // multiple of G), however far the slack lets the ring run.
  const int slack = (c.ring_slack + G - 1) / G * G;
  if (c.key_flush == KeyFlush::kBatch) return std::max(R, G) + slack;
  const int t = std::max(R + 1, G);
  return (t + G - 1) / G * G + slack;
}

int value_ring_capacity(const CacheConfig& c) {
  if (c.mixed()) {
    int m = 0;
    for (int l = 0; l < c.n_layers; ++l) m = std::max(m, value_ring_capacity(c.at_layer(l)));
    return m;
  }
  return uses_ring(c.v.format) && c.residual > 0 ? c.residual + c.ring_slack : 0;
}

// Bytes of stored (non-residual) data for `nq` tokens of one stream, one layer: per head
// the codes and the parameters (each of scale and zero point), and the parameters the
// heads share (int8 with one scale per token).
struct StoredBytes {
  uint64_t head_codes = 0, head_params = 0, shared_params = 0;
  int param_sets = 1;  // KIVI: a scale and a zero point
};
static StoredBytes stream_stored(const CacheConfig& c, Stream s, int nq) {
  const StreamFormat& f = s == Stream::kKey ? c.k : c.v;
  const uint64_t D = c.head_dim, ps = param_size(c.param_type), n = static_cast<uint64_t>(nq);
  StoredBytes b;
  b.head_codes = n * code_row_bytes(f.format, static_cast<int>(D));
  if (f.format == Format::kInt8) {
    switch (f.granularity) {
      case Int8Granularity::kTensor:
        break;
      case Int8Granularity::kToken:
        b.shared_params = n * ps;
        break;
      case Int8Granularity::kHead:
        b.head_params = n * ps;
        break;
      case Int8Granularity::kGroup:
        b.head_params = n * (D / c.channel_group()) * ps;
        break;
    }
  } else if (is_tq(f.format)) {
    b.head_params = n * ps;
  } else if (is_kivi(f.format)) {
    b.param_sets = 2;
    b.head_params =
        s == Stream::kKey ? n / c.group_size * D * ps : n * (D / c.channel_group()) * ps;
  }
  return b;
}

static uint64_t stream_stored_bytes(const CacheConfig& c, Stream s, int nq) {
  const StoredBytes b = stream_stored(c, s, nq);
  const uint64_t H = c.n_kv_heads;
  return H * b.head_codes + b.param_sets * H * b.head_params + b.shared_params;
}

// The same in a pool's buffers, whose heads' regions start on pages once large enough.
static uint64_t stream_reserved_bytes(const CacheConfig& c, Stream s, int nq) {
  const StoredBytes b = stream_stored(c, s, nq);
  const uint64_t H = c.n_kv_heads;
  const uint64_t params = H * head_region_bytes(b.head_params) + b.shared_params;
  return H * head_region_bytes(b.head_codes) + (b.param_sets == 2 ? 2 * params : params);
}

namespace {
// int8 with one scale per tensor: a float per stream and layer.
uint64_t tensor_scale_bytes(const CacheConfig& c) {
  auto one = [](const StreamFormat& f) {
    return f.format == Format::kInt8 && f.granularity == Int8Granularity::kTensor ? sizeof(float)
                                                                                  : 0;
  };
  return one(c.k) + one(c.v);
}
}  // namespace

uint64_t expected_bytes_used(const CacheConfig& c, int n) {
  if (c.mixed()) {
    const std::vector<int> owners = layer_owners(c);
    uint64_t total = 0;
    for (int l = 0; l < c.n_layers; ++l) {
      if (owners[l] != l) continue;
      CacheConfig one = c.at_layer(l);  // that layer alone
      one.n_layers = 1;
      one.share_every = 1;
      one.share_map.clear();
      one.layer_window =
          c.layer_window.empty() ? std::vector<int>{} : std::vector<int>{c.window(l)};
      total += expected_bytes_used(one, n);
    }
    return total;
  }
  const uint64_t row = static_cast<uint64_t>(c.n_kv_heads) * c.head_dim * sizeof(float);
  const int nkq = keys_quantized_after(c, n), nvq = values_quantized_after(c, n);
  const int B = c.block();
  const std::vector<int> owners = layer_owners(c);
  uint64_t total = 0;
  for (int l = 0; l < c.n_layers; ++l) {
    if (owners[l] != l) continue;
    // A layer with a window W has evicted the whole stored blocks before the last W tokens.
    const int w = c.window(l);
    const int64_t stored = std::min(nkq, nvq);
    const int ev =
        w > 0 ? static_cast<int>(std::max<int64_t>(0, std::min<int64_t>(n - w, stored)) / B * B)
              : 0;
    const int kq = nkq, vq = nvq;
    uint64_t per_layer = stream_stored_bytes(c, Stream::kKey, kq - ev) +
                         stream_stored_bytes(c, Stream::kValue, vq - ev) +
                         static_cast<uint64_t>(n - kq) * row + static_cast<uint64_t>(n - vq) * row;
    if (n > 0) per_layer += tensor_scale_bytes(c);  // once calibrated
    total += per_layer;
  }
  return total;
}

uint64_t expected_bytes_reserved(const CacheConfig& c) {
  if (c.mixed()) {
    const std::vector<int> owners = layer_owners(c);
    uint64_t total = 0;
    for (int l = 0; l < c.n_layers; ++l) {
      if (owners[l] != l) continue;
      CacheConfig one = c.at_layer(l);
      one.n_layers = 1;
      one.share_every = 1;
      one.share_map.clear();
      one.layer_window =
          c.layer_window.empty() ? std::vector<int>{} : std::vector<int>{c.window(l)};
      total += expected_bytes_reserved(one);
    }
    return total;
  }
  const int B = c.block();
  const uint64_t row = static_cast<uint64_t>(c.n_kv_heads) * c.head_dim * sizeof(float);
  const std::vector<int> owners = layer_owners(c);
  uint64_t total = 0;
  for (int l = 0; l < c.n_layers; ++l) {
    if (owners[l] != l) continue;
    const int n_blocks = layer_blocks(c, l);
    uint64_t per_layer = stream_reserved_bytes(c, Stream::kKey, n_blocks * B) +
                         stream_reserved_bytes(c, Stream::kValue, n_blocks * B) +
                         static_cast<uint64_t>(key_ring_capacity(c)) * row +
                         static_cast<uint64_t>(value_ring_capacity(c)) * row +
                         n_blocks * sizeof(int32_t) +  // block table
                         tensor_scale_bytes(c);
    total += per_layer;
  }
  return total;
}

std::vector<int> layer_owners(const CacheConfig& c) {
  const int L = c.n_layers;
  if (c.share_every < 1) fail("--kv-share %d: expected a group size >= 1", c.share_every);
  std::vector<int> owner(std::max(L, 0));
  for (int l = 0; l < L; ++l) owner[l] = l / c.share_every * c.share_every;
  for (const auto& [b, o] : c.share_map) {
    if (b < 0 || b >= L || o < 0 || o >= L) {
      fail("--kv-share-map %d:%d: layers are 0 to %d", b, o, L - 1);
    }
    if (o >= b)
      fail("--kv-share-map %d:%d: the owner must be an earlier layer than the borrower", b, o);
    owner[b] = o;
  }
  for (int l = 0; l < L; ++l) {
    if (owner[owner[l]] != owner[l]) {
      fail(
          "--kv-share-map: layer %d reads layer %d, which itself reads layer %d (owners store "
          "their own cache)",
          l, owner[l], owner[owner[l]]);
    }
  }
  return owner;
}

int stored_layers(const CacheConfig& c) {
  const auto owner = layer_owners(c);
  int n = 0;
  for (int l = 0; l < static_cast<int>(owner.size()); ++l) n += owner[l] == l;
  return n;
}

std::string describe_sharing(const CacheConfig& c) {
  std::string s;
  if (c.share_every > 1) s = "every " + std::to_string(c.share_every) + " layers";
  for (const auto& [b, o] : c.share_map)
    s += (s.empty() ? "layers " : " ") + std::to_string(b) + ":" + std::to_string(o);
  return s;
}

}  // namespace kivi::kv
