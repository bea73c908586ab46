// Per-layer precision (kv/layer_formats.h, CacheConfig::layer_formats): the map's syntax and
// refusals, and a cache whose layers differ in format storing, per layer, exactly what a
// cache of that layer's formats stores, with memory accounted layer by layer.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "attn/attention.h"
#include "core/error.h"
#include "core/rng.h"
#include "kv/kv_cache.h"
#include "kv/layer_formats.h"

namespace kivi {
namespace {

using kv::CacheConfig;
using kv::Format;
using kv::Int8Granularity;

std::string error_of(const std::string& spec, int layers) {
  try {
    kv::parse_layer_formats(spec, layers, Int8Granularity::kHead);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(LayerFormats, MapsLayersAndStreams) {
  auto f = kv::parse_layer_formats("0,1,4:kivi4; *:kivi2", 5, Int8Granularity::kHead);
  ASSERT_EQ(f.size(), 5u);
  for (int l : {0, 1, 4}) EXPECT_EQ(f[l].k.format, Format::kKivi4) << l;
  for (int l : {2, 3}) EXPECT_EQ(f[l].v.format, Format::kKivi2) << l;
  f = kv::parse_layer_formats("0-1:kivi4/tq3;2-4:int8", 5, Int8Granularity::kGroup);
  EXPECT_EQ(f[1].k.format, Format::kKivi4);
  EXPECT_EQ(f[1].v.format, Format::kTq3);
  EXPECT_EQ(f[3].k.format, Format::kInt8);
  EXPECT_EQ(f[3].k.granularity, Int8Granularity::kGroup);

  CacheConfig c;
  c.n_layers = 5;
  c.layer_formats = kv::parse_layer_formats("0-1:kivi4/tq3;*:kivi2", 5, Int8Granularity::kHead);
  EXPECT_EQ(kv::describe_layer_formats(c), "layers 0-1 K kivi4 / V tq3, 2-4 kivi2");
}

TEST(LayerFormats, BadMapsNameTheProblem) {
  const struct {
    const char* spec;
    const char* says;
  } cases[] = {
      {"", "empty map"},
      {"0,1:kivi4", "layer 2 has no format"},
      {"7:kivi4;*:kivi2", "names layer 7, but the model has 4 layers"},
      {"0:kivi4;0-1:kivi2;*:f16", "layer 0 is named by two rules"},
      {"*:kivi4;*:kivi2", "'*' appears in two rules"},
      {"x:kivi4", "'x' in rule 'x:kivi4' is not a layer"},
      {"2-1:kivi4;*:f16", "'2-1'"},
      {"kivi4", "is not LAYERS:FORMAT"},
      {"0:kivi4:f16;*:f16", "is not LAYERS:FORMAT"},
      {"*:kivi3", "KIVI bits '3'"},
      {"*:q4/f16", "unknown KV cache format 'q4'"},
  };
  for (const auto& t : cases) {
    const std::string e = error_of(t.spec, 4);
    EXPECT_NE(e.find("--kv-cache-layers"), std::string::npos) << t.spec << ": " << e;
    EXPECT_NE(e.find(t.says), std::string::npos) << t.spec << ": " << e;
  }
}

// Three layers in three pairs of formats against three uniform caches, token by token: every
// layer's keys and values read back (stored and residual) as the uniform cache's of its
// formats, the memory is the sum of the layers', and a cut back is allowed where every
// layer's would be.
TEST(LayerFormats, EachLayerStoresWhatItsFormatsStore) {
  const int H = 2, D = 32, ctx = 200;
  CacheConfig c;
  c.n_layers = 3;
  c.n_kv_heads = H;
  c.head_dim = D;
  c.ctx = ctx;
  c.group_size = 8;
  c.residual = 16;
  c.ring_slack = 8;
  c.layer_formats =
      kv::parse_layer_formats("0:kivi4/kivi2;1:tq3/tq2;2:f16/int8", 3, Int8Granularity::kHead);
  kv::KvCache mixed(c);
  std::vector<std::unique_ptr<kv::KvCache>> uniform;
  for (int l = 0; l < 3; ++l) uniform.push_back(std::make_unique<kv::KvCache>(c.at_layer(l)));
  EXPECT_EQ(mixed.bytes_reserved(), kv::expected_bytes_reserved(c));
  uint64_t sum = 0;
  for (int l = 0; l < 3; ++l) {
    CacheConfig one = c.at_layer(l);
    one.n_layers = 1;
    sum += kv::expected_bytes_reserved(one);
  }
  EXPECT_EQ(kv::expected_bytes_reserved(c), sum);

  Rng r(3);
  std::vector<float> k(H * D), v(H * D), a(D), b(D);
  for (int n = 1; n <= 150; ++n) {
    for (int l = 0; l < 3; ++l) {
      for (auto& x : k) x = r.normal();
      for (auto& x : v) x = r.normal();
      mixed.append(l, k.data(), v.data());
      for (auto& u : uniform) u->append(l, k.data(), v.data());
    }
    ASSERT_EQ(mixed.bytes_used(), kv::expected_bytes_used(c, n)) << n;
    if (n % 37 != 0 && n != 150) continue;
    for (int l = 0; l < 3; ++l) {
      const kv::LayerView mv = mixed.view(l), uv = uniform[l]->view(l);
      ASSERT_EQ(mv.k.fmt, uv.k.fmt);
      ASSERT_EQ(mv.v.n_stored, uv.v.n_stored) << "layer " << l << " n " << n;
      for (int t = 0; t < n; ++t) {
        for (int h = 0; h < H; ++h) {
          attn::dequantize_key(mv.k, t, h, a.data());
          attn::dequantize_key(uv.k, t, h, b.data());
          ASSERT_EQ(a, b) << "key: layer " << l << " token " << t << " n " << n;
          attn::dequantize_value(mv.v, t, h, a.data());
          attn::dequantize_value(uv.v, t, h, b.data());
          ASSERT_EQ(a, b) << "value: layer " << l << " token " << t << " n " << n;
        }
      }
    }
    for (int cut = n - 12; cut <= n; ++cut) {
      bool all = true;
      for (auto& u : uniform) all = all && u->can_truncate(cut);
      EXPECT_EQ(mixed.can_truncate(cut), all) << "cut " << cut << " n " << n;
    }
  }
}

TEST(LayerFormats, ConfigurationsCheckEveryLayer) {
  CacheConfig c;
  c.n_layers = 2;
  c.n_kv_heads = 1;
  c.head_dim = 12;  // kivi4 packs 2 per byte, kivi2 4: both fit; tq fits
  c.ctx = 64;
  c.group_size = 4;
  c.residual = 8;
  c.layer_formats = kv::parse_layer_formats("0:kivi4;1:tq3", 2, Int8Granularity::kHead);
  c.validate();
  c.layer_formats.pop_back();
  try {
    c.validate();
    ADD_FAILURE() << "a map of 1 layer for 2 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("1 layers' formats for a model of 2 layers"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace kivi
