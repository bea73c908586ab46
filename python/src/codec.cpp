// kivi.quantize_keys / dequantize_keys / quantize_values / dequantize_values: the KIVI
// codecs of kv/codec.h on numpy arrays [..., T, D] (for example [B, H, T, D]),
// returning exactly the bytes the C++ cache stores.
//   keys:   codes [..., T/G, G*W] u8 (each group's rows interleaved, kv/codec.h), scales and
//           zeros [..., T/G, D]
//   values: codes [..., T, W] u8 (plain rows; the cache interleaves them by quads of tokens),
//           scales and zeros [..., T, D/Gc] with Gc = min(G, D), the cache's channel group
// W = D * bits / 8. Parameters are float16 or float32 arrays (scale_dtype).
// kivi.quantize_tq / dequantize_tq: the rotated vector formats of kv/tq.h on [..., H, T, D],
// head h rotated by the (layer, h) rotation of the cache's base seed: codes [..., H, T, row
// bytes] and scales [..., H, T], the bytes a cache of that layer stores for those rows.
#include "kv/codec.h"
#include "kv/rotation.h"
#include "kv/tq.h"

#include <algorithm>
#include <cstring>

#include "bindings.h"
#include "core/error.h"

namespace kivi::py {

namespace {

// Leading dimensions [..] of an array whose last `tail` dimensions are given, and their product.
struct Lead {
  std::vector<int64_t> dims;
  int64_t count = 1;
};

Lead leading(const pb::array& a, int tail, const char* what) {
  if (a.ndim() < tail) {
    fail("%s: expected at least %d dimensions ([..., %s]), got %d", what, tail,
         tail == 2   ? "T, D"
         : tail == 3 ? "H, T, D"
                     : "?",
         static_cast<int>(a.ndim()));
  }
  Lead l;
  for (int i = 0; i < a.ndim() - tail; ++i) {
    l.dims.push_back(a.shape(i));
    l.count *= a.shape(i);
  }
  return l;
}

std::vector<int64_t> with_tail(const Lead& l, std::initializer_list<int64_t> tail) {
  std::vector<int64_t> s = l.dims;
  s.insert(s.end(), tail);
  return s;
}

pb::array contiguous_codes(const pb::array& a, const char* what) {
  if (!a.dtype().is(pb::dtype::of<uint8_t>())) {
    fail("%s: expected uint8 codes, got dtype %s", what, std::string(pb::str(a.dtype())).c_str());
  }
  return pb::array::ensure(a, pb::array::c_style);
}

// Scales and zeros: same shape, same float16/float32 dtype, C-contiguous.
kv::ParamType check_params(pb::array& scales, pb::array& zeros, const char* what) {
  const kv::ParamType pt = param_type_of(scales, what);
  if (param_type_of(zeros, what) != pt) fail("%s: scales and zeros have different dtypes", what);
  if (scales.ndim() != zeros.ndim()) fail("%s: scales and zeros have different shapes", what);
  for (int i = 0; i < scales.ndim(); ++i) {
    if (scales.shape(i) != zeros.shape(i)) fail("%s: scales and zeros have different shapes", what);
  }
  scales = pb::array::ensure(scales, pb::array::c_style);
  zeros = pb::array::ensure(zeros, pb::array::c_style);
  return pt;
}

void check_lead(const Lead& a, const Lead& b, const char* what) {
  if (a.dims != b.dims)
    fail("%s: the codes and the parameters have different leading dimensions", what);
}

pb::tuple quantize_keys(F32Array k, int bits, int group_size, const std::string& scale_dtype) {
  const char* what = "quantize_keys";
  kivi_bits(bits, what);
  const kv::ParamType pt = param_type_of(scale_dtype);
  const Lead l = leading(k, 2, what);
  const int T = to_int(k.shape(k.ndim() - 2), "quantize_keys: tokens");
  const int D = to_int(k.shape(k.ndim() - 1), "quantize_keys: head_dim");
  const int S = to_int(l.count, "quantize_keys: slices");
  if (group_size < 1) fail("quantize_keys: group_size = %d, expected >= 1", group_size);
  if (T % group_size != 0)
    fail("quantize_keys: %d tokens is not a multiple of the group size %d", T, group_size);
  if (D * bits % 8 != 0)
    fail("quantize_keys: head_dim %d is not a multiple of %d for %d-bit packing", D, 8 / bits,
         bits);
  const int NG = T / group_size;
  const int64_t W = static_cast<int64_t>(D) * bits / 8;
  pb::array codes = new_array(pb::dtype::of<uint8_t>(), with_tail(l, {NG, group_size * W}));
  pb::array scales = new_array(param_dtype(pt), with_tail(l, {NG, D}));
  pb::array zeros = new_array(param_dtype(pt), with_tail(l, {NG, D}));
  {
    pb::gil_scoped_release nogil;
    kv::quantize_keys(k.data(), S, T, D, group_size, bits, pt,
                      static_cast<uint8_t*>(codes.mutable_data()), scales.mutable_data(),
                      zeros.mutable_data());
  }
  return pb::make_tuple(codes, scales, zeros);
}

F32Array dequantize_keys(pb::array codes, pb::array scales, pb::array zeros, int bits,
                         int group_size) {
  const char* what = "dequantize_keys";
  kivi_bits(bits, what);
  const kv::ParamType pt = check_params(scales, zeros, what);
  codes = contiguous_codes(codes, what);
  const Lead lc = leading(codes, 2, what), lp = leading(scales, 2, what);
  check_lead(lc, lp, what);
  const int NG = to_int(scales.shape(scales.ndim() - 2), "dequantize_keys: groups");
  const int D = to_int(scales.shape(scales.ndim() - 1), "dequantize_keys: head_dim");
  if (group_size < 1) fail("%s: group_size = %d, expected >= 1", what, group_size);
  if (D * bits % 8 != 0)
    fail("%s: head_dim %d is not a multiple of %d for %d-bit packing", what, D, 8 / bits, bits);
  const int64_t W = static_cast<int64_t>(D) * bits / 8;
  if (codes.shape(codes.ndim() - 2) != NG || codes.shape(codes.ndim() - 1) != group_size * W) {
    fail(
        "%s: codes have shape [..., %lld, %lld]; %d groups of %d tokens of head_dim %d at %d bits "
        "need [..., %d, %lld]",
        what, static_cast<long long>(codes.shape(codes.ndim() - 2)),
        static_cast<long long>(codes.shape(codes.ndim() - 1)), NG, group_size, D, bits, NG,
        static_cast<long long>(group_size * W));
  }
  const int S = to_int(lp.count, "dequantize_keys: slices");
  const int T = to_int(static_cast<int64_t>(NG) * group_size, "dequantize_keys: tokens");
  F32Array out(with_tail(lp, {T, D}));
  {
    pb::gil_scoped_release nogil;
    kv::dequantize_keys(static_cast<const uint8_t*>(codes.data()), scales.data(), zeros.data(), S,
                        T, D, group_size, bits, pt, out.mutable_data());
  }
  return out;
}

pb::tuple quantize_values(F32Array v, int bits, int group_size, const std::string& scale_dtype) {
  const char* what = "quantize_values";
  kivi_bits(bits, what);
  const kv::ParamType pt = param_type_of(scale_dtype);
  const Lead l = leading(v, 2, what);
  const int T = to_int(v.shape(v.ndim() - 2), "quantize_values: tokens");
  const int D = to_int(v.shape(v.ndim() - 1), "quantize_values: head_dim");
  const int S = to_int(l.count, "quantize_values: slices");
  if (group_size < 1) fail("%s: group_size = %d, expected >= 1", what, group_size);
  if (D < 1) fail("%s: head_dim is 0", what);
  const int gc = std::min(group_size, D);
  if (D % gc != 0)
    fail("%s: the channel group min(G, head_dim) = %d does not divide head_dim %d", what, gc, D);
  if (D * bits % 8 != 0)
    fail("%s: head_dim %d is not a multiple of %d for %d-bit packing", what, D, 8 / bits, bits);
  const int64_t W = static_cast<int64_t>(D) * bits / 8;
  pb::array codes = new_array(pb::dtype::of<uint8_t>(), with_tail(l, {T, W}));
  pb::array scales = new_array(param_dtype(pt), with_tail(l, {T, D / gc}));
  pb::array zeros = new_array(param_dtype(pt), with_tail(l, {T, D / gc}));
  {
    pb::gil_scoped_release nogil;
    kv::quantize_values(v.data(), S, T, D, gc, bits, pt,
                        static_cast<uint8_t*>(codes.mutable_data()), scales.mutable_data(),
                        zeros.mutable_data());
  }
  return pb::make_tuple(codes, scales, zeros);
}

F32Array dequantize_values(pb::array codes, pb::array scales, pb::array zeros, int bits,
                           int group_size) {
  const char* what = "dequantize_values";
  kivi_bits(bits, what);
  const kv::ParamType pt = check_params(scales, zeros, what);
  codes = contiguous_codes(codes, what);
  const Lead lc = leading(codes, 2, what), lp = leading(scales, 2, what);
  check_lead(lc, lp, what);
  const int T = to_int(codes.shape(codes.ndim() - 2), "dequantize_values: tokens");
  const int64_t W = codes.shape(codes.ndim() - 1);
  const int D = to_int(W * 8 / bits, "dequantize_values: head_dim");
  if (D < 1) fail("%s: codes have no bytes per token", what);
  if (group_size < 1) fail("%s: group_size = %d, expected >= 1", what, group_size);
  const int gc = std::min(group_size, D);
  if (D % gc != 0)
    fail("%s: the channel group min(G, head_dim) = %d does not divide head_dim %d", what, gc, D);
  if (scales.shape(scales.ndim() - 2) != T || scales.shape(scales.ndim() - 1) != D / gc) {
    fail(
        "%s: parameters have shape [..., %lld, %lld]; %d tokens of head_dim %d in groups of %d "
        "need [..., %d, %d]",
        what, static_cast<long long>(scales.shape(scales.ndim() - 2)),
        static_cast<long long>(scales.shape(scales.ndim() - 1)), T, D, gc, T, D / gc);
  }
  const int S = to_int(lp.count, "dequantize_values: slices");
  F32Array out(with_tail(lp, {T, D}));
  {
    pb::gil_scoped_release nogil;
    kv::dequantize_values(static_cast<const uint8_t*>(codes.data()), scales.data(), zeros.data(), S,
                          T, D, gc, bits, pt, out.mutable_data());
  }
  return out;
}

// The tq codec of a format name ("tq3", "tq2.5", ...) for rows of D.
const kv::TqCodec& tq_of(const std::string& format, int D, const char* what) {
  const kv::Format f = kv::parse_format(format, what);
  if (!kv::is_tq(f))
    fail("%s: format %s is not a tq format (tq2, tq2.5, tq3, tq3.5, tq4)", what, format.c_str());
  if (D < 4) fail("%s: head_dim %d, the tq formats need 4 or more", what, D);
  return *kv::tq_codec(f, D);
}

pb::tuple quantize_tq(F32Array x, const std::string& format, int layer, uint64_t rotation_seed,
                      const std::string& scale_dtype) {
  const char* what = "quantize_tq";
  const kv::ParamType pt = param_type_of(scale_dtype);
  const Lead l = leading(x, 3, what);
  const int H = to_int(x.shape(x.ndim() - 3), "quantize_tq: heads");
  const int T = to_int(x.shape(x.ndim() - 2), "quantize_tq: tokens");
  const int D = to_int(x.shape(x.ndim() - 1), "quantize_tq: head_dim");
  if (layer < 0) fail("%s: layer = %d, expected >= 0", what, layer);
  const kv::TqCodec& tq = tq_of(format, D, what);
  const int64_t W = static_cast<int64_t>(tq.row_bytes());
  pb::array codes = new_array(pb::dtype::of<uint8_t>(), with_tail(l, {H, T, W}));
  pb::array scales = new_array(param_dtype(pt), with_tail(l, {H, T}));
  {
    pb::gil_scoped_release nogil;
    std::vector<float> tmp(D);
    uint8_t* c = static_cast<uint8_t*>(codes.mutable_data());
    for (int h = 0; h < H; ++h) {
      const kv::HadamardRotation rot(D, kv::rotation_seed(rotation_seed, layer, h));
      for (int64_t s = 0; s < l.count; ++s) {
        for (int t = 0; t < T; ++t) {
          const size_t row = (static_cast<size_t>(s) * H + h) * T + t;
          const float sc = tq.encode(x.data() + row * D, rot, c + row * W, tmp.data());
          kv::store_param(scales.mutable_data(), row, sc, pt);
        }
      }
    }
  }
  return pb::make_tuple(codes, scales);
}

F32Array dequantize_tq(pb::array codes, pb::array scales, const std::string& format, int head_dim,
                       int layer, uint64_t rotation_seed) {
  const char* what = "dequantize_tq";
  const kv::ParamType pt = param_type_of(scales, what);
  scales = pb::array::ensure(scales, pb::array::c_style);
  codes = contiguous_codes(codes, what);
  const kv::TqCodec& tq = tq_of(format, head_dim, what);
  const int64_t W = static_cast<int64_t>(tq.row_bytes());
  const Lead lc = leading(codes, 3, what), lp = leading(scales, 2, what);
  check_lead(lc, lp, what);
  const int H = to_int(scales.shape(scales.ndim() - 2), "dequantize_tq: heads");
  const int T = to_int(scales.shape(scales.ndim() - 1), "dequantize_tq: tokens");
  if (codes.shape(codes.ndim() - 3) != H || codes.shape(codes.ndim() - 2) != T ||
      codes.shape(codes.ndim() - 1) != W) {
    fail(
        "%s: codes have shape [..., %lld, %lld, %lld]; %d heads of %d tokens of %s at head_dim "
        "%d need [..., %d, %d, %lld]",
        what, static_cast<long long>(codes.shape(codes.ndim() - 3)),
        static_cast<long long>(codes.shape(codes.ndim() - 2)),
        static_cast<long long>(codes.shape(codes.ndim() - 1)), H, T, format.c_str(), head_dim, H, T,
        static_cast<long long>(W));
  }
  if (layer < 0) fail("%s: layer = %d, expected >= 0", what, layer);
  F32Array out(with_tail(lc, {H, T, head_dim}));
  {
    pb::gil_scoped_release nogil;
    const uint8_t* c = static_cast<const uint8_t*>(codes.data());
    float* o = out.mutable_data();
    for (int h = 0; h < H; ++h) {
      const kv::HadamardRotation rot(head_dim, kv::rotation_seed(rotation_seed, layer, h));
      for (int64_t s = 0; s < lc.count; ++s) {
        for (int t = 0; t < T; ++t) {
          const size_t row = (static_cast<size_t>(s) * H + h) * T + t;
          tq.decode(c + row * W, kv::load_param(scales.data(), row, pt), rot, o + row * head_dim);
        }
      }
    }
  }
  return out;
}

}  // namespace

void bind_codec(pb::module_& m) {
  using namespace pybind11::literals;
  m.def("quantize_keys", &quantize_keys, "k"_a, "bits"_a = 2, "group_size"_a = 32,
        "scale_dtype"_a = "f16",
        R"(Quantizes keys per channel, in groups of G consecutive tokens (KIVI).

k: float array [..., T, D] (for example [B, H, T, D]); T a multiple of group_size.
Returns (codes, scales, zeros):
  codes  uint8 [..., T/G, G*W], W = D*bits/8: each group's packed rows interleaved in
         32-bit words exactly as the C++ cache stores them (kivi.key_group_rows undoes it);
  scales, zeros  float16 or float32 (scale_dtype) [..., T/G, D].
scale = (max - min) / (2^bits - 1), zero = min, code = clamp(rint((x - zero) / scale));
f16 parameters round zero down and scale up so the stored range covers the data.)");
  m.def("dequantize_keys", &dequantize_keys, "codes"_a, "scales"_a, "zeros"_a, "bits"_a = 2,
        "group_size"_a = 32,
        "Inverse of quantize_keys: code * scale + zero in float32, [..., T, D].");
  m.def("quantize_values", &quantize_values, "v"_a, "bits"_a = 2, "group_size"_a = 32,
        "scale_dtype"_a = "f16",
        R"(Quantizes values per token, in groups of min(group_size, D) consecutive channels (KIVI).

v: float array [..., T, D]. Returns (codes, scales, zeros):
  codes  uint8 [..., T, W], W = D*bits/8, one packed row per token (byte j holds channels
         j, j+W, j+2W, ... from the low bits up); the cache stores these rows interleaved by
         quads of tokens (kivi.value_quads);
  scales, zeros  float16 or float32 [..., T, D/min(G, D)].)");
  m.def("dequantize_values", &dequantize_values, "codes"_a, "scales"_a, "zeros"_a, "bits"_a = 2,
        "group_size"_a = 32,
        "Inverse of quantize_values: code * scale + zero in float32, [..., T, D].");
  m.def("quantize_tq", &quantize_tq, "x"_a, "format"_a = "tq3", "layer"_a = 0,
        "rotation_seed"_a = kv::kDefaultRotationSeed, "scale_dtype"_a = "f16",
        R"(Codes rows in a rotated vector format (tq2, tq2.5, tq3, tq3.5, tq4).

x: float array [..., H, T, D] (for example [B, H, T, D] keys or values of one layer).
Head h is rotated by the Hadamard rotation of (layer, h) derived from rotation_seed (the
cache's --kv-rotation-seed), each rotated coordinate gets the index of its nearest
Lloyd-Max centroid, and each row one scale |x|^2 / <Rx, centroids>. Returns (codes, scales):
  codes   uint8 [..., H, T, row_bytes], a little-endian bit stream per row, exactly the bytes
          the C++ cache stores for these rows in that layer;
  scales  float16 or float32 (scale_dtype) [..., H, T].)");
  m.def("dequantize_tq", &dequantize_tq, "codes"_a, "scales"_a, "format"_a = "tq3",
        "head_dim"_a = 128, "layer"_a = 0, "rotation_seed"_a = kv::kDefaultRotationSeed,
        "Inverse of quantize_tq: scale * R^T centroids in float32, [..., H, T, D].");
}

}  // namespace kivi::py
