// A small JSON writer for the tools' --json output: one object, keys in insertion order.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace kivi {

class JsonWriter {
 public:
  JsonWriter& begin_object();
  JsonWriter& end_object();
  JsonWriter& begin_array();
  JsonWriter& end_array();
  JsonWriter& key(std::string_view k);

  JsonWriter& value(std::string_view s);
  JsonWriter& value(const char* s) { return value(std::string_view(s)); }
  JsonWriter& value(const std::string& s) { return value(std::string_view(s)); }
  JsonWriter& value(double d);
  JsonWriter& value(float f) { return value(static_cast<double>(f)); }
  JsonWriter& value(int64_t i);
  JsonWriter& value(int i) { return value(static_cast<int64_t>(i)); }
  JsonWriter& value(uint64_t i);

  JsonWriter& value(bool b);
  JsonWriter& null();

  template <class T>
  JsonWriter& kv(std::string_view k, const T& v) {
    key(k);
    return value(v);
  }

  const std::string& str() const { return out_; }

 private:
  void comma();
  std::string out_;
  std::vector<bool> first_;  // per open container: no element written yet
  bool after_key_ = false;
};

// Escapes a string for JSON (quotes included). Invalid UTF-8 bytes become U+FFFD.
std::string json_quote(std::string_view s);

}  // namespace kivi
