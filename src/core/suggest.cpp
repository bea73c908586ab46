#include "core/suggest.h"

#include <algorithm>

namespace kivi {

int edit_distance(const std::string& a, const std::string& b) {
  const size_t n = a.size(), m = b.size();
  // Optimal string alignment distance over three rows.
  std::vector<int> prev2(m + 1), prev(m + 1), cur(m + 1);
  for (size_t j = 0; j <= m; ++j) prev[j] = static_cast<int>(j);
  for (size_t i = 1; i <= n; ++i) {
    cur[0] = static_cast<int>(i);
    for (size_t j = 1; j <= m; ++j) {
      const int cost = a[i - 1] == b[j - 1] ? 0 : 1;
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        cur[j] = std::min(cur[j], prev2[j - 2] + 1);
    }
    std::swap(prev2, prev);
    std::swap(prev, cur);
  }
  return prev[m];
}

std::string closest_name(const std::string& word, const std::vector<std::string>& candidates) {
  if (word.empty()) return "";
  const int limit = std::max(1, static_cast<int>(word.size()) / 3);
  std::string best;
  int best_d = limit + 1;
  for (const auto& c : candidates) {
    const int d = edit_distance(word, c);
    if (d < best_d) {
      best_d = d;
      best = c;
    }
  }
  if (!best.empty()) return best;
  for (const auto& c : candidates) {
    if (word.size() >= 3 && c.rfind(word, 0) == 0) return c;
  }
  return "";
}

std::string did_you_mean(const std::string& word, const std::vector<std::string>& candidates,
                         const std::string& prefix) {
  const std::string c = closest_name(word, candidates);
  return c.empty() ? "" : " (did you mean '" + prefix + c + "'?)";
}

}  // namespace kivi
