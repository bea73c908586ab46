#include "io/gguf.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>

#include "core/error.h"

namespace kivi::io {

const char* gguf_type_name(GgufType t) {
  switch (t) {
    case GgufType::kU8:
      return "u8";
    case GgufType::kI8:
      return "i8";
    case GgufType::kU16:
      return "u16";
    case GgufType::kI16:
      return "i16";
    case GgufType::kU32:
      return "u32";
    case GgufType::kI32:
      return "i32";
    case GgufType::kF32:
      return "f32";
    case GgufType::kBool:
      return "bool";
    case GgufType::kString:
      return "string";
    case GgufType::kArray:
      return "array";
    case GgufType::kU64:
      return "u64";
    case GgufType::kI64:
      return "i64";
    case GgufType::kF64:
      return "f64";
  }
  return "unknown";
}

std::string ggml_type_name(uint32_t t) { return quant::type_name(t); }

// Byte size of one scalar element, 0 for strings/arrays/unknown.
static size_t scalar_size(GgufType t) {
  switch (t) {
    case GgufType::kU8:
    case GgufType::kI8:
    case GgufType::kBool:
      return 1;
    case GgufType::kU16:
    case GgufType::kI16:
      return 2;
    case GgufType::kU32:
    case GgufType::kI32:
    case GgufType::kF32:
      return 4;
    case GgufType::kU64:
    case GgufType::kI64:
    case GgufType::kF64:
      return 8;
    default:
      return 0;
  }
}

static bool known_type(uint32_t t) { return t <= static_cast<uint32_t>(GgufType::kF64); }

namespace {

// Bounds-checked cursor over the file image.
class Cursor {
 public:
  Cursor(const uint8_t* p, size_t n, const std::string& name) : p_(p), n_(n), name_(name) {}
  size_t pos() const { return pos_; }
  size_t remaining() const { return n_ - pos_; }
  const uint8_t* here() const { return p_ + pos_; }

