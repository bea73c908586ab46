#include "runtime/text_stream.h"

#include <algorithm>

namespace kivi::runtime {

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
  const size_t cut = held_.size() - keep;
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
