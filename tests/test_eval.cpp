// The evaluation harness: the retrieval prompts (deterministic by seed, of the requested
// length, the item at the requested depth, errors for lengths that leave no room), the
// exact-match scorer, and attention recall against an independent double-precision
// computation (full budget: mass 1 and no error; a planted block is captured) and
// through the CLI.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "attn/attention.h"
#include "core/error.h"
#include "core/rng.h"
#include "eval/attn_recall.h"
#include "eval/prompt.h"
#include "eval/run.h"
#include "eval/score.h"
#include "eval/tasks.h"
#include "kv/kv_cache.h"
#include "runtime/session.h"
#include "sparse/sparse_attention.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace kivi {
namespace {

std::string read_text(const std::string& path) {
  const auto bytes = test::read_file(path);
  return std::string(bytes.begin(), bytes.end());
}

// The number after the first occurrence of `key` in `s` (NaN when absent).
double number_after(const std::string& s, const std::string& key) {
  const size_t at = s.find(key);
  return at == std::string::npos ? NAN : std::strtod(s.c_str() + at + key.size(), nullptr);
}

const tok::Tokenizer& tokenizer() {
  static const tok::Tokenizer t = tok::Tokenizer::from_llama2c(test::tokenizer_path(), 512);
  return t;
}

const eval::Haystack& tales() {
  static const eval::Haystack h(tokenizer(), read_text(test::text_path()));
  return h;
}

// run_prompt against answers known in advance: stories260K's published greedy text
// continues "Once upon a time" with ", there was a little girl named Lily".
TEST(Eval, RunPromptFindsAPlantedAnswerAndStopsThere) {
  KIVI_REQUIRE_MODEL();
  runtime::SessionOptions so;
  so.threads = 1;
  so.ctx = 128;
  runtime::Session s(test::stories(), so);
  eval::Prompt p;
  p.task = "passkey";
  p.tokens = test::stories().tokenizer().encode("Once upon a time", true);
  p.expected = "little girl";
  const eval::Outcome o = eval::run_prompt(s, p, 40);
  EXPECT_TRUE(o.correct) << o.generated;
  EXPECT_EQ(o.generated, ", there was a little girl") << o.generated;
  // It stops as soon as the answer is there: ", there was a little girl" is 8 tokens
  // (`kivi generate -p "Once upon a time" -n 8 --temp 0` writes exactly it).
  EXPECT_EQ(o.generated_tokens, 8);
  EXPECT_EQ(o.prompt_tokens, 5);
  // An answer the model does not give is wrong after max_tokens.
  p.expected = "dragon";
  const eval::Outcome w = eval::run_prompt(s, p, 12);
  EXPECT_FALSE(w.correct);
  EXPECT_EQ(w.generated_tokens, 12);
  // No answer tokens at all: nothing generated, and nothing can be correct.
  const eval::Outcome z = eval::run_prompt(s, p, 0);
  EXPECT_EQ(z.generated_tokens, 0);
  EXPECT_EQ(z.generated, "");
  EXPECT_FALSE(z.correct);
}

TEST(Eval, ScorerIsExactContainment) {
  EXPECT_TRUE(eval::exact_match(" 12345.", "12345"));
  EXPECT_TRUE(eval::exact_match("12345", "12345"));
  EXPECT_FALSE(eval::exact_match(" 1234 5", "12345"));
  EXPECT_FALSE(eval::exact_match(" 12346", "12345"));
  EXPECT_FALSE(eval::exact_match("anything", ""));
  std::vector<eval::Outcome> o(5);
  for (int i = 0; i < 5; ++i) {
    o[i].task = "passkey";
    o[i].ctx = i < 3 ? 256 : 448;
    o[i].correct = i % 2 == 0;
    o[i].prompt_tokens = 100;
    o[i].generated_tokens = 10;
    o[i].seconds = 0.5;
  }
  const auto cells = eval::tabulate(o);
  ASSERT_EQ(cells.size(), 2u);
  EXPECT_EQ(cells[0].ctx, 256);
  EXPECT_EQ(cells[0].trials, 3);
  EXPECT_EQ(cells[0].correct, 2);
  EXPECT_EQ(cells[1].correct, 1);
  EXPECT_DOUBLE_EQ(cells[1].accuracy(), 0.5);
  EXPECT_DOUBLE_EQ(cells[0].tokens_per_second(), 330 / 1.5);
}

// Same seed, same prompts; another seed, other answers.
TEST(Eval, PromptsAreDeterministicBySeed) {
  for (auto task : {eval::Task::kPasskey, eval::Task::kNeedle, eval::Task::kKvRetrieval}) {
    const auto a = eval::make_prompts(task, tokenizer(), tales(), {300}, {0.0, 0.5, 1.0}, 3, 7);
    const auto b = eval::make_prompts(task, tokenizer(), tales(), {300}, {0.0, 0.5, 1.0}, 3, 7);
    const auto c = eval::make_prompts(task, tokenizer(), tales(), {300}, {0.0, 0.5, 1.0}, 3, 8);
    ASSERT_EQ(a.size(), 9u);
    int differ = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_EQ(a[i].tokens, b[i].tokens) << eval::task_name(task) << " " << i;
      EXPECT_EQ(a[i].expected, b[i].expected);
      differ += a[i].expected != c[i].expected;
    }
    EXPECT_GE(differ, 8) << eval::task_name(task);
    // The trials of a cell differ from each other.
    EXPECT_NE(a[0].expected, a[1].expected) << eval::task_name(task);
  }
}

