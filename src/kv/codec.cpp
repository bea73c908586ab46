#include "kv/codec.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/error.h"
#include "core/f16.h"

namespace kivi::kv {

void store_param(void* base, size_t index, float v, ParamType pt) {
  if (pt == ParamType::kF16) {
    static_cast<f16_t*>(base)[index] = f32_to_f16(v);  // v is already representable
  } else {
    static_cast<float*>(base)[index] = v;
  }
}

float load_param(const void* base, size_t index, ParamType pt) {
  if (pt == ParamType::kF16) return f16_to_f32(static_cast<const f16_t*>(base)[index]);
  return static_cast<const float*>(base)[index];
}

QParams kivi_params(float mn, float mx, int bits, ParamType pt) {
  const float levels = static_cast<float>((1 << bits) - 1);
  QParams p;
  if (pt == ParamType::kF32) {
    p.zero = mn;
    p.scale = (mx - mn) / levels;
    return p;
  }
  // f16: round zero down and scale up so the stored range covers [mn, mx].
  p.zero = round_f16_down(std::max(mn, -kF16Max));
  const double s = (static_cast<double>(mx) - p.zero) / levels;
  float sf = static_cast<float>(s);
  if (static_cast<double>(sf) < s) sf = std::nextafter(sf, std::numeric_limits<float>::infinity());
  p.scale = std::min(round_f16_up(sf), kF16Max);
  return p;
}

uint8_t kivi_code(float x, QParams p, int bits) {
  const int levels = (1 << bits) - 1;
  if (!(p.scale > 0.0f)) return 0;
  const float q = std::nearbyint((x - p.zero) / p.scale);
  if (!(q > 0.0f)) return 0;  // also maps NaN to 0
  return static_cast<uint8_t>(q >= levels ? levels : static_cast<int>(q));
}

float int8_scale(float absmax, ParamType pt) {
  const float s = absmax / 127.0f;
  if (pt == ParamType::kF32) return s;
  return std::min(round_f16_up(s), kF16Max);
}

int8_t int8_code(float x, float scale, bool* clamped) {
  if (!(scale > 0.0f)) {
    if (clamped && x != 0.0f) *clamped = true;
    return 0;
  }
  const float q = std::nearbyint(x / scale);
  if (q > 127.0f || q < -127.0f || std::isnan(q)) {
    if (clamped) *clamped = true;
    return static_cast<int8_t>(std::isnan(q) ? 0 : (q > 0 ? 127 : -127));
  }
  return static_cast<int8_t>(q);
}

uint8_t unpack_code(const uint8_t* row, int i, int bits, int D) {
  const int W = D * bits / 8;  // bytes per row: channel i is in byte i % W, plane i / W
  return (row[i % W] >> (bits * (i / W))) & ((1 << bits) - 1);
}

void pack_code(uint8_t* row, int i, int bits, int D, uint8_t code) {
  const int W = D * bits / 8;
  const int sh = bits * (i / W);
  const int mask = ((1 << bits) - 1) << sh;
  row[i % W] = static_cast<uint8_t>((row[i % W] & ~mask) | (code << sh));
}

static void check_common(int S, int T, int D, int G, int bits) {
  check_bits(bits);
  if (S < 0 || T < 0 || D < 1) fail("codec: bad shape S=%d T=%d D=%d", S, T, D);
  if (G < 1) fail("codec: group size %d, expected >= 1", G);
  if (D % (8 / bits) != 0)
    fail("codec: head_dim %d is not a multiple of %d for %d-bit packing", D, 8 / bits, bits);
}

void quantize_keys(const float* keys, int S, int T, int D, int G, int bits, ParamType pt,
                   uint8_t* codes, void* scale, void* zero) {
  check_common(S, T, D, G, bits);
  if (T % G != 0) fail("quantize_keys: %d tokens is not a multiple of the group size %d", T, G);
  if (D > 1024) fail("quantize_keys: head_dim %d is above 1024", D);
  const int rb = static_cast<int>(packed_row_bytes(D, bits));
  const int NG = T / G;
  uint8_t row[1024];
  QParams p[1024];  // one group's parameters per channel (no allocation: the cache calls this per
                    // flush)
  for (int s = 0; s < S; ++s) {
    for (int g = 0; g < NG; ++g) {
      const float* kg = keys + (static_cast<size_t>(s) * T + g * G) * D;
      uint8_t* cg = codes + (static_cast<size_t>(s) * T + g * G) * rb;
      for (int d = 0; d < D; ++d) {
        float mn = kg[d], mx = kg[d];
        for (int t = 1; t < G; ++t) {
          mn = std::min(mn, kg[t * D + d]);
          mx = std::max(mx, kg[t * D + d]);
        }
        p[d] = kivi_params(mn, mx, bits, pt);
        const size_t pi = (static_cast<size_t>(s) * NG + g) * D + d;
        store_param(scale, pi, p[d].scale, pt);
        store_param(zero, pi, p[d].zero, pt);
      }
      for (int t = 0; t < G; ++t) {
        std::memset(row, 0, static_cast<size_t>(rb));
        for (int d = 0; d < D; ++d)
          pack_code(row, d, bits, D, kivi_code(kg[t * D + d], p[d], bits));
        for (int j = 0; j < rb; ++j) cg[key_group_offset(t, j, rb, G)] = row[j];
      }
    }
  }
}

void dequantize_keys(const uint8_t* codes, const void* scale, const void* zero, int S, int T, int D,
                     int G, int bits, ParamType pt, float* keys) {
  check_common(S, T, D, G, bits);
  if (T % G != 0) fail("dequantize_keys: %d tokens is not a multiple of the group size %d", T, G);
  if (D > 1024) fail("dequantize_keys: head_dim %d is above 1024", D);
  const int rb = static_cast<int>(packed_row_bytes(D, bits));
  const int NG = T / G;
  uint8_t row[1024];
  float sc[1024], zr[1024];  // the group's parameters, converted once per group
  for (int s = 0; s < S; ++s) {
    for (int t = 0; t < T; ++t) {
      if (t % G == 0) {
        const size_t pbase = (static_cast<size_t>(s) * NG + t / G) * D;
        for (int d = 0; d < D; ++d) {
          sc[d] = load_param(scale, pbase + d, pt);
          zr[d] = load_param(zero, pbase + d, pt);
        }
      }
      const uint8_t* cg = codes + (static_cast<size_t>(s) * T + t / G * G) * rb;
      for (int j = 0; j < rb; ++j) row[j] = cg[key_group_offset(t % G, j, rb, G)];
      float* out = keys + (static_cast<size_t>(s) * T + t) * D;
      for (int d = 0; d < D; ++d) out[d] = unpack_code(row, d, bits, D) * sc[d] + zr[d];
    }
  }
}

void quantize_values(const float* values, int S, int T, int D, int G, int bits, ParamType pt,
                     uint8_t* codes, void* scale, void* zero) {
  check_common(S, T, D, G, bits);
  if (D % G != 0) fail("quantize_values: group size %d does not divide head_dim %d", G, D);
  const size_t rb = packed_row_bytes(D, bits);
  const int NG = D / G;
  for (int s = 0; s < S; ++s) {
    for (int t = 0; t < T; ++t) {
      const float* v = values + (static_cast<size_t>(s) * T + t) * D;
      uint8_t* row = codes + (static_cast<size_t>(s) * T + t) * rb;
      std::memset(row, 0, rb);
      for (int g = 0; g < NG; ++g) {
        float mn = v[g * G], mx = v[g * G];
        for (int d = 1; d < G; ++d) {
          mn = std::min(mn, v[g * G + d]);
          mx = std::max(mx, v[g * G + d]);
        }
        const QParams p = kivi_params(mn, mx, bits, pt);
        const size_t pi = (static_cast<size_t>(s) * T + t) * NG + g;
        store_param(scale, pi, p.scale, pt);
        store_param(zero, pi, p.zero, pt);
        for (int d = 0; d < G; ++d)
          pack_code(row, g * G + d, bits, D, kivi_code(v[g * G + d], p, bits));
      }
    }
  }
}

void dequantize_values(const uint8_t* codes, const void* scale, const void* zero, int S, int T,
                       int D, int G, int bits, ParamType pt, float* values) {
  check_common(S, T, D, G, bits);
  if (D % G != 0) fail("dequantize_values: group size %d does not divide head_dim %d", G, D);
  const size_t rb = packed_row_bytes(D, bits);
  const int NG = D / G;
  for (int s = 0; s < S; ++s) {
    for (int t = 0; t < T; ++t) {
      const uint8_t* row = codes + (static_cast<size_t>(s) * T + t) * rb;
      float* out = values + (static_cast<size_t>(s) * T + t) * D;
      for (int d = 0; d < D; ++d) {
        const size_t pi = (static_cast<size_t>(s) * T + t) * NG + d / G;
        out[d] =
            unpack_code(row, d, bits, D) * load_param(scale, pi, pt) + load_param(zero, pi, pt);
      }
    }
  }
}

int64_t quantize_int8(const float* x, int T, int H, int D, Int8Granularity g, int G, ParamType pt,
                      int8_t* codes, void* scales, float tensor_scale) {
  if (T < 0 || H < 1 || D < 1) fail("quantize_int8: bad shape T=%d H=%d D=%d", T, H, D);
  if (g == Int8Granularity::kGroup && (G < 1 || D % G != 0)) {
    fail("quantize_int8: group size %d does not divide head_dim %d", G, D);
  }
  int64_t clamped = 0;
  auto absmax = [](const float* p, int n) {
    float m = 0.0f;
    for (int i = 0; i < n; ++i) m = std::max(m, std::fabs(p[i]));
    return m;
  };
  auto encode = [&](const float* p, int8_t* c, int n, float s) {
    for (int i = 0; i < n; ++i) {
      bool cl = false;
      c[i] = int8_code(p[i], s, &cl);
      clamped += cl;
    }
  };
  const int HD = H * D;
  for (int t = 0; t < T; ++t) {
    const float* xt = x + static_cast<size_t>(t) * HD;
    int8_t* ct = codes + static_cast<size_t>(t) * HD;
    switch (g) {
      case Int8Granularity::kTensor:
        encode(xt, ct, HD, tensor_scale);
        break;
      case Int8Granularity::kToken: {
        const float s = int8_scale(absmax(xt, HD), pt);
        store_param(scales, t, s, pt);
        encode(xt, ct, HD, s);
        break;
      }
      case Int8Granularity::kHead:
        for (int h = 0; h < H; ++h) {
          const float s = int8_scale(absmax(xt + h * D, D), pt);
          store_param(scales, static_cast<size_t>(t) * H + h, s, pt);
          encode(xt + h * D, ct + h * D, D, s);
        }
        break;
      case Int8Granularity::kGroup: {
        const int NG = D / G;
        for (int h = 0; h < H; ++h) {
          for (int q = 0; q < NG; ++q) {
            const float* p = xt + h * D + q * G;
            const float s = int8_scale(absmax(p, G), pt);
            store_param(scales, (static_cast<size_t>(t) * H + h) * NG + q, s, pt);
            encode(p, ct + h * D + q * G, G, s);
          }
        }
        break;
      }
    }
  }
  return clamped;
}

void dequantize_int8(const int8_t* codes, const void* scales, int T, int H, int D,
                     Int8Granularity g, int G, ParamType pt, float* x, float tensor_scale) {
  const int HD = H * D;
  for (int t = 0; t < T; ++t) {
    for (int h = 0; h < H; ++h) {
      for (int d = 0; d < D; ++d) {
        float s = tensor_scale;
        switch (g) {
          case Int8Granularity::kTensor:
            break;
          case Int8Granularity::kToken:
            s = load_param(scales, t, pt);
            break;
          case Int8Granularity::kHead:
            s = load_param(scales, static_cast<size_t>(t) * H + h, pt);
            break;
          case Int8Granularity::kGroup:
            s = load_param(scales, (static_cast<size_t>(t) * H + h) * (D / G) + d / G, pt);
            break;
        }
        const size_t i = static_cast<size_t>(t) * HD + h * D + d;
        x[i] = codes[i] * s;
      }
    }
  }
}

}  // namespace kivi::kv
