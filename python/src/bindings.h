// Shared helpers of the Python module `kivi` (built as kivi._kivi): array checks that
// throw kivi::Error (which the module turns into kivi.Error with the same message),
// and the entry points of the three binding files.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <string>
#include <vector>

#include "kv/format.h"

namespace kivi::py {

namespace pb = pybind11;

// A C-contiguous float32 copy (or view) of any numeric array.
using F32Array = pb::array_t<float, pb::array::c_style | pb::array::forcecast>;
using U8Array = pb::array_t<uint8_t, pb::array::c_style | pb::array::forcecast>;

// Shape of `a` as a vector; throws unless a.ndim() == ndim.
std::vector<int64_t> shape_of(const pb::array& a, int ndim, const char* what);

// A new C-contiguous array of the given dtype and shape (the GIL must be held).
pb::array new_array(const pb::dtype& dt, const std::vector<int64_t>& shape);

// "f16" or "f32" -> ParamType, and the numpy dtype that holds such parameters.
kv::ParamType param_type_of(const std::string& scale_dtype);
pb::dtype param_dtype(kv::ParamType pt);
// The parameter type of a scales or zeros array (float16 or float32); throws otherwise.
kv::ParamType param_type_of(const pb::array& params, const char* what);

// "kivi2"/"kivi4"/"kivi8" or 2/4/8 -> bits; throws naming `what` otherwise.
int kivi_bits(int bits, const char* what);

// Fits an int64 into int, naming the dimension on overflow.
int to_int(int64_t v, const char* what);

// The one-line description of a cache configuration, as the CLI prints it.
std::string describe_cache(const kv::CacheConfig& c);

void bind_codec(pb::module_& m);
void bind_cache(pb::module_& m);
void bind_engine(pb::module_& m);

}  // namespace kivi::py
