// kivi eval: long-context retrieval (passkey, needle, kv-retrieval) run through a
// session, and the attention recall of block-sparse selection (attn-recall).
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <sys/stat.h>
#include <vector>

#include "common.h"
#include "core/error.h"
#include "core/json.h"
#include "core/progress.h"
#include "core/timer.h"
#include "eval/attn_recall.h"
#include "eval/run.h"
#include "eval/tasks.h"
#include "runtime/session.h"
#include "sparse/options.h"

namespace kivi::tools {

namespace {

// The default text: tinytales.txt where data_file_candidates() looks.
std::string default_text_path() {
  const std::vector<std::string> c = data_file_candidates("tinytales.txt");
  for (const auto& p : c) {
    struct stat st;
    if (stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode)) return p;
  }
  std::string looked;
  for (const auto& p : c) looked += (looked.empty() ? "" : ", ") + p;
  fail("no text given and none found: pass -f FILE (looked for %s)", looked.c_str());
}

std::vector<double> depth_list(const Args& a) {
  std::vector<double> out;
  for (const auto& s : a.list("depths")) {
    char* end = nullptr;
    errno = 0;
    const double d = std::strtod(s.c_str(), &end);
    if (s.empty() || *end != '\0' || errno == ERANGE || !(d >= 0.0 && d <= 1.0))
      fail("--depths: '%s' is not a number from 0 to 1", s.c_str());
    out.push_back(d);
  }
  if (out.empty()) fail("--depths: empty list");
  return out;
}

int run_retrieval(const Args& a, eval::Task task) {
  const bool json = a.flag("json");
  for (const char* o : {"every"}) {
    if (a.given(o)) fail("--%s applies to --task attn-recall only", o);
  }
  for (const char* o : {"sparse", "sparse-budget"}) {
    if (a.given(o) && a.list(o).size() > 1)
      fail("--%s: the retrieval tasks run one session (lists are for attn-recall)", o);
  }
  auto m = load_model(a);
  const tok::Tokenizer& t = m->tokenizer();
  if (!a.given("ctx")) {
    fail("--task %s: give the prompt lengths with --ctx LIST (e.g. 256,448)",
         eval::task_name(task));
  }
  std::vector<int> ctxs;
  for (int64_t c : a.int_list("ctx", 1, model::kMaxContext)) ctxs.push_back(static_cast<int>(c));
  const std::vector<double> depths = depth_list(a);
  const int trials = static_cast<int>(a.integer("trials", 1, 100000));
  const uint64_t seed = static_cast<uint64_t>(a.integer("seed", 0, INT64_MAX));
  const int max_ctx = *std::max_element(ctxs.begin(), ctxs.end());
  if (!m->config().synthetic && max_ctx > m->config().ctx) {
    fail("--ctx %d: prompts of %d tokens do not fit the model's context of %d tokens", max_ctx,
         max_ctx, m->config().ctx);
  }
  std::string haystack_name;
  eval::Haystack haystack;
  if (task == eval::Task::kNeedle) {
    haystack_name = a.given("file") ? a.str("file") : default_text_path();
    const std::string text =
        haystack_name == "filler" ? eval::passkey_filler() : read_text_file(haystack_name);
    if (text.find_first_not_of(" \t\r\n") == std::string::npos)
      fail("%s: the haystack is empty", haystack_name.c_str());
    haystack = eval::Haystack(t, text);
  } else if (a.given("file")) {
    fail("-f/--file: --task %s uses no text file", eval::task_name(task));
  }
  const std::vector<eval::Prompt> prompts =
      eval::make_prompts(task, t, haystack, ctxs, depths, trials, seed);
  const int fixed_answer =
      a.given("max-tokens") ? static_cast<int>(a.integer("max-tokens", 1, 1 << 20)) : 0;
  auto answer_budget = [&](const eval::Prompt& p) {
    return fixed_answer > 0 ? fixed_answer : p.answer_tokens + 8;
  };
  int need = 0, longest = 0, answer = 0;
  for (const auto& p : prompts) {
    const int n = static_cast<int>(p.tokens.size());
    if (n + answer_budget(p) > need) {
      need = n + answer_budget(p);
      longest = n;
      answer = answer_budget(p);
    }
  }
  if (!m->config().synthetic && need > m->config().ctx) {
    fail(
        "--ctx %d: a prompt of %d tokens and its answer of up to %d tokens need %d tokens; the "
        "model's context is %d (give shorter --ctx lengths)",
        max_ctx, longest, answer, need, m->config().ctx);
  }
  runtime::SessionOptions opt = session_options(a, *m, "", need);
  runtime::Session s(*m, opt);

  std::vector<eval::Outcome> outcomes;
  Progress bar(std::string("eval ") + eval::task_name(task), static_cast<int64_t>(prompts.size()),
               "prompt", !json);
  for (const auto& p : prompts) {
    outcomes.push_back(eval::run_prompt(s, p, answer_budget(p)));
    bar.update(static_cast<int64_t>(outcomes.size()));
  }
  bar.finish();
  const std::vector<eval::Cell> cells = eval::tabulate(outcomes);
  int correct = 0;
  for (const auto& o : outcomes) correct += o.correct ? 1 : 0;
  const double overall = outcomes.empty() ? 0.0 : double(correct) / outcomes.size();
  const std::string sparse_desc = sparse::describe(s.options().sparse);

  if (json) {
    JsonWriter j;
    j.begin_object();
    j.kv("task", eval::task_name(task)).kv("model", m->path());
    j.kv("kv_cache", describe_cache(s.options().cache)).kv("sparse", sparse_desc);
    j.kv("seed", static_cast<uint64_t>(seed)).kv("trials", trials).kv("session_ctx", s.ctx());
    if (!haystack_name.empty()) j.kv("haystack", haystack_name);
    j.kv("accuracy", overall);
    j.key("results").begin_array();
    for (const auto& c : cells) {
      j.begin_object().kv("task", c.task).kv("ctx", c.ctx).kv("depth", c.depth);
      j.kv("trials", c.trials).kv("correct", c.correct).kv("accuracy", c.accuracy());
      j.kv("tokens_per_second", c.tokens_per_second()).end_object();
    }
    j.end_array();
    j.key("outcomes").begin_array();
    for (size_t i = 0; i < outcomes.size(); ++i) {
      const auto& o = outcomes[i];
      j.begin_object().kv("ctx", o.ctx).kv("depth", o.depth).kv("trial", prompts[i].trial);
      j.kv("prompt_tokens", o.prompt_tokens).kv("expected", prompts[i].expected);
      j.kv("generated", o.generated).kv("correct", o.correct).end_object();
    }
    j.end_array().end_object();
    std::printf("%s\n", j.str().c_str());
    return 0;
  }
  std::printf("model     %s\n", m->path().c_str());
  std::printf("KV cache  %s\n", describe_cache(s.options().cache).c_str());
  if (!sparse_desc.empty()) std::printf("sparse    %s\n", sparse_desc.c_str());
  if (!haystack_name.empty()) std::printf("haystack  %s\n", haystack_name.c_str());
  std::printf("%d trial%s per cell, seed %llu, greedy\n\n", trials, trials == 1 ? "" : "s",
              static_cast<unsigned long long>(seed));
  std::printf("%-13s %8s %6s %9s %8s %10s\n", "task", "ctx", "depth", "accuracy", "correct",
              "tokens/s");
  for (const auto& c : cells) {
    std::printf("%-13s %8d %6.2f %8.1f%% %4d/%-3d %10.1f\n", c.task.c_str(), c.ctx, c.depth,
                100.0 * c.accuracy(), c.correct, c.trials, c.tokens_per_second());
  }
  std::printf("\noverall accuracy %.1f%% (%d of %zu)\n", 100.0 * overall, correct, outcomes.size());
  return 0;
}

int run_attn_recall(const Args& a) {
  const bool json = a.flag("json");
  for (const char* o : {"depths", "trials", "seed", "max-tokens"}) {
    if (a.given(o)) fail("--%s applies to the retrieval tasks, not to attn-recall", o);
  }
  auto m = load_model(a);
  const std::string path = a.given("file") ? a.str("file") : default_text_path();
  const std::vector<int> all =
      m->tokenizer().encode(read_text_file(path), m->tokenizer().add_bos());
  int n = static_cast<int>(all.size());
  if (a.given("ctx")) {
    const auto c = a.int_list("ctx", 1, model::kMaxContext);
    if (c.size() != 1) fail("--ctx: attn-recall runs one length (got %zu)", c.size());
    if (c[0] > n) {
      fail("--ctx %lld: %s has only %d tokens", static_cast<long long>(c[0]), path.c_str(), n);
    }
    n = static_cast<int>(c[0]);
  }
  if (!m->config().synthetic && n > m->config().ctx) {
    if (a.given("ctx")) {
      fail("--ctx %d: more than the model's context of %d tokens", n, m->config().ctx);
    }
    n = m->config().ctx;
  }
  const std::vector<int> tokens(all.begin(), all.begin() + n);
  runtime::SessionOptions opt = session_options(a, *m, "", n, false);
  if (opt.forward.window > 0)
    fail("--window: attn-recall measures selections over the whole cache");
  if (opt.overflow != runtime::ContextOverflow::kStop)
    fail("--context-overflow: attn-recall needs stop (the whole text stays in the cache)");
  runtime::Session s(*m, opt);

  eval::RecallOptions ro;
  ro.sparse.block = static_cast<int>(a.integer("sparse-block", 1, 65536));
  ro.sparse.sinks = static_cast<int>(a.integer("sparse-sinks", 0, model::kMaxContext));
  ro.sparse.local = static_cast<int>(a.integer("sparse-local", 1, model::kMaxContext));
  ro.sparse.dense_layers = static_cast<int>(a.integer("sparse-dense-layers", 0, 1 << 16));
  ro.sparse.kind = sparse::Kind::kQuest;  // validated as any enabled kind
  ro.sparse.validate();
  if (ro.sparse.dense_layers >= m->config().n_layers) {
    fail("--sparse-dense-layers %d: the model has %d layers (none would be measured)",
         ro.sparse.dense_layers, m->config().n_layers);
  }
  ro.kinds = eval::parse_recall_kinds(
      a.given("sparse") ? a.list("sparse")
                        : std::vector<std::string>{"quest", "max", "mean", "random", "local"});
  if (a.given("sparse-budget")) {
    for (int64_t b : a.int_list("sparse-budget", 0, model::kMaxContext))
      ro.budgets.push_back(static_cast<int>(b));
  } else {
    for (int f : {16, 8, 4}) {
      ro.budgets.push_back(std::max(1, n / f / ro.sparse.block) * ro.sparse.block);
    }
    ro.budgets.erase(std::unique(ro.budgets.begin(), ro.budgets.end()), ro.budgets.end());
  }
  ro.every = static_cast<int>(a.integer("every", 1, model::kMaxContext));
  kv::CacheConfig cc = s.cache().config();
  eval::AttnRecall recall(ro, cc, m->config().n_heads);
  if (recall.first_position() > n) {
    fail(
        "attn-recall: %d tokens leave no position to measure (the first is %d: --sparse-local %d "
        "+ --sparse-block %d); give a longer --ctx or a smaller window",
        n, recall.first_position(), ro.sparse.local, ro.sparse.block);
  }
  s.set_attention_observer(&recall);
  Progress bar("eval attn-recall", n, "tok", !json);
  const double t0 = now_seconds();
  constexpr int kChunk = 64;
  for (int i = 0; i < n; i += kChunk) {
    const int e = std::min(n, i + kChunk);
    s.prefill(std::vector<int>(tokens.begin() + i, tokens.begin() + e));
    bar.update(e);
  }
  bar.finish();
  s.set_attention_observer(nullptr);
  const double secs = now_seconds() - t0;
  const auto& sel = recall.selections();
  const int L = recall.n_layers();

  if (json) {
    JsonWriter j;
    j.begin_object();
    j.kv("task", "attn-recall").kv("model", m->path()).kv("text", path).kv("tokens", n);
    j.kv("kv_cache", describe_cache(cc)).kv("block", ro.sparse.block).kv("sinks", ro.sparse.sinks);
    j.kv("local", ro.sparse.local).kv("dense_layers", ro.sparse.dense_layers);
    j.kv("first", recall.first_position()).kv("every", ro.every);
    j.kv("positions", recall.positions()).kv("seconds", secs);
    j.key("results").begin_array();
    for (size_t i = 0; i < sel.size(); ++i) {
      const eval::RecallSums o = recall.overall(static_cast<int>(i));
      j.begin_object().kv("kind", sel[i].kind.name()).kv("budget", sel[i].budget);
      j.kv("attended", o.mean_attended()).kv("mass", o.mean_mass()).kv("error", o.mean_error());
      j.key("layers").begin_array();
      for (int l = 0; l < L; ++l) {
        if (!recall.measured_layer(l)) continue;
        const eval::RecallSums& r = recall.sums(static_cast<int>(i), l);
        j.begin_object().kv("layer", l).kv("attended", r.mean_attended());
        j.kv("mass", r.mean_mass()).kv("error", r.mean_error()).end_object();
      }
      j.end_array().end_object();
    }
    j.end_array().end_object();
    std::printf("%s\n", j.str().c_str());
    return 0;
  }
  std::printf("model     %s\n", m->path().c_str());
  std::printf("KV cache  %s\n", describe_cache(cc).c_str());
  std::printf("text      %s: %d tokens, %lld positions measured (every %d from %d)\n", path.c_str(),
              n, static_cast<long long>(recall.positions()), ro.every, recall.first_position());
  std::printf("blocks of %d, sinks %d, local %d", ro.sparse.block, ro.sparse.sinks,
              ro.sparse.local);
  if (ro.sparse.dense_layers > 0)
    std::printf(", first %d layers dense (not measured)", ro.sparse.dense_layers);
  std::printf("\n\n%-14s %9s %8s %8s\n", "selection", "attended", "mass", "error");
  for (size_t i = 0; i < sel.size(); ++i) {
    const eval::RecallSums o = recall.overall(static_cast<int>(i));
    std::printf("%-14s %8.1f%% %8.4f %8.4f\n", sel[i].label().c_str(), 100.0 * o.mean_attended(),
                o.mean_mass(), o.mean_error());
  }
  for (int what = 0; what < 2; ++what) {
    std::printf("\n%s by layer\n%-14s", what == 0 ? "mass" : "error", "selection");
    for (int l = 0; l < L; ++l) {
      if (recall.measured_layer(l)) std::printf(" %7s", strfmt("L%d", l).c_str());
    }
    std::printf("\n");
    for (size_t i = 0; i < sel.size(); ++i) {
      std::printf("%-14s", sel[i].label().c_str());
      for (int l = 0; l < L; ++l) {
        if (!recall.measured_layer(l)) continue;
        const eval::RecallSums& r = recall.sums(static_cast<int>(i), l);
        std::printf(" %7.4f", what == 0 ? r.mean_mass() : r.mean_error());
      }
      std::printf("\n");
    }
  }
  std::printf("\n%.2f s\n", secs);
  return 0;
}

}  // namespace

