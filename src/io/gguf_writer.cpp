#include "io/gguf_writer.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "io/atomic_file.h"

namespace kivi::io {

namespace {
template <class T>
void put(std::vector<uint8_t>& b, T v) {
  const size_t o = b.size();
  b.resize(o + sizeof(T));
  std::memcpy(b.data() + o, &v, sizeof(T));
}
void put_string(std::vector<uint8_t>& b, const std::string& s) {
  put<uint64_t>(b, s.size());
  b.insert(b.end(), s.begin(), s.end());
}
uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }
}  // namespace

void GgufWriter::add_string(const std::string& key, const std::string& v) {
  put_string(kv_blob_, key);
  put<uint32_t>(kv_blob_, static_cast<uint32_t>(GgufType::kString));
  put_string(kv_blob_, v);
  ++n_kv_;
}
void GgufWriter::add_u32(const std::string& key, uint32_t v) {
  put_string(kv_blob_, key);
  put<uint32_t>(kv_blob_, static_cast<uint32_t>(GgufType::kU32));
  put<uint32_t>(kv_blob_, v);
  ++n_kv_;
}
void GgufWriter::add_i32(const std::string& key, int32_t v) {
  put_string(kv_blob_, key);
  put<uint32_t>(kv_blob_, static_cast<uint32_t>(GgufType::kI32));
  put<int32_t>(kv_blob_, v);
  ++n_kv_;
}
void GgufWriter::add_u64(const std::string& key, uint64_t v) {
  put_string(kv_blob_, key);
  put<uint32_t>(kv_blob_, static_cast<uint32_t>(GgufType::kU64));
  put<uint64_t>(kv_blob_, v);
  ++n_kv_;
}
void GgufWriter::add_f32(const std::string& key, float v) {
  put_string(kv_blob_, key);
  put<uint32_t>(kv_blob_, static_cast<uint32_t>(GgufType::kF32));
  put<float>(kv_blob_, v);
  ++n_kv_;
}
void GgufWriter::add_bool(const std::string& key, bool v) {
  put_string(kv_blob_, key);
  put<uint32_t>(kv_blob_, static_cast<uint32_t>(GgufType::kBool));
  put<uint8_t>(kv_blob_, v ? 1 : 0);
  ++n_kv_;
}
void GgufWriter::add_string_array(const std::string& key, const std::vector<std::string>& v) {
  put_string(kv_blob_, key);
  put<uint32_t>(kv_blob_, static_cast<uint32_t>(GgufType::kArray));
  put<uint32_t>(kv_blob_, static_cast<uint32_t>(GgufType::kString));
  put<uint64_t>(kv_blob_, v.size());
  for (const auto& s : v) put_string(kv_blob_, s);
  ++n_kv_;
}
void GgufWriter::add_f32_array(const std::string& key, const std::vector<float>& v) {
  put_string(kv_blob_, key);
  put<uint32_t>(kv_blob_, static_cast<uint32_t>(GgufType::kArray));
  put<uint32_t>(kv_blob_, static_cast<uint32_t>(GgufType::kF32));
  put<uint64_t>(kv_blob_, v.size());
  for (float f : v) put<float>(kv_blob_, f);
  ++n_kv_;
}
void GgufWriter::add_i32_array(const std::string& key, const std::vector<int32_t>& v) {
  put_string(kv_blob_, key);
  put<uint32_t>(kv_blob_, static_cast<uint32_t>(GgufType::kArray));
  put<uint32_t>(kv_blob_, static_cast<uint32_t>(GgufType::kI32));
  put<uint64_t>(kv_blob_, v.size());
  for (int32_t x : v) put<int32_t>(kv_blob_, x);
  ++n_kv_;
}

void GgufWriter::add_copy(const GgufFile& f, const std::string& key) {
  const GgufValue* v = f.find(key);
  if (!v) fail("%s: missing metadata '%s'", f.path().c_str(), key.c_str());
  put_string(kv_blob_, key);
  put<uint32_t>(kv_blob_, static_cast<uint32_t>(v->type));
  switch (v->type) {
    case GgufType::kU8:
      put<uint8_t>(kv_blob_, static_cast<uint8_t>(v->u));
      break;
    case GgufType::kI8:
      put<int8_t>(kv_blob_, static_cast<int8_t>(v->i));
      break;
    case GgufType::kU16:
      put<uint16_t>(kv_blob_, static_cast<uint16_t>(v->u));
      break;
    case GgufType::kI16:
      put<int16_t>(kv_blob_, static_cast<int16_t>(v->i));
      break;
    case GgufType::kU32:
      put<uint32_t>(kv_blob_, static_cast<uint32_t>(v->u));
      break;
    case GgufType::kI32:
      put<int32_t>(kv_blob_, static_cast<int32_t>(v->i));
      break;
    case GgufType::kU64:
      put<uint64_t>(kv_blob_, v->u);
      break;
    case GgufType::kI64:
      put<int64_t>(kv_blob_, v->i);
      break;
    case GgufType::kF32:
      put<float>(kv_blob_, static_cast<float>(v->f));
      break;
    case GgufType::kF64:
      put<double>(kv_blob_, v->f);
      break;
    case GgufType::kBool:
      put<uint8_t>(kv_blob_, v->u ? 1 : 0);
      break;
    case GgufType::kString:
      put_string(kv_blob_, v->s);
      break;
    case GgufType::kArray:
      put<uint32_t>(kv_blob_, static_cast<uint32_t>(v->elem_type));
      put<uint64_t>(kv_blob_, v->count);
      kv_blob_.insert(kv_blob_.end(), v->elems, v->elems + v->elems_bytes);
      break;
  }
  ++n_kv_;
}

