#include "eval/tasks.h"

#include "core/error.h"

namespace kivi::eval {

Task parse_task(const std::string& s) {
  if (s == "passkey") return Task::kPasskey;
  if (s == "needle") return Task::kNeedle;
  if (s == "kv-retrieval") return Task::kKvRetrieval;
  fail("--task: unknown value '%s' (valid: passkey, needle, kv-retrieval, attn-recall)", s.c_str());
}

const char* task_name(Task t) {
  switch (t) {
    case Task::kPasskey:
      return "passkey";
    case Task::kNeedle:
      return "needle";
    case Task::kKvRetrieval:
      return "kv-retrieval";
  }
  return "?";
}

std::vector<Prompt> make_prompts(Task task, const tok::Tokenizer& t, const Haystack& haystack,
                                 const std::vector<int>& ctxs, const std::vector<double>& depths,
                                 int trials, uint64_t seed) {
  std::vector<Prompt> out;
  Haystack filler;
  if (task == Task::kPasskey) filler = Haystack(t, passkey_filler());
  for (int ctx : ctxs) {
    for (size_t d = 0; d < depths.size(); ++d) {
      for (int i = 0; i < trials; ++i) {
        const uint64_t s = prompt_seed(seed, task_name(task), ctx, static_cast<int>(d), i);
        Prompt p = task == Task::kPasskey  ? make_passkey(t, filler, ctx, depths[d], s)
                   : task == Task::kNeedle ? make_needle(t, haystack, ctx, depths[d], s)
                                           : make_kv_retrieval(t, ctx, depths[d], s);
        p.trial = i;
        out.push_back(std::move(p));
      }
    }
  }
  return out;
}

}  // namespace kivi::eval
