// Scoring the retrieval tasks: exact match (the generated text contains the expected
// string) and the accuracy of each (task, length, depth) cell.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kivi::eval {

// Whether `generated` contains `expected` (a non-empty string), byte for byte.
bool exact_match(const std::string& generated, const std::string& expected);

// One prompt's result.
struct Outcome {
  std::string task;
  int ctx = 0;
  double depth = 0.0;
  bool correct = false;
  std::string generated;
  int prompt_tokens = 0, generated_tokens = 0;
  double seconds = 0.0;  // prefill and generation
};

// The outcomes of one task, length and depth.
struct Cell {
  std::string task;
  int ctx = 0;
  double depth = 0.0;
  int trials = 0, correct = 0;
  int64_t tokens = 0;  // prompt and generated
  double seconds = 0.0;
  double accuracy() const { return trials ? double(correct) / trials : 0.0; }
  double tokens_per_second() const { return seconds > 0 ? tokens / seconds : 0.0; }
};

// Groups outcomes by (task, ctx, depth) in order of first appearance.
std::vector<Cell> tabulate(const std::vector<Outcome>& outcomes);

}  // namespace kivi::eval
