// Generated text on its way to a client: pieces arrive token by token (whole UTF-8
// characters, from tok::StreamDecoder), and what is released must never need taking
// back. An ending that could be the start of a stop string is held back; when a stop
// string appears, the text before it is released and generation ends, the stop string
// and anything after it dropped (OpenAI's `stop`).
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

}  // namespace kivi::runtime
