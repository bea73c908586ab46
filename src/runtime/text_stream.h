// Generated text on its way to a client: pieces arrive token by token, and what is
// released must never need taking back. Two things are held back:
//   - an incomplete UTF-8 sequence at the end (a character split over byte tokens);
//   - an ending that could be the start of a stop string.
// When a stop string appears, the text before it is released and generation ends;
// the stop string and anything after it are dropped (OpenAI's `stop`).
#pragma once

#include <string>
#include <vector>

namespace kivi::runtime {

class TextStream {
 public:
  explicit TextStream(std::vector<std::string> stop = {});

  // Adds a piece; returns the text that can be released now.
  std::string push(const std::string& piece);
  // At the end of generation: everything still held (a stop string cannot complete now).
  std::string finish();
  bool stopped() const { return stopped_; }
  // Everything released so far.
  const std::string& text() const { return released_; }

 private:
  std::vector<std::string> stop_;
  std::string held_, released_;
  bool stopped_ = false;
};

// Length of the longest prefix of s that does not end inside a UTF-8 sequence which
// the next bytes could still complete.
size_t utf8_complete_prefix(const std::string& s);
// Whether s is valid UTF-8 (no overlong forms, no surrogates, at most U+10FFFF).
bool utf8_valid(const char* s, size_t n);

}  // namespace kivi::runtime
