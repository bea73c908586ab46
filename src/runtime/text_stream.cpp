#include "runtime/text_stream.h"

#include <algorithm>

namespace kivi::runtime {

namespace {
// Bytes in the sequence a lead byte starts; 0 for a byte that cannot start one.
int utf8_length(unsigned char c) {
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF) return 2;
  if (c >= 0xE0 && c <= 0xEF) return 3;
  if (c >= 0xF0 && c <= 0xF4) return 4;
  return 0;
}
bool is_continuation(unsigned char c) { return (c & 0xC0) == 0x80; }
}  // namespace

size_t utf8_complete_prefix(const std::string& s) {
  const size_t n = s.size();
  // The last byte that is not a continuation byte, within the last four.
  for (size_t back = 1; back <= std::min<size_t>(4, n); ++back) {
    const size_t i = n - back;
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (is_continuation(c)) continue;
    const int len = utf8_length(c);
    // A lead byte whose sequence is not finished yet: hold it and what follows.
    if (len > 1 && static_cast<size_t>(len) > back) return i;
    return n;
  }
  return n;  // only continuation bytes at the end: nothing can complete them
}

bool utf8_valid(const char* p, size_t n) {
  const unsigned char* s = reinterpret_cast<const unsigned char*>(p);
  size_t i = 0;
  while (i < n) {
    const unsigned char c = s[i];
    const int len = utf8_length(c);
    if (len == 0 || i + len > n) return false;
    for (int k = 1; k < len; ++k) {
      if (!is_continuation(s[i + k])) return false;
    }
    if (len == 3) {
      if (c == 0xE0 && s[i + 1] < 0xA0) return false;   // overlong
      if (c == 0xED && s[i + 1] >= 0xA0) return false;  // UTF-16 surrogates
    } else if (len == 4) {
      if (c == 0xF0 && s[i + 1] < 0x90) return false;   // overlong
      if (c == 0xF4 && s[i + 1] >= 0x90) return false;  // above U+10FFFF
    }
    i += len;
  }
  return true;
}

TextStream::TextStream(std::vector<std::string> stop) {
  for (auto& s : stop) {
    if (!s.empty()) stop_.push_back(std::move(s));
  }
}

std::string TextStream::push(const std::string& piece) {
  if (stopped_) return {};
  held_ += piece;
  size_t first = std::string::npos;
  for (const auto& s : stop_) first = std::min(first, held_.find(s));
  if (first != std::string::npos) {
    std::string out = held_.substr(0, first);
    held_.clear();
    released_ += out;
    stopped_ = true;
    return out;
  }
  // Hold the longest ending that is the beginning of a stop string.
  size_t keep = 0;
  for (const auto& s : stop_) {
    for (size_t k = std::min(s.size() - 1, held_.size()); k > keep; --k) {
      if (held_.compare(held_.size() - k, k, s, 0, k) == 0) {
        keep = k;
        break;
      }
    }
  }
  const size_t cut = std::min(held_.size() - keep, utf8_complete_prefix(held_));
  std::string out = held_.substr(0, cut);
  held_.erase(0, cut);
  released_ += out;
  return out;
}

std::string TextStream::finish() {
  if (stopped_) return {};
  std::string out;
  out.swap(held_);
  released_ += out;
  return out;
}

}  // namespace kivi::runtime
