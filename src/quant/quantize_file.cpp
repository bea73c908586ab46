#include "quant/quantize_file.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "core/error.h"
#include "io/gguf.h"
#include "io/gguf_writer.h"
#include "quant/dequant.h"
#include "quant/quantize.h"

namespace kivi::quant {

namespace {

// The GGUF quantization version of ggml's current block layouts.
constexpr uint32_t kQuantizationVersion = 2;

int layer_count(const io::GgufFile& f) {
  if (auto arch = f.get_string_opt("general.architecture")) {
    if (auto n = f.get_uint_opt(*arch + ".block_count"); n && *n < (1u << 20))
      return static_cast<int>(*n);
  }
  long n = 0;
  for (const auto& t : f.tensors()) {
    if (t.name.rfind("blk.", 0) != 0) continue;
    const long l = std::strtol(t.name.c_str() + 4, nullptr, 10);
    if (l >= 0 && l < (1 << 20)) n = std::max(n, l + 1);
  }
  return static_cast<int>(n);
}

struct Plan {
  const io::GgufTensor* src;
  Type type;
  bool convert;
};

std::vector<Plan> make_plan(const io::GgufFile& f, const FileType& ft) {
  const int n_layers = layer_count(f);
  const bool tied = f.find_tensor("output.weight") == nullptr;
  std::vector<Plan> plan;
  for (const auto& t : f.tensors()) {
    const TypeInfo* ti = t.type_info();
    if (!ti || !t.data) {
      fail("%s: tensor '%s' has type %s, which kivi.cpp cannot read (readable: %s, Q8_K)",
           f.path().c_str(), t.name.c_str(), io::ggml_type_name(t.type).c_str(),
           supported_weight_types());
    }
    const TensorDesc d{t.name, static_cast<int>(t.dims.size()), t.dims[0]};
    Type type = ti->type;
    if (is_converted(d)) type = tensor_type(ft, d, n_layers, tied);
    plan.push_back({&t, type, type != ti->type});
  }
  return plan;
}

QuantizeFileResult summarize(const std::vector<Plan>& plan) {
  QuantizeFileResult r;
  for (const auto& p : plan) {
    const uint64_t bytes = row_bytes(p.type, p.src->n_elements);
    r.bytes_in += p.src->n_bytes;
    r.bytes_out += bytes;
    ++r.n_tensors;
    if (p.convert) ++r.n_converted;
    const std::string name = info(p.type).name;
    auto it = std::find_if(r.per_type.begin(), r.per_type.end(),
                           [&](const auto& x) { return x.type == name; });
    if (it == r.per_type.end()) it = r.per_type.insert(r.per_type.end(), {name, 0, 0});
    ++it->tensors;
    it->bytes += bytes;
  }
  return r;
}

// Values [first, first + count) of tensor t as f32 (exact dequantization of the rows
// they lie in).
void read_values(const io::GgufTensor& t, uint64_t first, uint64_t count, float* out,
                 std::vector<float>& row) {
  const TypeInfo& ti = *t.type_info();
  const uint64_t n = t.dims[0];
  const uint64_t rb = row_bytes(ti.type, n);
  row.resize(static_cast<size_t>(n));
  uint64_t e = first;
  while (e < first + count) {
    const uint64_t r = e / n, c0 = e % n;
    const uint64_t take = std::min(n - c0, first + count - e);
    if (c0 == 0 && take == n) {
      dequantize_row(ti.type, t.data + r * rb, out + (e - first), static_cast<int64_t>(n));
    } else {
      dequantize_row(ti.type, t.data + r * rb, row.data(), static_cast<int64_t>(n));
      std::memcpy(out + (e - first), row.data() + c0, take * sizeof(float));
    }
    e += take;
  }
}

}  // namespace

QuantizeFileResult plan_quantize_file(const std::string& in, const FileType& ft) {
  io::GgufFile f(in);
  auto r = summarize(make_plan(f, ft));
  return r;
}

QuantizeFileResult quantize_file(const std::string& in, const std::string& out, const FileType& ft,
                                 ThreadPool* pool,
                                 const std::function<void(uint64_t, uint64_t)>& progress) {
  io::GgufFile f(in);
  const auto plan = make_plan(f, ft);
  io::GgufWriter w;
  for (const auto& key : f.keys()) {
    if (key == "general.file_type" || key == "general.quantization_version" ||
        key == "general.alignment")
      continue;
    w.add_copy(f, key);
  }
  w.add_u32("general.file_type", static_cast<uint32_t>(ft.llama_ftype));
  w.add_u32("general.quantization_version", kQuantizationVersion);
  for (const auto& p : plan) {
    const io::GgufTensor& t = *p.src;
    if (!p.convert) {
      w.add_tensor(t.name, t.dims, p.type, static_cast<const void*>(t.data));
      continue;
    }
    auto values = std::make_shared<std::vector<float>>();
    auto row = std::make_shared<std::vector<float>>();
    const std::string path = in;
    w.add_tensor(t.name, t.dims, p.type,
                 io::GgufWriter::Generator([&t, type = p.type, values, row, pool, path](
                                               uint64_t first, uint64_t count, void* dst) {
                   values->resize(static_cast<size_t>(count));
                   read_values(t, first, count, values->data(), *row);
                   for (uint64_t i = 0; i < count; ++i) {
                     if (!std::isfinite((*values)[i])) {
                       fail(
                           "%s: tensor '%s' holds a non-finite value at element %llu; it cannot be "
                           "quantized",
                           path.c_str(), t.name.c_str(),
                           static_cast<unsigned long long>(first + i));
                     }
                   }
                   quantize_parallel(type, values->data(), dst, static_cast<int64_t>(count), pool);
                 }));
  }
  w.write(out, progress);
  auto r = summarize(plan);
  r.file_bytes = w.file_size();
  return r;
}

}  // namespace kivi::quant
