// "Did you mean ...?": the known name closest to a mistyped one, for error messages.
#pragma once

#include <string>
#include <vector>

namespace kivi {

// Edit distance (insertions, deletions, substitutions, and swaps of neighbours count 1).
int edit_distance(const std::string& a, const std::string& b);
// The candidate closest to `word` if it is close enough to be a plausible typo (at most
// a third of the word's length in edits, and at least one), or a candidate that starts
// with `word`; "" when none is.
std::string closest_name(const std::string& word, const std::vector<std::string>& candidates);
// " (did you mean 'X'?)" spelled with `prefix` before X, or "" when nothing is close.
std::string did_you_mean(const std::string& word, const std::vector<std::string>& candidates,
                         const std::string& prefix = "");

}  // namespace kivi
