// The tq formats (kv/tq.h): names and sizes, the codes against a reference written from the
// definition (the explicit rotation matrix in double and a brute-force nearest centroid), the
// distortion on random unit vectors against TurboQuant's reported numbers, the unbiased inner
// products the stored scale gives, and the cache's streaming rules. Attention over tq caches
// is checked with every other format in test_attn, test_prefill, test_sparse and test_kv_file.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "attn/attention.h"
#include "attn/task.h"
#include "core/cpu.h"
#include "core/error.h"
#include "core/f16.h"
#include "core/rng.h"
#include "kv/kv_cache.h"
#include "kv/lloyd_max.h"
#include "kv/tq.h"
#include "test_util.h"

namespace kivi {
namespace {

using kv::Format;

const Format kTq[] = {Format::kTq2, Format::kTq25, Format::kTq3, Format::kTq35, Format::kTq4};

TEST(TqFormat, NamesSizesAndRefusals) {
  for (const char* n : {"tq2", "tq2.5", "tq3", "tq3.5", "tq4"}) {
    const Format f = kv::parse_format(n);
    EXPECT_TRUE(kv::is_tq(f));
    EXPECT_TRUE(kv::uses_ring(f));
    EXPECT_EQ(std::string(kv::format_name(f)), n);
  }
  // Bits of codes per row: d b, plus floor(d / 4) for the split widths, in whole bytes.
  EXPECT_EQ(kv::code_row_bytes(Format::kTq2, 128), 32u);
  EXPECT_EQ(kv::code_row_bytes(Format::kTq25, 128), 36u);
  EXPECT_EQ(kv::code_row_bytes(Format::kTq3, 128), 48u);
  EXPECT_EQ(kv::code_row_bytes(Format::kTq35, 128), 52u);
  EXPECT_EQ(kv::code_row_bytes(Format::kTq4, 128), 64u);
  EXPECT_EQ(kv::code_row_bytes(Format::kTq25, 8), 3u);  // 6 x 2 + 2 x 3 = 18 bits
  EXPECT_EQ(kv::code_row_bytes(Format::kTq3, 12), 5u);  // 36 bits
  for (const char* bad : {"tq5", "tq2.7", "tq1", "tq"}) {
    try {
      kv::parse_format(bad, "--kv-cache-k");
      ADD_FAILURE() << bad << " accepted";
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("--kv-cache-k"), std::string::npos) << m;
      EXPECT_NE(m.find(bad), std::string::npos) << m;
    }
  }
  // Bits per element with f16 scales at d = 128: codes plus 16 bits per row.
  kv::CacheConfig c;
  c.n_layers = 1;
  c.n_kv_heads = 2;
  c.head_dim = 128;
  c.ctx = 64;
  c.k.format = Format::kTq25;
  c.v.format = Format::kTq3;
  EXPECT_DOUBLE_EQ(kv::bits_per_element(c, kv::Stream::kKey), 2.25 + 0.125);
  EXPECT_DOUBLE_EQ(kv::bits_per_element(c, kv::Stream::kValue), 3.125);
  c.head_dim = 2;
  EXPECT_THROW(c.validate(), Error);
}

// A row with a few outlier coordinates, as keys have.
std::vector<float> random_row(Rng& r, int d) {
  std::vector<float> x(d);
  for (int i = 0; i < d; ++i) x[i] = r.normal() * (i % 13 == 1 ? 8.0f : 1.0f);
  return x;
}

// The codes and the scale from the definition, in double: y = R x with R's explicit matrix,
// code i = the centroid nearest to y_i / |y| (brute force), scale = |x|^2 / <y, c>.
struct Reference {
  std::vector<int> codes;
  std::vector<double> y;
  double scale = 0, margin = 1;  // margin: the smallest distance of a y_i / |y| to a threshold
};
Reference reference(const kv::TqCodec& t, const kv::HadamardRotation& rot,
                    const std::vector<float>& x) {
  const int d = t.dim();
  const std::vector<double> R = rot.matrix();
  Reference ref;
  ref.y.assign(d, 0.0);
  double n2 = 0;
  for (int i = 0; i < d; ++i) {
    for (int j = 0; j < d; ++j) ref.y[i] += R[static_cast<size_t>(i) * d + j] * x[j];
    n2 += ref.y[i] * ref.y[i];
  }
  double dot = 0;
  for (int i = 0; i < d; ++i) {
    const kv::LloydMaxCodebook& cb = kv::lloyd_max_codebook(d, t.bits(i));
    const double u = ref.y[i] / std::sqrt(n2);
    int best = 0;
    for (int k = 1; k < static_cast<int>(cb.centroids.size()); ++k) {
      if (std::fabs(u - cb.centroids[k]) < std::fabs(u - cb.centroids[best])) best = k;
    }
    for (double th : cb.thresholds) ref.margin = std::min(ref.margin, std::fabs(u - th));
    ref.codes.push_back(best);
    dot += ref.y[i] * cb.centroids[best];
  }
  ref.scale = n2 / dot;
  return ref;
}

TEST(TqCodec, CodesAndScalesFollowTheDefinition) {
  Rng r(7);
  int checked = 0;
  for (Format f : kTq) {
    for (int d : {8, 12, 64, 96, 128}) {
      const kv::TqCodec t(f, d);
      for (int trial = 0; trial < 20; ++trial) {
        const kv::HadamardRotation rot(d, 1000 + trial);
        const std::vector<float> x = random_row(r, d);
        const Reference ref = reference(t, rot, x);
        std::vector<uint8_t> codes(t.row_bytes() + 1, 0xAB);
        std::vector<float> tmp(d), back(d), rotated(d);
        const float s = t.encode(x.data(), rot, codes.data(), tmp.data());
        EXPECT_EQ(codes[t.row_bytes()], 0xAB) << "wrote past the row";
        SCOPED_TRACE(testing::Message() << kv::format_name(f) << " d=" << d << " trial " << trial);
        if (ref.margin > 1e-5) {  // (float rounding may pick either side of a threshold)
          for (int i = 0; i < d; ++i) ASSERT_EQ(t.code(codes.data(), i), ref.codes[i]) << i;
          EXPECT_NEAR(s, ref.scale, 1e-5 * ref.scale);
          ++checked;
        }
        // The reconstruction: the rotated row, then R^T of it.
        t.decode_rotated(codes.data(), s, rotated.data());
        t.decode(codes.data(), s, rot, back.data());
        const std::vector<double> R = rot.matrix();
        double norm = 0;
        for (float v : x) norm += static_cast<double>(v) * v;
        for (int i = 0; i < d; ++i) {
          EXPECT_FLOAT_EQ(rotated[i], s * t.centroids(i)[t.code(codes.data(), i)]);
          double want = 0;
          for (int j = 0; j < d; ++j) want += R[static_cast<size_t>(j) * d + i] * rotated[j];
          EXPECT_NEAR(back[i], want, 1e-5 * std::sqrt(norm));
        }
      }
    }
  }
  EXPECT_GT(checked, 400);
  // A zero row: scale 0, zero codes, a zero reconstruction.
  const kv::TqCodec t(Format::kTq3, 64);
  const kv::HadamardRotation rot(64, 1);
  std::vector<float> zero(64, 0.0f), tmp(64), back(64, 1.0f);
  std::vector<uint8_t> codes(t.row_bytes(), 0xFF);
  EXPECT_EQ(t.encode(zero.data(), rot, codes.data(), tmp.data()), 0.0f);
  for (uint8_t b : codes) EXPECT_EQ(b, 0);
  t.decode(codes.data(), 0.0f, rot, back.data());
  for (float v : back) EXPECT_EQ(v, 0.0f);
}

// The attention's SIMD decoder (attn/tq-inl.h) against the codec's scalar one, bit for bit, on
// every target: every format, head sizes whose runs start on a byte or not and end inside a
// chunk or not, rows apart (stride > row) with the last row ending at the buffer's end (the
// decoder must not read past it: AddressSanitizer checks).
TEST(TqCodec, SimdDecoderEqualsTheCodecOnEveryTarget) {
  Rng r(11);
  for (const auto& target : test::simd_targets()) {
    cpu::force_target_bits(target.bits);
    for (Format f : kTq) {
      for (int d : {4, 8, 12, 16, 36, 64, 72, 96, 128, 256}) {
        const kv::TqCodec t(f, d);
        const kv::HadamardRotation rot(d, 5);
        const int n = 9;
        const size_t stride = t.row_bytes() + 3;
        std::vector<uint8_t> rows((n - 1) * stride + t.row_bytes());
        std::vector<float> scales(n), tmp(d), want(static_cast<size_t>(n) * d), got(want.size());
        for (int i = 0; i < n; ++i) {
          const std::vector<float> x = random_row(r, d);
          scales[i] = t.encode(x.data(), rot, rows.data() + i * stride, tmp.data());
          t.decode_rotated(rows.data() + i * stride, scales[i], want.data() + i * d);
        }
        attn::decode_tq_rows(t, rows.data(), stride, n, scales.data(), got.data());
        for (size_t i = 0; i < want.size(); ++i)
          ASSERT_EQ(got[i], want[i]) << target.name << " " << kv::format_name(f) << " d=" << d
                                     << " row " << i / d << " coordinate " << i % d;
      }
    }
  }
  cpu::reset_target();
}

// Random unit vectors, coded: the mean squared error of the reconstruction scaled by the
// norm (the paper's) against the Lloyd-Max distortion TurboQuant reports, and that of the
// format's scale (12% larger at 2 bits, within 3% at 3 and 4); the inner product with a correlated
// unit vector y = 0.8 x + 0.6 z is unbiased with the format's scale and shrunk by about (1 - mse)
// with the norm.
TEST(TqCodec, DistortionAndInnerProductsOnRandomUnitVectors) {
  struct Want {
    int d;
    Format f;
    double mse;  // E|u - Q(u)|^2 of the codebooks (TurboQuant, Theorem 1, and kv/lloyd_max.h)
  };
  const Want wants[] = {
      {128, Format::kTq2, 0.1160},
      {128, Format::kTq3, 0.03397},
      {128, Format::kTq4, 0.009315},
      {64, Format::kTq2, 0.115},
      {64, Format::kTq3, 0.033},
      {64, Format::kTq4, 0.0091},
      // The split widths: a quarter of the coordinates at the next codebook's error.
      {128, Format::kTq25, 0.25 * 0.03397 + 0.75 * 0.1160},
      {128, Format::kTq35, 0.25 * 0.009315 + 0.75 * 0.03397},
  };
  const int N = 3000;
  for (const Want& w : wants) {
    const kv::TqCodec t(w.f, w.d);
    Rng r(w.d * 31 + static_cast<int>(w.f));
    std::vector<float> x(w.d), y(w.d), tmp(w.d), back(w.d);
    std::vector<uint8_t> codes(t.row_bytes());
    double mse_norm = 0, mse_fmt = 0, err_fmt = 0, err2_fmt = 0, err_norm = 0, err2_norm = 0;
    for (int n = 0; n < N; ++n) {
      const kv::HadamardRotation rot(w.d, 77 + n);  // a fresh rotation per vector
      double nx = 0, nz = 0;
      std::vector<double> z(w.d);
      for (int i = 0; i < w.d; ++i) {
        x[i] = r.normal();
        z[i] = r.normal();
        nx += static_cast<double>(x[i]) * x[i];
      }
      for (int i = 0; i < w.d; ++i) x[i] = static_cast<float>(x[i] / std::sqrt(nx));
      double zx = 0;
      for (int i = 0; i < w.d; ++i) zx += z[i] * x[i];
      for (int i = 0; i < w.d; ++i) z[i] -= zx * x[i];  // z orthogonal to x, then unit
      for (int i = 0; i < w.d; ++i) nz += z[i] * z[i];
      for (int i = 0; i < w.d; ++i)
        y[i] = static_cast<float>(0.8 * x[i] + 0.6 * z[i] / std::sqrt(nz));
      const float s = t.encode(x.data(), rot, codes.data(), tmp.data());
      t.decode(codes.data(), s, rot, back.data());
      double e_fmt = 0, yx = 0, yb = 0;
      for (int i = 0; i < w.d; ++i) {
        e_fmt += (back[i] - static_cast<double>(x[i])) * (back[i] - x[i]);
        yx += static_cast<double>(y[i]) * x[i];
        yb += static_cast<double>(y[i]) * back[i];
      }
      // The norm's reconstruction is the same direction scaled by |x| / s = 1 / s.
      double e_norm = 0;
      for (int i = 0; i < w.d; ++i) {
        const double b = back[i] / s;
        e_norm += (b - x[i]) * (b - x[i]);
      }
      mse_fmt += e_fmt / N;
      mse_norm += e_norm / N;
      const double ef = yb - yx, en = yb / s - yx;
      err_fmt += ef / N;
      err2_fmt += ef * ef / N;
      err_norm += en / N;
      err2_norm += en * en / N;
    }
    const double se_fmt = std::sqrt((err2_fmt - err_fmt * err_fmt) / N);
    const double se_norm = std::sqrt((err2_norm - err_norm * err_norm) / N);
    std::printf(
        "d=%3d %-5s mse: %.5f with the norm (codebook %.5f), %.5f with the stored scale; inner "
        "product bias %+.5f +- %.5f (stored scale), %+.5f +- %.5f (norm)\n",
        w.d, kv::format_name(w.f), mse_norm, w.mse, mse_fmt, err_fmt, se_fmt, err_norm, se_norm);
    SCOPED_TRACE(testing::Message() << kv::format_name(w.f) << " d=" << w.d);
    EXPECT_NEAR(mse_norm, w.mse, 0.04 * w.mse);
    EXPECT_LT(mse_fmt, 1.2 * mse_norm);  // 2 bits: +12%; 3 and 4 bits: within 3% either way
    EXPECT_LT(std::fabs(err_fmt), 3.5 * se_fmt);
    EXPECT_LT(err_norm, -5 * se_norm);  // shrunk: about -0.8 mse
  }
}

// The cache stores what the codec writes for each token as it leaves the residual window
// (keys and values alike, token by token), with each (layer, head)'s own rotation and the
// scale rounded to the parameter type; residual tokens read back exactly.
TEST(TqCache, StreamingStoresTheCodecsRows) {
  for (int R : {0, 5, 32}) {
    kv::CacheConfig c;
    c.n_layers = 2;
    c.n_kv_heads = 2;
    c.head_dim = 16;
    c.ctx = 200;
    c.k.format = Format::kTq3;
    c.v.format = Format::kTq25;
    c.residual = R;
    kv::KvCache cache(c);
    Rng r(R + 1);
    const int n = 150, HD = c.n_kv_heads * c.head_dim;
    std::vector<std::vector<float>> ks, vs;
    for (int t = 0; t < n; ++t) {
      ks.push_back(random_row(r, HD));
      vs.push_back(random_row(r, HD));
      for (int l = 0; l < 2; ++l) cache.append(l, ks.back().data(), vs.back().data());
    }
    EXPECT_EQ(cache.bytes_used(), kv::expected_bytes_used(c, n));
    EXPECT_EQ(cache.bytes_reserved(), kv::expected_bytes_reserved(c));
    for (int l = 0; l < 2; ++l) {
      const kv::LayerView v = cache.view(l);
      EXPECT_EQ(v.k.n_stored, std::max(0, n - R));
      EXPECT_EQ(v.v.n_stored, std::max(0, n - R));
      for (int t = 0; t < n; ++t) {
        for (int h = 0; h < c.n_kv_heads; ++h) {
          const kv::HadamardRotation rot(c.head_dim, kv::rotation_seed(c.rotation_seed, l, h));
          for (int s = 0; s < 2; ++s) {
            const kv::TqCodec codec(s ? c.v.format : c.k.format, c.head_dim);
            const float* x = (s ? vs : ks)[t].data() + h * c.head_dim;
            std::vector<float> got(c.head_dim), want(x, x + c.head_dim), tmp(c.head_dim);
            if (t < n - R) {
              std::vector<uint8_t> codes(codec.row_bytes());
              const float sc =
                  f16_to_f32(f32_to_f16(codec.encode(x, rot, codes.data(), tmp.data())));
              codec.decode(codes.data(), sc, rot, want.data());
            }
            if (s) {
              attn::dequantize_value(v.v, t, h, got.data());
            } else {
              attn::dequantize_key(v.k, t, h, got.data());
            }
            ASSERT_EQ(got, want) << "layer " << l << " token " << t << " head " << h
                                 << (s ? " value" : " key") << " R=" << R;
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace kivi