static uint64_t tensor_bytes(const std::string& name, const std::vector<uint64_t>& dims,
                             GgmlType type) {
  const quant::TypeInfo& ti = quant::info(type);
  if (dims.empty() || dims[0] % static_cast<uint64_t>(ti.block) != 0) {
    fail("tensor '%s': rows of %llu values cannot be stored as %s (blocks of %d)", name.c_str(),
         static_cast<unsigned long long>(dims.empty() ? 0 : dims[0]), ti.name, ti.block);
  }
  uint64_t n = 1;
  for (auto d : dims) n *= d;
  return quant::row_bytes(type, n);
}

void GgufWriter::add_tensor(const std::string& name, std::vector<uint64_t> dims, GgmlType type,
                            const void* data) {
  Tensor t{name, std::move(dims), type, data, {}, 0};
  t.n_bytes = tensor_bytes(t.name, t.dims, type);
  tensors_.push_back(std::move(t));
}

void GgufWriter::add_tensor(const std::string& name, std::vector<uint64_t> dims, GgmlType type,
                            Generator gen) {
  Tensor t{name, std::move(dims), type, nullptr, std::move(gen), 0};
  t.n_bytes = tensor_bytes(t.name, t.dims, type);
  tensors_.push_back(std::move(t));
}

uint64_t GgufWriter::header_size() const {
  uint64_t n = 4 + 4 + 8 + 8 + kv_blob_.size();
  for (const auto& t : tensors_) n += 8 + t.name.size() + 4 + 8 * t.dims.size() + 4 + 8;
  return n;
}

uint64_t GgufWriter::file_size() const {
  uint64_t off = align_up(header_size(), kGgufDefaultAlignment);
  for (const auto& t : tensors_) off += align_up(t.n_bytes, kGgufDefaultAlignment);
  return off;
}

void GgufWriter::write(const std::string& path,
                       const std::function<void(uint64_t, uint64_t)>& on_progress) const {
  AtomicFile out(path);
  write(out, on_progress);
  out.commit();
}

void GgufWriter::write(AtomicFile& out,
                       const std::function<void(uint64_t, uint64_t)>& on_progress) const {
  std::vector<uint8_t> head;
  put<uint32_t>(head, kGgufMagic);
  put<uint32_t>(head, 3);
  put<uint64_t>(head, tensors_.size());
  put<uint64_t>(head, n_kv_);
  head.insert(head.end(), kv_blob_.begin(), kv_blob_.end());
  uint64_t offset = 0;
  for (const auto& t : tensors_) {
    put_string(head, t.name);
    put<uint32_t>(head, static_cast<uint32_t>(t.dims.size()));
    for (auto d : t.dims) put<uint64_t>(head, d);
    put<uint32_t>(head, static_cast<uint32_t>(t.type));
    put<uint64_t>(head, offset);
    offset = align_up(offset + t.n_bytes, kGgufDefaultAlignment);
  }
  head.resize(align_up(head.size(), kGgufDefaultAlignment), 0);

  out.write(head.data(), head.size());
  const uint64_t total = file_size();
  uint64_t written = head.size();
  std::vector<uint8_t> chunk;
  static const uint8_t zeros[kGgufDefaultAlignment] = {};
  for (const auto& t : tensors_) {
    if (t.data) {
      out.write(t.data, t.n_bytes);
      written += t.n_bytes;
      if (on_progress) on_progress(written, total);
    } else {
      // Chunks of whole blocks (about 16 MiB), so quantized generators see block-aligned
      // element ranges.
      const quant::TypeInfo& ti = quant::info(t.type);
      const uint64_t block = static_cast<uint64_t>(ti.block),
                     bbytes = static_cast<uint64_t>(ti.block_bytes);
      const uint64_t n_el = t.n_bytes / bbytes * block;
      const uint64_t per_chunk = std::max<uint64_t>(1, (uint64_t{16} << 20) / bbytes) * block;
      chunk.resize(per_chunk / block * bbytes);
      for (uint64_t first = 0; first < n_el; first += per_chunk) {
        const uint64_t cnt = std::min(per_chunk, n_el - first);
        const uint64_t bytes = cnt / block * bbytes;
        t.gen(first, cnt, chunk.data());
        out.write(chunk.data(), bytes);
        written += bytes;
        if (on_progress) on_progress(written, total);
      }
    }
    const uint64_t pad = align_up(t.n_bytes, kGgufDefaultAlignment) - t.n_bytes;
    out.write(zeros, pad);
    written += pad;
  }
}

}  // namespace kivi::io