  void need(size_t bytes, const char* what) {
    if (bytes > remaining()) {
      fail("%s: truncated GGUF file: %s needs %zu bytes at offset %zu but only %zu remain",
           name_.c_str(), what, bytes, pos_, remaining());
    }
  }
  template <class T>
  T read(const char* what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, p_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  std::string read_string(const char* what) {
    const uint64_t len = read<uint64_t>(what);
    if (len > remaining()) {
      fail("%s: truncated GGUF file: %s has length %llu at offset %zu but only %zu bytes remain",
           name_.c_str(), what, static_cast<unsigned long long>(len), pos_, remaining());
    }
    std::string s(reinterpret_cast<const char*>(p_ + pos_), static_cast<size_t>(len));
    pos_ += static_cast<size_t>(len);
    return s;
  }
  void skip(size_t bytes, const char* what) {
    need(bytes, what);
    pos_ += bytes;
  }

 private:
  const uint8_t* p_;
  size_t n_;
  size_t pos_ = 0;
  const std::string& name_;
};

}  // namespace

GgufFile::GgufFile(const std::string& path) : name_(path) {
  check_regular_file(path, "model");
  map_ = std::make_unique<MappedFile>(path);
  data_ = map_->data();
  size_ = map_->size();
  parse();
}

GgufFile::GgufFile(const uint8_t* data, size_t size, const std::string& name)
    : data_(data), size_(size), name_(name) {
  parse();
}

void GgufFile::parse() {
  Cursor c(data_, size_, name_);
  const uint32_t magic = c.read<uint32_t>("magic");
  if (magic != kGgufMagic) fail("%s: not a GGUF file (bad magic 0x%08x)", name_.c_str(), magic);
  version_ = c.read<uint32_t>("version");
  if (version_ != 2 && version_ != 3) {
    fail("%s: unsupported GGUF version %u (supported: 2, 3)", name_.c_str(), version_);
  }
  const uint64_t n_tensors = c.read<uint64_t>("tensor count");
  const uint64_t n_kv = c.read<uint64_t>("metadata count");
  // Each metadata entry needs at least 8 (key length) + 4 (type) bytes, each tensor
  // entry at least 8 + 4 + 4 + 8; reject counts the file cannot possibly hold.
  if (n_kv > c.remaining() / 12) {
    fail("%s: metadata count %llu is impossible for a file of %zu bytes", name_.c_str(),
         static_cast<unsigned long long>(n_kv), size_);
  }
  if (n_tensors > c.remaining() / 24) {
    fail("%s: tensor count %llu is impossible for a file of %zu bytes", name_.c_str(),
         static_cast<unsigned long long>(n_tensors), size_);
  }

  for (uint64_t k = 0; k < n_kv; ++k) {
    std::string key = c.read_string("metadata key");
    if (key.empty())
      fail("%s: metadata entry %llu has an empty key", name_.c_str(), (unsigned long long)k);
    const uint32_t t = c.read<uint32_t>("metadata type");
    if (!known_type(t))
      fail("%s: metadata '%s' has unknown type %u", name_.c_str(), key.c_str(), t);
    GgufValue v;
    v.type = static_cast<GgufType>(t);
    switch (v.type) {
      case GgufType::kU8:
        v.u = c.read<uint8_t>(key.c_str());
        v.i = static_cast<int64_t>(v.u);
        break;
      case GgufType::kI8:
        v.i = c.read<int8_t>(key.c_str());
        break;
      case GgufType::kU16:
        v.u = c.read<uint16_t>(key.c_str());
        v.i = static_cast<int64_t>(v.u);
        break;
      case GgufType::kI16:
        v.i = c.read<int16_t>(key.c_str());
        break;
      case GgufType::kU32:
        v.u = c.read<uint32_t>(key.c_str());
        v.i = static_cast<int64_t>(v.u);
        break;
      case GgufType::kI32:
        v.i = c.read<int32_t>(key.c_str());
        break;
      case GgufType::kU64:
        v.u = c.read<uint64_t>(key.c_str());
        break;
      case GgufType::kI64:
        v.i = c.read<int64_t>(key.c_str());
        break;
      case GgufType::kF32:
        v.f = c.read<float>(key.c_str());
        break;
      case GgufType::kF64:
        v.f = c.read<double>(key.c_str());
        break;
      case GgufType::kBool: {
        const uint8_t b = c.read<uint8_t>(key.c_str());
        if (b > 1) fail("%s: metadata '%s' is a bool with value %u", name_.c_str(), key.c_str(), b);
        v.u = b;
        break;
      }
      case GgufType::kString:
        v.s = c.read_string(key.c_str());
        break;
      case GgufType::kArray: {
        const uint32_t et = c.read<uint32_t>(key.c_str());
        if (!known_type(et) || et == static_cast<uint32_t>(GgufType::kArray)) {
          fail("%s: metadata array '%s' has unsupported element type %u", name_.c_str(),
               key.c_str(), et);
        }
        v.elem_type = static_cast<GgufType>(et);
        v.count = c.read<uint64_t>(key.c_str());
        v.elems = c.here();
        const size_t start = c.pos();
        if (v.elem_type == GgufType::kString) {
          if (v.count > c.remaining() / 8) {
            fail("%s: metadata array '%s' claims %llu strings, more than the file can hold",
                 name_.c_str(), key.c_str(), static_cast<unsigned long long>(v.count));
          }
          for (uint64_t j = 0; j < v.count; ++j) {
            const uint64_t len = c.read<uint64_t>(key.c_str());
            if (len > c.remaining()) {
              fail(
                  "%s: truncated GGUF file: string %llu of array '%s' has length %llu but only "
                  "%zu bytes remain",
                  name_.c_str(), (unsigned long long)j, key.c_str(), (unsigned long long)len,
                  c.remaining());
            }
            c.skip(static_cast<size_t>(len), key.c_str());
          }
        } else {
          const size_t es = scalar_size(v.elem_type);
          if (v.count > c.remaining() / es) {
            fail(
                "%s: truncated GGUF file: array '%s' claims %llu elements of %zu bytes but only "
                "%zu bytes remain",
                name_.c_str(), key.c_str(), (unsigned long long)v.count, es, c.remaining());
          }
          c.skip(static_cast<size_t>(v.count) * es, key.c_str());
        }
        v.elems_bytes = c.pos() - start;
        break;
      }
    }
    if (kv_.count(key)) fail("%s: duplicate metadata key '%s'", name_.c_str(), key.c_str());
    key_order_.push_back(key);
    kv_.emplace(std::move(key), std::move(v));
  }

  if (auto a = get_uint_opt("general.alignment")) {
    if (*a == 0 || *a > (1u << 20) || (*a & (*a - 1)) != 0) {
      fail("%s: general.alignment = %llu, expected a power of two in [1, 1048576]", name_.c_str(),
           static_cast<unsigned long long>(*a));
    }
    alignment_ = static_cast<uint32_t>(*a);
  }

  tensors_.reserve(static_cast<size_t>(n_tensors));
  for (uint64_t k = 0; k < n_tensors; ++k) {
    GgufTensor t;
    t.name = c.read_string("tensor name");
    if (t.name.empty())
      fail("%s: tensor %llu has an empty name", name_.c_str(), (unsigned long long)k);
    const uint32_t nd = c.read<uint32_t>("tensor dimension count");
    if (nd == 0 || nd > 4) {
      fail("%s: tensor '%s' has %u dimensions, expected 1 to 4", name_.c_str(), t.name.c_str(), nd);
    }
    t.n_elements = 1;
    for (uint32_t d = 0; d < nd; ++d) {
      const uint64_t dim = c.read<uint64_t>("tensor dimension");
      if (dim == 0 || dim > (uint64_t{1} << 40)) {
        fail("%s: tensor '%s' dimension %u is %llu, expected 1 to 2^40", name_.c_str(),
             t.name.c_str(), d, static_cast<unsigned long long>(dim));
      }
      if (t.n_elements > (uint64_t{1} << 48) / dim) {
        fail("%s: tensor '%s' has too many elements", name_.c_str(), t.name.c_str());
      }
      t.n_elements *= dim;
      t.dims.push_back(dim);
    }
    t.type = c.read<uint32_t>("tensor type");
    t.offset = c.read<uint64_t>("tensor offset");
    if (const quant::TypeInfo* ti = quant::find_type(t.type)) {
      if (t.dims[0] % static_cast<uint64_t>(ti->block) != 0) {
        fail("%s: tensor '%s' has rows of %llu values, not a multiple of the %s block size %d",
             name_.c_str(), t.name.c_str(), static_cast<unsigned long long>(t.dims[0]), ti->name,
             ti->block);
      }
      t.n_bytes =
          t.n_elements / static_cast<uint64_t>(ti->block) * static_cast<uint64_t>(ti->block_bytes);
    } else {
      t.n_bytes = 0;  // unsupported types are listed but cannot be loaded (checked by the model)
    }
    if (t.offset % alignment_ != 0) {
      fail("%s: tensor '%s' offset %llu is not a multiple of the alignment %u", name_.c_str(),
           t.name.c_str(), static_cast<unsigned long long>(t.offset), alignment_);
    }
    if (tensor_index_.count(t.name))
      fail("%s: duplicate tensor '%s'", name_.c_str(), t.name.c_str());
    tensor_index_[t.name] = tensors_.size();
    tensors_.push_back(std::move(t));
  }

  // Data section starts at the next multiple of the alignment.
  const uint64_t data_start =
      (static_cast<uint64_t>(c.pos()) + alignment_ - 1) / alignment_ * alignment_;
  for (auto& t : tensors_) {
    if (t.n_bytes == 0) continue;
    if (data_start > size_ || t.offset > size_ - data_start ||
        t.n_bytes > size_ - data_start - t.offset) {
      fail(
          "%s: tensor '%s' data (offset %llu, %llu bytes of %s) runs past the end of the file "
          "(%zu bytes): truncated file, or a size that disagrees with the type and shape",
          name_.c_str(), t.name.c_str(), static_cast<unsigned long long>(t.offset),
          static_cast<unsigned long long>(t.n_bytes), ggml_type_name(t.type).c_str(), size_);
    }
    t.data = data_ + data_start + t.offset;
  }
  // Tensor data ranges must be disjoint: a tensor whose bytes are also another's is a
  // damaged or hostile file (its weights would be garbage). Sorted by offset, each range
  // must end before the next begins.
  std::vector<const GgufTensor*> by_offset;
  for (const auto& t : tensors_) {
    if (t.n_bytes > 0) by_offset.push_back(&t);
  }
  std::sort(by_offset.begin(), by_offset.end(),
            [](const GgufTensor* a, const GgufTensor* b) { return a->offset < b->offset; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const GgufTensor& a = *by_offset[i - 1];
    const GgufTensor& b = *by_offset[i];
    if (b.offset < a.offset + a.n_bytes) {
      fail(
          "%s: tensor '%s' (%s, %llu bytes at offset %llu) overlaps tensor '%s' at offset %llu: "
          "tensor data must be disjoint, and each size follows from the type and shape",
          name_.c_str(), a.name.c_str(), ggml_type_name(a.type).c_str(),
          static_cast<unsigned long long>(a.n_bytes), static_cast<unsigned long long>(a.offset),
          b.name.c_str(), static_cast<unsigned long long>(b.offset));
    }
  }
}

const GgufValue* GgufFile::find(const std::string& key) const {
  auto it = kv_.find(key);
  return it == kv_.end() ? nullptr : &it->second;
}

static bool is_unsigned(GgufType t) {
  return t == GgufType::kU8 || t == GgufType::kU16 || t == GgufType::kU32 || t == GgufType::kU64;
}
static bool is_signed(GgufType t) {
  return t == GgufType::kI8 || t == GgufType::kI16 || t == GgufType::kI32 || t == GgufType::kI64;
}

std::optional<uint64_t> GgufFile::get_uint_opt(const std::string& key) const {
  const GgufValue* v = find(key);
  if (!v) return std::nullopt;
  if (is_unsigned(v->type)) return v->u;
  if (is_signed(v->type)) {
    if (v->i < 0)
      fail("%s: metadata '%s' = %lld, expected a non-negative integer", name_.c_str(), key.c_str(),
           (long long)v->i);
    return static_cast<uint64_t>(v->i);
  }
  fail("%s: metadata '%s' has type %s, expected an integer", name_.c_str(), key.c_str(),
       gguf_type_name(v->type));
}

uint64_t GgufFile::get_uint(const std::string& key) const {
  auto v = get_uint_opt(key);
  if (!v) fail("%s: missing metadata '%s'", name_.c_str(), key.c_str());
  return *v;
}

std::optional<double> GgufFile::get_float_opt(const std::string& key) const {
  const GgufValue* v = find(key);
  if (!v) return std::nullopt;
  if (v->type == GgufType::kF32 || v->type == GgufType::kF64) return v->f;
  if (is_unsigned(v->type)) return static_cast<double>(v->u);
  if (is_signed(v->type)) return static_cast<double>(v->i);
  fail("%s: metadata '%s' has type %s, expected a number", name_.c_str(), key.c_str(),
       gguf_type_name(v->type));
}

double GgufFile::get_float(const std::string& key) const {
  auto v = get_float_opt(key);
  if (!v) fail("%s: missing metadata '%s'", name_.c_str(), key.c_str());
  return *v;
}

std::optional<std::string> GgufFile::get_string_opt(const std::string& key) const {
  const GgufValue* v = find(key);
  if (!v) return std::nullopt;
  if (v->type != GgufType::kString) {
    fail("%s: metadata '%s' has type %s, expected a string", name_.c_str(), key.c_str(),
         gguf_type_name(v->type));
  }
  return v->s;
}

std::string GgufFile::get_string(const std::string& key) const {
  auto v = get_string_opt(key);
  if (!v) fail("%s: missing metadata '%s'", name_.c_str(), key.c_str());
  return *v;
}

std::optional<bool> GgufFile::get_bool_opt(const std::string& key) const {
  const GgufValue* v = find(key);
  if (!v) return std::nullopt;
  if (v->type != GgufType::kBool) {
    fail("%s: metadata '%s' has type %s, expected a bool", name_.c_str(), key.c_str(),
         gguf_type_name(v->type));
  }
  return v->u != 0;
}

bool GgufFile::get_bool(const std::string& key) const {
  auto v = get_bool_opt(key);
  if (!v) fail("%s: missing metadata '%s'", name_.c_str(), key.c_str());
  return *v;
}

static const GgufValue& need_array(const GgufFile& f, const std::string& key, GgufType elem,
                                   const char* elem_name) {
  const GgufValue* v = f.find(key);
  if (!v) fail("%s: missing metadata '%s'", f.path().c_str(), key.c_str());
  if (v->type != GgufType::kArray || v->elem_type != elem) {
    fail("%s: metadata '%s' is %s%s%s, expected an array of %s", f.path().c_str(), key.c_str(),
         gguf_type_name(v->type), v->type == GgufType::kArray ? " of " : "",
         v->type == GgufType::kArray ? gguf_type_name(v->elem_type) : "", elem_name);
  }
  return *v;
}

uint64_t GgufFile::array_size(const std::string& key) const {
  const GgufValue* v = find(key);
  if (!v) fail("%s: missing metadata '%s'", name_.c_str(), key.c_str());
  if (v->type != GgufType::kArray)
    fail("%s: metadata '%s' is not an array", name_.c_str(), key.c_str());
  return v->count;
}

std::vector<std::string> GgufFile::get_string_array(const std::string& key) const {
  const GgufValue& v = need_array(*this, key, GgufType::kString, "string");
  std::vector<std::string> out;
  out.reserve(static_cast<size_t>(v.count));
  const uint8_t* p = v.elems;
  for (uint64_t j = 0; j < v.count; ++j) {  // lengths were validated while parsing
    uint64_t len;
    std::memcpy(&len, p, 8);
    p += 8;
    out.emplace_back(reinterpret_cast<const char*>(p), static_cast<size_t>(len));
    p += len;
  }
  return out;
}

std::vector<float> GgufFile::get_f32_array(const std::string& key) const {
  const GgufValue& v = need_array(*this, key, GgufType::kF32, "f32");
  std::vector<float> out(static_cast<size_t>(v.count));
  if (v.count) std::memcpy(out.data(), v.elems, out.size() * 4);
  return out;
}

std::vector<int32_t> GgufFile::get_i32_array(const std::string& key) const {
  const GgufValue* v = find(key);
  if (v && v->type == GgufType::kArray && v->elem_type == GgufType::kU32) {
    std::vector<int32_t> out(static_cast<size_t>(v->count));
    if (v->count) std::memcpy(out.data(), v->elems, out.size() * 4);
    return out;
  }
  const GgufValue& a = need_array(*this, key, GgufType::kI32, "i32");
  std::vector<int32_t> out(static_cast<size_t>(a.count));
  if (a.count) std::memcpy(out.data(), a.elems, out.size() * 4);
  return out;
}

const GgufTensor* GgufFile::find_tensor(const std::string& name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

std::string GgufFile::describe(const std::string& key) const {
  const GgufValue* v = find(key);
  if (!v) return "(missing)";
  char buf[64];
  switch (v->type) {
    case GgufType::kString: {
      std::string s = v->s.size() > 60 ? v->s.substr(0, 60) + "..." : v->s;
      return "\"" + s + "\"";
    }
    case GgufType::kArray:
      std::snprintf(buf, sizeof buf, "[%s x %llu]", gguf_type_name(v->elem_type),
                    static_cast<unsigned long long>(v->count));
      return buf;
    case GgufType::kF32:
    case GgufType::kF64:
      std::snprintf(buf, sizeof buf, "%g", v->f);
      return buf;
    case GgufType::kBool:
      return v->u ? "true" : "false";
    default:
      if (is_unsigned(v->type)) return std::to_string(v->u);
      return std::to_string(v->i);
  }
}

bool is_gguf_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  uint32_t magic = 0;
  if (!f.read(reinterpret_cast<char*>(&magic), 4)) return false;
  return magic == kGgufMagic;
}

}  // namespace kivi::io
