#include "eval/score.h"

namespace kivi::eval {

bool exact_match(const std::string& generated, const std::string& expected) {
  return !expected.empty() && generated.find(expected) != std::string::npos;
}

std::vector<Cell> tabulate(const std::vector<Outcome>& outcomes) {
  std::vector<Cell> cells;
  for (const Outcome& o : outcomes) {
    Cell* c = nullptr;
    for (Cell& x : cells) {
      if (x.task == o.task && x.ctx == o.ctx && x.depth == o.depth) c = &x;
    }
    if (!c) {
      cells.push_back(Cell{o.task, o.ctx, o.depth});
      c = &cells.back();
    }
    c->trials += 1;
    c->correct += o.correct ? 1 : 0;
    c->tokens += o.prompt_tokens + o.generated_tokens;
    c->seconds += o.seconds;
  }
  return cells;
}

}  // namespace kivi::eval
