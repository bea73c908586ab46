#include "core/error.h"

#include <cstdarg>
#include <cstdio>

namespace kivi {

static std::string vstrfmt(const char* fmt, va_list args) {
  va_list copy;
  va_copy(copy, args);
  const int n = std::vsnprintf(nullptr, 0, fmt, copy);
  va_end(copy);
  std::string out(n > 0 ? static_cast<size_t>(n) : 0, '\0');
  if (n > 0) std::vsnprintf(out.data(), out.size() + 1, fmt, args);
  return out;
}

std::string strfmt(const char* fmt, ...) {
  va_list args;
  va_start(args, fmt);
  std::string s = vstrfmt(fmt, args);
  va_end(args);
  return s;
}

void fail(const char* fmt, ...) {
  va_list args;
  va_start(args, fmt);
  std::string s = vstrfmt(fmt, args);
  va_end(args);
  throw Error(s);
}

}  // namespace kivi