// Every prompt is as long as asked (passkey and needle: up to kWordSlack tokens short;
// kv-retrieval: up to one pair short), starts with BOS, holds its answer at the
// requested depth and ends with the question.
TEST(Eval, PromptsHaveTheRequestedLengthAndDepth) {
  const auto& t = tokenizer();
  const std::vector<double> depths = {0.0, 0.25, 0.5, 0.75, 1.0};
  for (auto task : {eval::Task::kPasskey, eval::Task::kNeedle, eval::Task::kKvRetrieval}) {
    for (int ctx : {300, 448, 4096}) {
      const auto ps = eval::make_prompts(task, t, tales(), {ctx}, depths, 2, 1);
      for (const auto& p : ps) {
        const int n = static_cast<int>(p.tokens.size());
        const int slack = task == eval::Task::kKvRetrieval ? 120 : eval::kWordSlack;
        EXPECT_LE(n, ctx) << p.task << " ctx " << ctx;
        EXPECT_GE(n, ctx - slack) << p.task << " ctx " << ctx << " depth " << p.depth;
        EXPECT_EQ(p.tokens[0], t.bos_id());
        const std::string text = t.decode_all(p.tokens);
        // The spliced pieces are the tokens of the joined text.
        EXPECT_EQ(t.encode(text, true), p.tokens) << p.task << " ctx " << ctx << " " << p.depth;
        const size_t at = text.find(p.expected);
        ASSERT_NE(at, std::string::npos) << p.task << ": " << text;
        // The answer appears in the item only.
        auto count = [&](const std::string& x) {
          int c = 0;
          for (size_t i = x.find(p.expected); i != std::string::npos; i = x.find(p.expected, i + 1))
            ++c;
          return c;
        };
        const std::string tail = p.task == "passkey"  ? "The pass key is"
                                 : p.task == "needle" ? "mentioned in the text is:"
                                                      : "Corresponding value:";
        EXPECT_EQ(text.substr(text.size() - tail.size()), tail) << p.task;
        const std::string item = t.decode_all(std::vector<int>(
            p.tokens.begin() + p.item_pos, p.tokens.begin() + p.item_pos + p.item_len));
        const std::string after = t.decode_all(
            std::vector<int>(p.tokens.begin() + p.item_pos + p.item_len, p.tokens.end()),
            p.tokens[p.item_pos + p.item_len - 1]);
        if (p.depth == 0.0) {
          // Right after the instruction.
          const std::string before =
              t.decode_all(std::vector<int>(p.tokens.begin(), p.tokens.begin() + p.item_pos));
          EXPECT_TRUE(before.back() == '{' || before.back() == '.') << before;
        }
        if (p.depth == 1.0) {
          // Right before the question.
          EXPECT_EQ(after.rfind(task == eval::Task::kKvRetrieval ? " }" : " What", 0), 0u) << after;
        }
        if (task != eval::Task::kKvRetrieval) {
          // Within max(64, n / 16) tokens (moved to a sentence boundary) of depth times
          // the filler: the header is ps[0]'s item_pos (depth 0), the question follows the
          // item at depth 1 (the last depth).
          const auto& first = ps[0];
          const auto& last = ps[ps.size() - 1];
          const int header = first.item_pos;
          const int question = static_cast<int>(last.tokens.size()) - last.item_pos - last.item_len;
          const double filler = n - header - question - p.item_len;
          EXPECT_NEAR(p.item_pos, header + p.depth * filler, std::max(64.0, n / 16.0))
              << p.task << " " << ctx;
        }
        EXPECT_NE(item.find(p.expected), std::string::npos);
        EXPECT_EQ(count(text), count(item)) << p.task;
        EXPECT_GT(p.answer_tokens, 0);
      }
    }
  }
}