int cmd_eval(int argc, char** argv) {
  Args a(
      "eval",
      "[-m MODEL] --task passkey|needle|kv-retrieval|attn-recall [--ctx LIST] [--depths LIST] "
      "[--trials N] [KV options] [sparse options] [--json]",
      "Long-context retrieval and the quality of block-sparse attention.\n"
      "\n"
      "passkey, needle, kv-retrieval: for each length in --ctx, depth in --depths and trial, a\n"
      "seeded prompt of that many tokens (BOS included) hides an item at that depth (0 = at the\n"
      "start, 1 = just before the question) and ends with a question whose answer continues "
      "it:\n"
      "  passkey       filler text with \"The pass key is NNNNN. Remember it.\"\n"
      "  needle        \"The special magic number for WORD is: NNNNNNN.\" in a haystack (-f FILE,\n"
      "                or -f filler for the passkey filler)\n"
      "  kv-retrieval  a JSON-like object of random UUID keys and values; one key's value is\n"
      "                asked (whole pairs: up to one pair shorter than --ctx)\n"
      "Each prompt runs through one session (the KV cache and --sparse options given) with\n"
      "greedy decoding; it is correct when the generated text contains the answer. Reports the\n"
      "accuracy and tokens/s per (task, ctx, depth). A prompt and its answer must fit the\n"
      "model's context.\n"
      "\n"
      "attn-recall: runs a text (-f, default tinytales) through the model with the KV cache\n"
      "given (dense attention) and, every --every positions, for each layer and KV head,\n"
      "compares the selection of each --sparse kind (a list: quest, max, mean, random, local =\n"
      "sinks and local window only; default all) at each --sparse-budget (a list; default 1/16,\n"
      "1/8 and 1/4 of the text in whole blocks) with dense attention over the same cache: the\n"
      "share of the softmax mass the selected tokens hold and the relative L2 error of the\n"
      "attention output, averaged per layer and over layers. --ctx: the tokens of the text run\n"
      "(default: all that fit the model's context).");
  a.section("Evaluation");
  a.add("task", 0, "TASK", "passkey, needle, kv-retrieval or attn-recall.", "passkey");
  a.add("depths", 0, "LIST", "Depths of the hidden item, from 0 (start) to 1 (end).",
        "0,0.25,0.5,0.75,1");
  a.add("trials", 0, "N", "Prompts per length and depth (each with its own seed).", "5");
  a.add("seed", 0, "N", "Seed of the prompts (the same seed gives the same prompts).", "1");
  a.add("file", 'f', "FILE",
        "needle: the haystack ('filler': the passkey filler); attn-recall: the text run. "
        "Default: tinytales.txt from data/ or ../shared/data/, else beside the binary "
        "(../share/kivi/ when installed).");
  a.add("max-tokens", 0, "N",
        "Tokens generated per prompt at most (default: the answer's tokens + 8); generation "
        "stops early once the answer appears.");
  a.add("every", 0, "N", "attn-recall: measure every N positions.", "16");
  a.add_flag("json", 0,
             "Print one JSON object: the retrieval tasks' results per cell and outcome per prompt, "
             "or attn-recall's results per selection and layer.");
  add_model_options(a,
                    "Retrieval tasks: comma-separated prompt lengths in tokens (k = 1024), e.g. "
                    "1k,4k. attn-recall: the tokens of the text run. The session is sized to fit.");
  add_kv_options(a);
  add_sparse_options(a, true);
  if (!parse_command_line(a, argc, argv)) return 0;  // --help printed
  const std::string task = a.str("task");
  if (task == "attn-recall") return run_attn_recall(a);
  return run_retrieval(a, eval::parse_task(task));
}

}  // namespace kivi::tools
