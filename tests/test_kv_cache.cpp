// The cache: flush schedule, storage addressing, memory accounting, parameter checks.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <vector>

#include "attn/attention.h"
#include "core/error.h"
#include "core/f16.h"
#include "core/rng.h"
#include "kv/codec.h"
#include "kv/kv_cache.h"
#include "kv/rotation.h"
#include "test_util.h"

namespace kivi {
namespace {

using kv::CacheConfig;
using kv::Format;
using kv::Int8Granularity;
using kv::KeyFlush;
using kv::ParamType;

CacheConfig config(Format kf, Format vf, int G, int R, KeyFlush flush, int H = 2, int D = 16,
                   int ctx = 300, Int8Granularity g = Int8Granularity::kHead) {
  CacheConfig c;
  c.n_layers = 2;
  c.n_kv_heads = H;
  c.head_dim = D;
  c.ctx = ctx;
  c.k = {kf, g};
  c.v = {vf, g};
  c.group_size = G;
  c.residual = R;
  c.key_flush = flush;
  return c;
}

// The flush rules simulated literally, one append at a time (independent of the
// closed forms in kv/format.cpp).
struct FlushSim {
  int G, R;
  KeyFlush flush;
  int key_res = 0, val_res = 0, keys_q = 0, vals_q = 0;
  void append() {
    ++key_res;
    if (flush == KeyFlush::kBatch) {
      if (key_res == std::max(R, G)) {
        keys_q += key_res;
        key_res = 0;
      }
    } else if (key_res > R && key_res >= G) {
      keys_q += G;
      key_res -= G;
    }
    ++val_res;
    if (val_res > R) {
      ++vals_q;
      --val_res;
    }
  }
};

TEST(KvCache, FlushScheduleFollowsTheRules) {
  for (KeyFlush flush : {KeyFlush::kBatch, KeyFlush::kGroup}) {
    for (auto [G, R] : {std::pair{32, 128}, {32, 32}, {32, 0}, {64, 128}, {8, 24}, {16, 0}}) {
      const CacheConfig c = config(Format::kKivi2, Format::kKivi2, G, R, flush, 1, 8, 400);
      kv::KvCache cache(c);
      FlushSim sim{G, R, flush};
      std::vector<float> x(8, 1.0f);
      for (int n = 1; n <= 400; ++n) {
        cache.append(0, x.data(), x.data());
        sim.append();
        ASSERT_EQ(cache.raw(0, kv::Stream::kKey).n_stored, sim.keys_q)
            << "G " << G << " R " << R << " n " << n;
        ASSERT_EQ(cache.raw(0, kv::Stream::kValue).n_stored, sim.vals_q)
            << "G " << G << " R " << R << " n " << n;
        ASSERT_EQ(kv::keys_quantized_after(c, n), sim.keys_q);
        ASSERT_EQ(kv::values_quantized_after(c, n), sim.vals_q);
        ASSERT_EQ(sim.keys_q % G, 0);  // never a partial key group
      }
    }
  }
}

std::vector<float> randn(size_t n, Rng& r) {
  std::vector<float> v(n);
  for (auto& x : v) x = r.normal();
  return v;
}

// What the cache stores must equal what the codec produces on the same data.
TEST(KvCache, StoredTokensMatchTheCodec) {
  const int H = 2, D = 16, G = 8, R = 16, N = 150;
  for (Format f : {Format::kKivi2, Format::kKivi4, Format::kKivi8}) {
    for (ParamType pt : {ParamType::kF16, ParamType::kF32}) {
      CacheConfig c = config(f, f, G, R, KeyFlush::kGroup, H, D, 200);
      c.param_type = pt;
      kv::KvCache cache(c);
      Rng r(1);
      std::vector<std::vector<float>> K, V;
      for (int t = 0; t < N; ++t) {
        K.push_back(randn(H * D, r));
        V.push_back(randn(H * D, r));
        cache.append(1, K.back().data(), V.back().data());
      }
      const auto view = cache.view(1);
      const int bits = kv::format_bits(f);
      std::vector<float> got(D), want(G * D), grp(G * D);
      std::vector<uint8_t> codes(G * D), sc(D * 4 * G), zr(D * 4 * G);
      for (int h = 0; h < H; ++h) {
        for (int t = 0; t < N; ++t) {
          attn::dequantize_key(view.k, t, h, got.data());
          if (t < view.k.n_stored) {
            const int g0 = t / G * G;
            for (int i = 0; i < G; ++i)
              std::copy(K[g0 + i].begin() + h * D, K[g0 + i].begin() + (h + 1) * D,
                        grp.begin() + i * D);
            kv::quantize_keys(grp.data(), 1, G, D, G, bits, pt, codes.data(), sc.data(), zr.data());
            kv::dequantize_keys(codes.data(), sc.data(), zr.data(), 1, G, D, G, bits, pt,
                                want.data());
            ASSERT_TRUE(std::equal(got.begin(), got.end(), want.begin() + (t - g0) * D))
                << "key t " << t;
          } else {
            ASSERT_TRUE(std::equal(got.begin(), got.end(), K[t].begin() + h * D))
                << "residual key t " << t;
          }
          attn::dequantize_value(view.v, t, h, got.data());
          if (t < view.v.n_stored) {
            kv::quantize_values(V[t].data() + h * D, 1, 1, D, G, bits, pt, codes.data(), sc.data(),
                                zr.data());
            kv::dequantize_values(codes.data(), sc.data(), zr.data(), 1, 1, D, G, bits, pt,
                                  want.data());
            ASSERT_TRUE(std::equal(got.begin(), got.end(), want.begin())) << "value t " << t;
          } else {
            ASSERT_TRUE(std::equal(got.begin(), got.end(), V[t].begin() + h * D))
                << "residual value t " << t;
          }
        }
      }
    }
  }
}

TEST(KvCache, RowFormatsStoreWhatTheCodecWrites) {
  const int H = 3, D = 16, N = 70;
  for (auto [f, g] : {std::pair{Format::kF32, Int8Granularity::kHead},
                      {Format::kF16, Int8Granularity::kHead},
                      {Format::kInt8, Int8Granularity::kToken},
                      {Format::kInt8, Int8Granularity::kHead},
                      {Format::kInt8, Int8Granularity::kGroup}}) {
    CacheConfig c = config(f, f, 8, 0, KeyFlush::kBatch, H, D, 100, g);
    kv::KvCache cache(c);
    Rng r(2);
    std::vector<std::vector<float>> K;
    for (int t = 0; t < N; ++t) {
      K.push_back(randn(H * D, r));
      cache.append(0, K.back().data(), K.back().data());
    }
    const auto view = cache.view(0);
    std::vector<float> got(D);
    for (int t = 0; t < N; ++t) {
      std::vector<float> want(H * D);
      if (f == Format::kF32) {
        want = K[t];
      } else if (f == Format::kF16) {
        for (int i = 0; i < H * D; ++i) want[i] = round_f16(K[t][i]);
      } else {
        std::vector<int8_t> codes(H * D);
        std::vector<uint8_t> sc(H * D * 4);
        kv::quantize_int8(K[t].data(), 1, H, D, g, 8, ParamType::kF16, codes.data(), sc.data());
        kv::dequantize_int8(codes.data(), sc.data(), 1, H, D, g, 8, ParamType::kF16, want.data());
      }
      for (int h = 0; h < H; ++h) {
        attn::dequantize_key(view.k, t, h, got.data());
        ASSERT_TRUE(std::equal(got.begin(), got.end(), want.begin() + h * D))
            << kv::format_name(f) << " t " << t;
      }
    }
  }
}

// --kv-rotate hadamard: int8 rows (keys and values) and KIVI values are quantized after the
// head's rotation (kv/rotation.h, seeded per layer and head) and read back rotated back;
// KIVI keys are not rotated. The codec applied by hand to R x, then R^T, is the expectation.
TEST(KvCache, RotatedStreamsStoreTheCodecOfTheRotatedRow) {
  const int H = 2, D = 16, N = 40;
  for (auto [kf, vf] :
       {std::pair{Format::kInt8, Format::kInt8}, {Format::kKivi4, Format::kKivi2}}) {
    CacheConfig c = config(kf, vf, 8, 0, KeyFlush::kBatch, H, D, 100);
    c.rotate = kv::KvRotate::kHadamard;
    c.rotation_seed = 99;
    kv::KvCache cache(c), plain([&] {
      CacheConfig p = c;
      p.rotate = kv::KvRotate::kNone;
      return p;
    }());
    Rng r(5);
    std::vector<std::vector<float>> X;
    for (int t = 0; t < N; ++t) {
      X.push_back(randn(H * D, r));
      for (int l = 0; l < 2; ++l) {
        cache.append(l, X.back().data(), X.back().data());
        plain.append(l, X.back().data(), X.back().data());
      }
    }
    for (int l = 0; l < 2; ++l) {
      const auto view = cache.view(l), pv = plain.view(l);
      EXPECT_EQ(view.k.rotated, kf == Format::kInt8);
      EXPECT_TRUE(view.v.rotated);
      std::vector<float> got(D), want(D), x(D), p(D);
      for (int t = 0; t < view.v.n_stored; ++t) {
        for (int h = 0; h < H; ++h) {
          const kv::HadamardRotation rot(D, kv::rotation_seed(99, l, h));
          std::copy(X[t].begin() + h * D, X[t].begin() + (h + 1) * D, x.begin());
          rot.forward(x.data());
          // Values: the row rotated, quantized as the format does, rotated back.
          if (vf == Format::kInt8) {
            std::vector<int8_t> codes(D);
            std::vector<uint8_t> sc(8);
            kv::quantize_int8(x.data(), 1, 1, D, Int8Granularity::kHead, 8, ParamType::kF16,
                              codes.data(), sc.data());
            kv::dequantize_int8(codes.data(), sc.data(), 1, 1, D, Int8Granularity::kHead, 8,
                                ParamType::kF16, want.data());
          } else {
            std::vector<uint8_t> codes(D), sc(D * 2), zp(D * 2);
            kv::quantize_values(x.data(), 1, 1, D, 8, 2, ParamType::kF16, codes.data(), sc.data(),
                                zp.data());
            kv::dequantize_values(codes.data(), sc.data(), zp.data(), 1, 1, D, 8, 2,
                                  ParamType::kF16, want.data());
          }
          rot.inverse(want.data());
          attn::dequantize_value(view.v, t, h, got.data());
          for (int d = 0; d < D; ++d)
            ASSERT_NEAR(got[d], want[d], 1e-5f) << "value t " << t << " h " << h << " d " << d;
          // Keys: int8 rotated like the values; KIVI keys as an unrotated cache holds them.
          attn::dequantize_key(view.k, t, h, got.data());
          if (kf == Format::kKivi4) {
            attn::dequantize_key(pv.k, t, h, p.data());
            ASSERT_EQ(got, p) << "key t " << t;
          } else {
            double err = 0, norm = 0;
            for (int d = 0; d < D; ++d) {
              err = std::max(err, std::fabs(double(got[d]) - X[t][h * D + d]));
              norm = std::max(norm, std::fabs(double(x[d])));
            }
            EXPECT_LE(err, norm / 127 * 0.5 * std::sqrt(D) + 1e-5) << "key t " << t;
          }
        }
      }
    }
  }
}

TEST(KvCache, Int8TensorScaleIsFixedByCalibrationAndClampsLater) {
  CacheConfig c = config(Format::kInt8, Format::kInt8, 8, 0, KeyFlush::kBatch, 1, 8, 16,
                         Int8Granularity::kTensor);
  c.param_type = ParamType::kF32;
  kv::KvCache cache(c);
  std::vector<float> small(8, 1.27f), big(8, 0.0f);
  big[0] = 5.0f;
  cache.calibrate(0, small.data(), small.data(), 1);
  cache.append(0, small.data(), small.data());
  EXPECT_FLOAT_EQ(cache.view(0).k.tensor_scale, 0.01f);
  EXPECT_EQ(cache.clamped(), 0);
  cache.append(0, big.data(), big.data());
  EXPECT_EQ(cache.clamped(), 2);  // one element in K, one in V
  std::vector<float> got(8);
  attn::dequantize_key(cache.view(0).k, 1, 0, got.data());
  EXPECT_FLOAT_EQ(got[0], 1.27f);  // clamped to 127 * scale
}

// Long caches: every head's region of 64 KiB or more starts on a page (so a saved cache
// can be mapped into it), and the formula counts the padding.
TEST(KvCache, LargeHeadRegionsStartOnPagesAndAreCounted) {
  for (Format f : {Format::kF16, Format::kKivi2, Format::kInt8}) {
    CacheConfig c = config(f, f, 32, 64, KeyFlush::kBatch, 3, 64, 20000);
    c.k.granularity = c.v.granularity = Int8Granularity::kGroup;
    kv::KvCache cache(c);
    EXPECT_EQ(cache.bytes_reserved(), kv::expected_bytes_reserved(c)) << kv::describe(c.k);
    const kv::LayerView v = cache.view(0);
    for (const kv::StreamView* s : {&v.k, &v.v}) {
      ASSERT_GE(s->code_head_stride, 65536u);
      EXPECT_EQ(s->code_head_stride % 4096, 0u);
      EXPECT_GE(s->code_head_stride, s->n_blocks * s->head_block_bytes);
      for (int h = 0; h < 3; ++h)
        EXPECT_EQ(reinterpret_cast<uintptr_t>(s->codes + h * s->code_head_stride) % 4096, 0u);
      const size_t param_bytes = s->n_blocks * s->head_block_params * 2;
      if (param_bytes >= 65536) {
        EXPECT_EQ(s->param_head_stride * 2 % 4096, 0u);
        EXPECT_GE(s->param_head_stride * 2, param_bytes);
      }
    }
  }
}

// bytes_used() and bytes_reserved() from the buffers agree with the formulas, at
// every length, for every format.
TEST(KvCache, MemoryAccountingMatchesTheFormula) {
  std::vector<CacheConfig> cfgs;
  for (Format f : {Format::kF32, Format::kF16, Format::kKivi2, Format::kKivi4, Format::kKivi8}) {
    for (KeyFlush fl : {KeyFlush::kBatch, KeyFlush::kGroup})
      cfgs.push_back(config(f, f, 32, 64, fl, 2, 32, 500));
  }
  for (auto g : {Int8Granularity::kTensor, Int8Granularity::kToken, Int8Granularity::kHead,
                 Int8Granularity::kGroup}) {
    cfgs.push_back(config(Format::kInt8, Format::kInt8, 8, 0, KeyFlush::kBatch, 2, 32, 500, g));
  }
  cfgs.push_back(config(Format::kKivi4, Format::kKivi2, 32, 0, KeyFlush::kBatch, 2, 32, 500));
  cfgs.push_back(config(Format::kInt8, Format::kKivi4, 16, 32, KeyFlush::kGroup, 2, 32, 500));
  cfgs.back().param_type = ParamType::kF32;
  for (const auto& c : cfgs) {
    kv::KvCache cache(c);
    EXPECT_EQ(cache.bytes_reserved(), kv::expected_bytes_reserved(c));
    std::vector<float> x(2 * 32, 0.5f);
    for (int n = 1; n <= 500; ++n) {
      for (int l = 0; l < c.n_layers; ++l) cache.append(l, x.data(), x.data());
      ASSERT_EQ(cache.bytes_used(), kv::expected_bytes_used(c, n))
          << kv::describe(c.k) << " n " << n;
    }
    // Past the residual, used bytes grow by exactly the formula's bytes per token
    // (per whole key group for per-channel keys).
    const double bpt = kv::layer_bytes_per_token(c) * c.n_layers;
    const int step = 64;
    const double grown = static_cast<double>(kv::expected_bytes_used(c, 500)) -
                         static_cast<double>(kv::expected_bytes_used(c, 500 - step));
    EXPECT_NEAR(grown, bpt * step, 1e-9 * bpt * step) << kv::describe(c.k);
  }
}

// Published shapes, computed by hand (bytes per token over all layers).
TEST(KvCache, BytesPerTokenForLlamaShapes) {
  auto bpt = [](int H, Format f, Int8Granularity g = Int8Granularity::kHead) {
    CacheConfig c = config(f, f, 32, 128, KeyFlush::kBatch, H, 128, 4096, g);
    c.n_layers = 32;
    return kv::layer_bytes_per_token(c) * 32;
  };
  // Llama-2-7B: 32 layers x 32 KV heads x 128.
  EXPECT_EQ(bpt(32, Format::kF32), 1048576.0);  // 32*32*128*2*4
  EXPECT_EQ(bpt(32, Format::kF16), 524288.0);
  EXPECT_EQ(bpt(32, Format::kInt8), 32.0 * 32 * 2 * (128 + 2));  // codes + one f16 scale per head
  EXPECT_EQ(bpt(32, Format::kKivi4),
            32.0 * 32 * 2 * (64 + 16));  // K: 64 + 2*2*128/32; V: 64 + 2*2*4
  EXPECT_EQ(bpt(32, Format::kKivi2), 32.0 * 32 * 2 * (32 + 16));
  // Llama-3-8B: 8 KV heads.
  EXPECT_EQ(bpt(8, Format::kF16), 131072.0);
  EXPECT_EQ(bpt(8, Format::kKivi2), 32.0 * 8 * 2 * (32 + 16));
  EXPECT_EQ(bpt(8, Format::kInt8, Int8Granularity::kToken), 32.0 * (8 * 128 + 2) * 2);
}

TEST(KvCache, BadParametersNameTheParameter) {
  auto err = [](CacheConfig c) -> std::string {
    try {
      c.validate();
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(err(config(Format::kKivi2, Format::kKivi2, 32, 48, KeyFlush::kBatch))
                .find("--residual = 48 must be a multiple of --group-size = 32"),
            std::string::npos);
  EXPECT_NE(err(config(Format::kKivi2, Format::kKivi2, 512, 0, KeyFlush::kBatch, 2, 16, 300))
                .find("--group-size = 512 is larger than the context (300 tokens)"),
            std::string::npos);
  EXPECT_EQ(err(config(Format::kF16, Format::kF16, 32, 48, KeyFlush::kBatch)),
            "");  // R is unused without KIVI
  try {
    kv::parse_format("q3");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown KV cache format 'q3'"), std::string::npos);
  }
  try {
    kv::parse_format("kivi3");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not in {2, 4, 8}"), std::string::npos);
  }
  EXPECT_EQ(kv::parse_format("kivi2"), Format::kKivi2);
  EXPECT_THROW(kv::parse_granularity("channel"), Error);
  EXPECT_THROW(kv::parse_key_flush("lazy"), Error);
  EXPECT_THROW(kv::parse_param_type("bf16"), Error);
}

TEST(KvCache, FullCacheIsAnError) {
  kv::KvCache cache(config(Format::kF16, Format::kF16, 8, 0, KeyFlush::kBatch, 1, 8, 4));
  std::vector<float> x(8, 1.0f);
  for (int i = 0; i < 4; ++i) cache.append(0, x.data(), x.data());
  EXPECT_THROW(cache.append(0, x.data(), x.data()), Error);
}

}  // namespace
}  // namespace kivi

namespace kivi {
namespace {

// The message of the kivi::Error f throws ("" if none).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}
// Cross-layer sharing: borrowers store nothing, read their owner's cache, and refuse
// appends; the memory formulas count only owners; bad maps name the problem.
TEST(KvCache, CrossLayerSharing) {
  CacheConfig c = config(Format::kInt8, Format::kKivi2, 32, 32, KeyFlush::kBatch);
  c.n_layers = 5;
  c.share_every = 2;
  EXPECT_EQ(kv::layer_owners(c), (std::vector<int>{0, 0, 2, 2, 4}));
  EXPECT_EQ(kv::stored_layers(c), 3);
  CacheConfig none = c;
  none.share_every = 1;
  kv::KvCache cache(c), plain(none);
  EXPECT_EQ(cache.bytes_reserved(), kv::expected_bytes_reserved(c));
  EXPECT_EQ(cache.bytes_reserved() * 5, plain.bytes_reserved() * 3);
  Rng r(5);
  std::vector<float> k(2 * 16), v(k.size());
  for (int t = 0; t < 100; ++t) {
    for (auto& x : k) x = r.normal();
    for (auto& x : v) x = r.normal();
    for (int l : {0, 2, 4}) {
      if (t == 0) cache.calibrate(l, k.data(), v.data(), 1);
      cache.append(l, k.data(), v.data());
    }
  }
  EXPECT_EQ(cache.n_tokens(1), 100);
  EXPECT_TRUE(cache.borrows(3));
  EXPECT_EQ(cache.owner(3), 2);
  EXPECT_EQ(cache.bytes_used(3), 0u);
  EXPECT_EQ(cache.bytes_used(), kv::expected_bytes_used(c, 100));
  const auto v3 = cache.view(3), v2 = cache.view(2);
  EXPECT_EQ(v3.k.codes, v2.k.codes);
  EXPECT_EQ(v3.v.ring, v2.v.ring);
  EXPECT_EQ(v3.n_tokens, 100);
  EXPECT_NE(
      error_of([&] { cache.append(3, k.data(), v.data()); }).find("layer 3 reads layer 2's cache"),
      std::string::npos);
  // Maps: explicit pairs on top of the groups, and the errors.
  c.share_every = 1;
  c.share_map = {{3, 1}, {4, 1}};
  EXPECT_EQ(kv::layer_owners(c), (std::vector<int>{0, 1, 2, 1, 1}));
  c.share_map = {{1, 3}};
  EXPECT_NE(error_of([&] { kv::layer_owners(c); }).find("the owner must be an earlier layer"),
            std::string::npos);
  c.share_map = {{7, 1}};
  EXPECT_NE(error_of([&] { kv::layer_owners(c); }).find("layers are 0 to 4"), std::string::npos);
  c.share_map = {{2, 1}, {1, 0}};
  EXPECT_NE(error_of([&] { kv::layer_owners(c); }).find("which itself reads layer 0"),
            std::string::npos);
}

}  // namespace
}  // namespace kivi

namespace kivi {
namespace {

// drop(): later tokens move down without being copied; each keeps its stored form
// (dequantized rows equal before and after), the residual ring is renumbered (its rows
// are the appended floats), and appends after a drop land where reads find them.
TEST(KvCache, DropRenumbersWithoutCopying) {
  for (Format f : {Format::kF32, Format::kF16, Format::kInt8, Format::kKivi2, Format::kKivi4}) {
    for (int R : {0, 32, 64}) {
      CacheConfig c = config(f, f, 16, R, KeyFlush::kBatch, 2, 16, 256);
      c.block_tokens = 32;
      kv::KvCache cache(c);
      Rng r(static_cast<uint64_t>(f) * 100 + R);
      std::vector<std::vector<float>> ks, vs;  // every appended token
      auto append = [&](int n) {
        for (int i = 0; i < n; ++i) {
          std::vector<float> k(32), v(32);
          for (auto& x : k) x = r.normal();
          for (auto& x : v) x = r.normal();
          if (cache.n_tokens(0) == 0) cache.calibrate(0, k.data(), v.data(), 1);
          cache.append(0, k.data(), v.data());
          ks.push_back(k);
          vs.push_back(v);
        }
      };
      auto rows = [&](int layer) {  // dequantized K and V rows of every token, both heads
        std::vector<float> out;
        const auto view = cache.view(layer);
        std::vector<float> x(16);
        for (int t = 0; t < view.n_tokens; ++t) {
          for (int h = 0; h < 2; ++h) {
            attn::dequantize_key(view.k, t, h, x.data());
            out.insert(out.end(), x.begin(), x.end());
            attn::dequantize_value(view.v, t, h, x.data());
            out.insert(out.end(), x.begin(), x.end());
          }
        }
        return out;
      };
      append(200);
      const std::string what = std::string(kv::format_name(f)) + " R=" + std::to_string(R);
      ASSERT_GE(cache.droppable(0), 96) << what;
      const auto before = rows(0);
      cache.drop(0, 32, 64);
      EXPECT_EQ(cache.n_tokens(0), 136) << what;
      const auto after = rows(0);
      const size_t per_token = 4 * 16;
      ASSERT_EQ(after.size(), before.size() - 64 * per_token) << what;
      EXPECT_TRUE(std::equal(after.begin(), after.begin() + 32 * per_token, before.begin()))
          << what;
      EXPECT_TRUE(
          std::equal(after.begin() + 32 * per_token, after.end(), before.begin() + 96 * per_token))
          << what;
      // More tokens after the drop, including ring wrap-arounds; then residual rows are
      // the appended floats, exactly.
      ks.erase(ks.begin() + 32, ks.begin() + 96);
      vs.erase(vs.begin() + 32, vs.begin() + 96);
      append(100);
      const auto view = cache.view(0);
      std::vector<float> x(16);
      for (int t = std::min(view.k.n_stored, view.v.n_stored); t < view.n_tokens; ++t) {
        for (int h = 0; h < 2; ++h) {
          if (t >= view.k.n_stored) {
            attn::dequantize_key(view.k, t, h, x.data());
            EXPECT_TRUE(std::equal(x.begin(), x.end(), ks[t].begin() + 16 * h))
                << what << " key " << t;
          }
          if (t >= view.v.n_stored) {
            attn::dequantize_value(view.v, t, h, x.data());
            EXPECT_TRUE(std::equal(x.begin(), x.end(), vs[t].begin() + 16 * h))
                << what << " value " << t;
          }
        }
      }
      if (f == Format::kF32) {  // every stored row is the appended one, in the recycled blocks too
        for (int t = 0; t < view.n_tokens; ++t) {
          attn::dequantize_key(view.k, t, 1, x.data());
          EXPECT_TRUE(std::equal(x.begin(), x.end(), ks[t].begin() + 16)) << what << " key " << t;
        }
      }
      EXPECT_EQ(cache.n_tokens(0), 236) << what;
      EXPECT_NE(error_of([&] { cache.drop(0, 16, 32); }).find("whole blocks of 32 tokens"),
                std::string::npos);
    }
  }
}

}  // namespace
}  // namespace kivi
