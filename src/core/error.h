// Errors that reach the user: a typed exception carrying one line that names the
// file, the field and the expected range. Loaders and everything that reads user
// input throw kivi::Error; invariants inside kernels are asserts.
#pragma once

#include <stdexcept>
#include <string>

namespace kivi {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// printf-style formatting into a std::string.
std::string strfmt(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

// Throws kivi::Error with a printf-style message.
[[noreturn]] void fail(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

}  // namespace kivi
