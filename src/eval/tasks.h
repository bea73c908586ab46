// The retrieval tasks: prompts of a requested length with an item hidden at a requested
// depth and a question about it at the end, seeded so that the same options give the
// same prompts.
//   passkey:      the passkey test's filler with "The pass key is NNNNN. Remember it.
//                 NNNNN is the pass key." hidden in it; answer: the five digits.
//   needle:       "The special magic number for WORD is: NNNNNNN." hidden in a haystack
//                 (a text file, or the passkey filler); answer: the seven digits.
//   kv-retrieval: a JSON-like object of random UUID keys and values (Liu et al. 2023,
//                 Lost in the Middle); the question names the key at the depth; answer:
//                 its value. Its length is whole pairs: up to one pair short of ctx.
// The question ends where the answer begins ("... The pass key is"), so a base model
// answers by continuing the text.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "eval/prompt.h"

namespace kivi::eval {

enum class Task : uint8_t { kPasskey, kNeedle, kKvRetrieval };
// "passkey", "needle", "kv-retrieval"; parse_task throws naming the valid ones.
Task parse_task(const std::string& s);
const char* task_name(Task t);

Prompt make_passkey(const tok::Tokenizer& t, const Haystack& filler, int ctx, double depth,
                    uint64_t seed);
// The haystack is read from a random sentence start of it.
Prompt make_needle(const tok::Tokenizer& t, const Haystack& haystack, int ctx, double depth,
                   uint64_t seed);
Prompt make_kv_retrieval(const tok::Tokenizer& t, int ctx, double depth, uint64_t seed);

// Every prompt of a run: for each length, depth and trial (in that order), seeded by
// prompt_seed(seed, task name, ctx, depth index, trial). `haystack` is the needle's
// (passkey uses its own filler; kv-retrieval none).
std::vector<Prompt> make_prompts(Task task, const tok::Tokenizer& t, const Haystack& haystack,
                                 const std::vector<int>& ctxs, const std::vector<double>& depths,
                                 int trials, uint64_t seed);

}  // namespace kivi::eval
