// The Python module kivi._kivi: the KV codecs on numpy arrays, the streaming KIVI
// cache and the inference engine. The pure-Python package `kivi` re-exports it.
#include <pybind11/pybind11.h>

#include <climits>

#include "bindings.h"
#include "runtime/engine_options.h"
#include "core/error.h"
#include "kv/format.h"

namespace kivi::py {

std::vector<int64_t> shape_of(const pb::array& a, int ndim, const char* what) {
  if (a.ndim() != ndim) {
    fail("%s: expected a %d-dimensional array, got %d dimension%s", what, ndim,
         static_cast<int>(a.ndim()), a.ndim() == 1 ? "" : "s");
  }
  std::vector<int64_t> s(ndim);
  for (int i = 0; i < ndim; ++i) s[i] = a.shape(i);
  return s;
}

pb::array new_array(const pb::dtype& dt, const std::vector<int64_t>& shape) {
  std::vector<pb::ssize_t> s(shape.begin(), shape.end());
  return pb::array(dt, s);
}

kv::ParamType param_type_of(const std::string& scale_dtype) {
  return kv::parse_param_type(scale_dtype);
}

pb::dtype param_dtype(kv::ParamType pt) {
  return pt == kv::ParamType::kF16 ? pb::dtype("float16") : pb::dtype::of<float>();
}

kv::ParamType param_type_of(const pb::array& params, const char* what) {
  if (params.dtype().is(pb::dtype("float16"))) return kv::ParamType::kF16;
  if (params.dtype().is(pb::dtype::of<float>())) return kv::ParamType::kF32;
  fail("%s: expected float16 or float32 parameters, got dtype %s", what,
       std::string(pb::str(params.dtype())).c_str());
}

int kivi_bits(int bits, const char* what) {
  if (bits != 2 && bits != 4 && bits != 8) fail("%s: bits = %d, expected 2, 4 or 8", what, bits);
  return bits;
}

int to_int(int64_t v, const char* what) {
  if (v < 0 || v > INT_MAX)
    fail("%s = %lld is out of range (0 to %d)", what, static_cast<long long>(v), INT_MAX);
  return static_cast<int>(v);
}

std::string describe_cache(const kv::CacheConfig& c) { return runtime::describe_cache(c); }

}  // namespace kivi::py

PYBIND11_MODULE(_kivi, m) {
  m.doc() =
      "kivi.cpp from Python: the KIVI KV-cache codecs on numpy arrays, the streaming cache, and "
      "the\n"
      "inference engine (models, sessions, generation, logits, perplexity).";
  // kivi::Error (bad input, bad files, bad options) becomes kivi.Error, a RuntimeError, with the
  // same message.
  pybind11::register_exception<kivi::Error>(m, "Error", PyExc_RuntimeError);
  kivi::py::bind_codec(m);
  kivi::py::bind_cache(m);
  kivi::py::bind_engine(m);
}