TEST(Eval, ShortContextsAreErrorsNamingTheLengths) {
  for (auto task : {eval::Task::kPasskey, eval::Task::kNeedle, eval::Task::kKvRetrieval}) {
    try {
      eval::make_prompts(task, tokenizer(), tales(), {40}, {0.5}, 1, 1);
      ADD_FAILURE() << eval::task_name(task) << ": no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("--ctx 40"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(eval::parse_task("attention"), Error);
  EXPECT_THROW(eval::parse_recall_kinds({"quest", "quest"}), Error);
  EXPECT_THROW(eval::parse_recall_kinds({"best"}), Error);
}

// A random f32 cache of one layer (2 KV heads, 4 query heads, D 16), n tokens, with
// head h's keys in block `planted[h]` along its query direction (when >= 0).
struct SmallCache {
  static constexpr int kHkv = 2, kRep = 2, kD = 16, kB = 16;
  kv::CacheConfig cfg;
  std::unique_ptr<kv::KvCache> cache;
  std::vector<float> q;  // [kHkv * kRep][kD]
  attn::Params p;
  SmallCache(int n, const std::vector<int>& planted, uint64_t seed) {
    cfg.n_layers = 1;
    cfg.n_kv_heads = kHkv;
    cfg.head_dim = kD;
    cfg.ctx = n;
    cache = std::make_unique<kv::KvCache>(cfg);
    Rng r(seed);
    std::vector<float> u(kHkv * kD);
    for (auto& x : u) x = r.normal() / 4.0f;  // |u| ~ 1
    std::vector<float> k(kHkv * kD), v(kHkv * kD);
    for (int t = 0; t < n; ++t) {
      for (int h = 0; h < kHkv; ++h) {
        const bool in = !planted.empty() && planted[h] >= 0 && t / kB == planted[h];
        for (int d = 0; d < kD; ++d) {
          k[h * kD + d] = in ? 30.0f * u[h * kD + d] + 0.1f * r.normal() : r.normal();
          v[h * kD + d] = r.normal();
        }
      }
      cache->append(0, k.data(), v.data());
    }
    q.resize(static_cast<size_t>(kHkv) * kRep * kD);
    for (int h = 0; h < kHkv; ++h)
      for (int i = 0; i < kRep; ++i)
        for (int d = 0; d < kD; ++d)
          q[(h * kRep + i) * kD + d] = u[h * kD + d] + 0.05f * r.normal();
    p.n_heads = kHkv * kRep;
    p.scale = 1.0f / std::sqrt(float(kD));
  }
};

// Softmax weights of query head hq, in double from the raw f32 rows (independent of
// attn::attention_weights_reference).
std::vector<double> own_weights(const SmallCache& c, int hq) {
  const int n = c.cache->n_tokens(0), D = SmallCache::kD, h = hq / SmallCache::kRep;
  const kv::LayerView view = c.cache->view(0);
  std::vector<double> s(n);
  std::vector<float> k(D);
  double mx = -INFINITY;
  for (int t = 0; t < n; ++t) {
    attn::dequantize_key(view.k, t, h, k.data());
    double dot = 0;
    for (int d = 0; d < D; ++d) dot += double(c.q[hq * D + d]) * k[d];
    s[t] = dot * c.p.scale;
    mx = std::max(mx, s[t]);
  }
  double den = 0;
  for (auto& x : s) den += (x = std::exp(x - mx));
  for (auto& x : s) x /= den;
  return s;
}

// The weights agree with an independent computation, and their dense output with the
// reference attention's.
TEST(Eval, RecallWeightsMatchTheReference) {
  SmallCache c(200, {}, 3);
  const kv::LayerView view = c.cache->view(0);
  const int n = 200, D = SmallCache::kD, rep = SmallCache::kRep;
  std::vector<float> ref(static_cast<size_t>(c.p.n_heads) * D);
  attn::decode_reference(view, c.q.data(), ref.data(), c.p);
  for (int h = 0; h < SmallCache::kHkv; ++h) {
    std::vector<double> w(static_cast<size_t>(rep) * n);
    attn::attention_weights_reference(view, c.q.data(), c.p, h, w.data());
    std::vector<float> v(static_cast<size_t>(n) * D);
    for (int t = 0; t < n; ++t) attn::dequantize_value(view.v, t, h, v.data() + t * D);
    std::vector<double> dense(static_cast<size_t>(rep) * D);
    eval::dense_output(w.data(), v.data(), rep, n, D, dense.data());
    for (int r = 0; r < rep; ++r) {
      const auto own = own_weights(c, h * rep + r);
      for (int t = 0; t < n; ++t) ASSERT_NEAR(w[r * n + t], own[t], 1e-12);
      for (int d = 0; d < D; ++d) EXPECT_NEAR(dense[r * D + d], ref[(h * rep + r) * D + d], 1e-6);
    }
    // Everything selected: mass 1, no error; nothing but the last token: its weight.
    eval::RecallSums all, last;
    const sparse::Range everything{0, n}, only_last{n - 1, n};
    eval::add_recall(w.data(), v.data(), dense.data(), rep, n, D, &everything, 1, all);
    eval::add_recall(w.data(), v.data(), dense.data(), rep, n, D, &only_last, 1, last);
    EXPECT_NEAR(all.mean_mass(), 1.0, 1e-12);
    EXPECT_LT(all.mean_error(), 1e-12);
    EXPECT_DOUBLE_EQ(all.mean_attended(), 1.0);
    EXPECT_NEAR(last.mean_mass(), (w[n - 1] + w[2 * n - 1]) / 2, 1e-12);
    EXPECT_NEAR(last.mean_attended(), 1.0 / n, 1e-15);
  }
}

eval::RecallOptions recall_options(std::vector<int> budgets) {
  eval::RecallOptions o;
  o.sparse.block = SmallCache::kB;
  o.sparse.sinks = 4;
  o.sparse.local = 32;
  o.kinds = eval::parse_recall_kinds({"quest", "max", "mean", "random", "local"});
  o.budgets = std::move(budgets);
  o.every = 1;
  return o;
}

// A budget covering the context gives every kind mass 1 and no error; local alone
// keeps less.
TEST(Eval, RecallWithFullBudgetIsDense) {
  const int n = 256;
  SmallCache c(n, {}, 5);
  eval::AttnRecall rec(recall_options({n}), c.cfg, c.p.n_heads);
  rec.attended(0, 0, c.cache->view(0), c.q.data(), c.p);
  ASSERT_EQ(rec.positions(), 1);
  ASSERT_EQ(rec.selections().size(), 5u);
  for (size_t i = 0; i < 4; ++i) {
    const auto o = rec.overall(static_cast<int>(i));
    EXPECT_NEAR(o.mean_mass(), 1.0, 1e-12) << rec.selections()[i].label();
    EXPECT_LT(o.mean_error(), 1e-12) << rec.selections()[i].label();
    EXPECT_DOUBLE_EQ(o.mean_attended(), 1.0);
  }
  EXPECT_EQ(rec.selections()[4].label(), "local");
  const auto local = rec.overall(4);
  EXPECT_LT(local.mean_mass(), 0.9);
  EXPECT_GT(local.mean_error(), 1e-3);
  EXPECT_NEAR(local.mean_attended(), (4.0 + 32.0) / n, 1e-12);
}

// A block whose keys point along the query is captured by quest, max and mean with a
// budget of one block: most of the mass, which an independent sum over the selector's
// own ranges confirms; the random baseline and local alone miss most of it.
TEST(Eval, RecallCapturesAPlantedBlock) {
  const int n = 320;
  const std::vector<int> planted = {5, 11};
  SmallCache c(n, planted, 9);
  const kv::LayerView view = c.cache->view(0);
  eval::AttnRecall rec(recall_options({SmallCache::kB, 4 * SmallCache::kB}), c.cfg, c.p.n_heads);
  rec.attended(0, 0, view, c.q.data(), c.p);
  // Independent mass of quest's selection at one block, from SparseAttention's ranges.
  sparse::Options so = recall_options({}).sparse;
  so.kind = sparse::Kind::kQuest;
  so.budget = SmallCache::kB;
  sparse::SparseAttention sa(so, c.cfg, c.p.n_heads);
  attn::Workspace ws(1, c.p.n_heads, SmallCache::kHkv, SmallCache::kD, c.cfg.block(), n);
  std::vector<float> out(c.q.size());
  sa.decode(0, 0, view, c.q.data(), out.data(), c.p, nullptr, ws);
  double mass = 0;
  for (int h = 0; h < SmallCache::kHkv; ++h) {
    const auto blocks = sa.last_blocks(h);
    ASSERT_EQ(blocks.size(), 1u);
    EXPECT_EQ(blocks[0], planted[h]);
    for (int r = 0; r < SmallCache::kRep; ++r) {
      const auto w = own_weights(c, h * SmallCache::kRep + r);
      for (const auto& rg : sa.last_ranges(h))
        for (int t = rg.t0; t < rg.t1; ++t) mass += w[t];
    }
  }
  mass /= SmallCache::kHkv * SmallCache::kRep;
  const auto& sel = rec.selections();
  for (size_t i = 0; i < sel.size(); ++i) {
    const auto o = rec.overall(static_cast<int>(i));
    const std::string kind = sel[i].kind.name();
    if (kind == "quest" && sel[i].budget == SmallCache::kB) {
      EXPECT_NEAR(o.mean_mass(), mass, 1e-12);
    }
    if (kind == "quest" || kind == "max" || kind == "mean") {
      EXPECT_GT(o.mean_mass(), 0.9) << sel[i].label();
      EXPECT_LT(o.mean_error(), 0.3) << sel[i].label();
    } else {
      EXPECT_LT(o.mean_mass(), 0.5) << sel[i].label();
    }
  }
}

// The command on stories260K: a passkey table and JSON, attn-recall's JSON with mass 1
// at a budget covering the text, and errors naming the lengths.
TEST(Eval, Cli) {
  KIVI_REQUIRE_MODEL();
  const std::string m = "-m '" + test::model_path() + "' ";
  auto r = test::run(
      test::kivi_cmd("eval " + m + "--task passkey --ctx 200,300 --depths 0,1 --trials 2 --json"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("\"results\":[{\"task\":\"passkey\",\"ctx\":200,\"depth\":0,"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("\"outcomes\""), std::string::npos);
  r = test::run(test::kivi_cmd("eval " + m +
                               "--task kv-retrieval --ctx 256 --depths 0.5 --trials 1 "
                               "--kv-cache kivi2 --sparse quest --sparse-block 32 "
                               "--sparse-budget 64 --sparse-local 64"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("kv-retrieval"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("sparse    quest"), std::string::npos) << r.out;
  r = test::run(test::kivi_cmd("eval " + m + "--task passkey --ctx 1k"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("prompts of 1024 tokens do not fit the model's context of 512"),
            std::string::npos)
      << r.err;
  r = test::run(test::kivi_cmd("eval " + m + "--task passkey --ctx 510"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("the model's context is 512"), std::string::npos) << r.err;
  r = test::run(test::kivi_cmd("eval " + m + "--task attn-recall -f '" + test::text_path() +
                               "' --ctx 300 --sparse-block 16 --sparse-local 32 "
                               "--sparse-budget 16,512 --sparse quest,local --every 32 --json"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string full = "{\"kind\":\"quest\",\"budget\":512,\"attended\":";
  EXPECT_NEAR(number_after(r.out, full), 1.0, 1e-12) << r.out;
  EXPECT_NEAR(number_after(r.out.substr(r.out.find(full)), "\"mass\":"), 1.0, 1e-9) << r.out;
  EXPECT_NEAR(number_after(r.out.substr(r.out.find(full)), "\"error\":"), 0.0, 1e-6) << r.out;
  const double local = number_after(r.out, "{\"kind\":\"local\",\"budget\":0,\"attended\":");
  EXPECT_GT(local, 0.05) << r.out;
  EXPECT_LT(local, 0.5) << r.out;
  test::TempDir dir;
  const std::string text = "-f '" + test::text_path() + "' ";
  test::write_text(dir.file("empty.txt"), " \n");
  for (const auto& [args, message] : std::vector<std::pair<std::string, std::string>>{
           {"--task needle --ctx 300 -f '" + dir.file("empty.txt") + "'", "the haystack is empty"},
           {"--task needle --ctx 300 -f '" + dir.file("missing.txt") + "'", "missing.txt"},
           {"--task passkey --ctx 300 --depths 0.5,2", "--depths: '2' is not a number from 0 to 1"},
           {"--task passkey --ctx 300 --sparse quest,max", "--sparse: the retrieval tasks run one"},
           {"--task passkey --ctx 16777217", "--ctx = 16777217 is out of range (valid: 1 to"},
           {"--task passkey --ctx 30", "--ctx 30: a passkey prompt needs more than"},
           {"--task passkey", "give the prompt lengths with --ctx"},
           {"--task recall", "--task: unknown value 'recall'"},
           {text + "--task attn-recall --sparse quest,best", "--sparse: unknown value 'best'"},
           {text + "--task attn-recall --ctx 20", "leave no position to measure"},
           {text + "--task attn-recall --ctx 300 --sparse-block 16 --kv-cache kivi2",
            "--sparse-block 16: expected a multiple of the KIVI key group G=32"}}) {
    r = test::run(test::kivi_cmd("eval " + m + args));
    EXPECT_EQ(r.exit_code, 1) << args;
    EXPECT_NE(r.err.find(message), std::string::npos) << args << ": " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }
  r = test::run(test::kivi_cmd("eval " + m + "--task attn-recall --trials 3"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("--trials applies to the retrieval tasks"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace kivi
