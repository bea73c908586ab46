// Speculative decoding by prompt lookup: the drafts lookup finds, and replies with
// drafting equal to those without, token for token, greedy and sampled, for every cache
// format (the verification's batched logits and the cut-back cache are exact); the cut
// back itself against streaming; and the options a session refuses.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "model/model.h"
#include "runtime/generation.h"
#include "runtime/session.h"
#include "runtime/session_file.h"
#include "runtime/speculative.h"
#include "test_util.h"

namespace kivi::runtime {
namespace {

TEST(Lookup, DraftsWhatFollowedTheLatestOccurrence) {
  using V = std::vector<int>;
  // "1 2 3" occurred twice; the later one is taken.
  EXPECT_EQ(lookup_draft({1, 2, 3, 9, 1, 2, 3, 7, 8, 5, 1, 2, 3}, 3, 4), (V{7, 8, 5, 1}));
  // The longest n-gram with an occurrence wins over a later shorter one.
  EXPECT_EQ(lookup_draft({4, 5, 6, 1, 6, 2, 4, 5, 6}, 3, 2), (V{1, 6}));
  EXPECT_EQ(lookup_draft({4, 5, 6, 1, 6, 2, 4, 5, 6}, 1, 2), (V{2, 4}));
  // Down to one token; the draft stops at the text's end.
  EXPECT_EQ(lookup_draft({7, 3, 9, 3}, 3, 8), (V{9, 3}));
  // A run of one token drafts its own continuation.
  EXPECT_EQ(lookup_draft({5, 5, 5, 5}, 2, 3), (V{5}));
  EXPECT_TRUE(lookup_draft({1, 2, 3}, 3, 4).empty());
  EXPECT_TRUE(lookup_draft({}, 3, 4).empty());
  EXPECT_TRUE(lookup_draft({1}, 3, 4).empty());
}

SessionOptions session_for(const test::FormatCase& f, int rewind) {
  SessionOptions o;
  o.threads = 2;
  o.ctx = 512;
  o.cache.k = f.k;
  o.cache.rotate = f.rotate;
  o.cache.v = f.v;
  o.cache.group_size = 32;
  o.cache.residual = 32;
  o.rewind = rewind;
  return o;
}

struct Reply {
  std::vector<int> tokens;
  std::string text;
  Generator::Speculation spec;
  int steps = 0;
};

Reply generate(const model::Model& m, const SessionOptions& so, const std::vector<int>& prompt,
               GenerationOptions go) {
  Session s(m, so);
  Generator g(s, go, prompt.back());
  g.prefill(prompt);
  Reply r;
  while (!g.done()) {
    const Continuation::Step st = g.next();
    if (st.token >= 0) r.tokens.push_back(st.token);
    r.text += st.text;
  }
  r.spec = g.speculation();
  r.steps = g.decode_steps();
  return r;
}

// A prompt the model copies from: a story told twice and begun a third time.
std::vector<int> copy_prompt(const tok::Tokenizer& tk) {
  const std::string story =
      "Once upon a time, there was a little girl named Lily. She loved to play outside in the "
      "park with her dog Max. One day, they found a big red ball under a tree.";
  return tk.encode(story + " " + story + " Once upon a time, there was", true);
}

TEST(Speculative, RepliesEqualPlainDecodingForEveryFormat) {
  KIVI_REQUIRE_MODEL();
  const auto& m = test::stories();
  const std::vector<int> prompt = copy_prompt(m.tokenizer());
  int accepted = 0;
#ifdef KIVI_SANITIZE
  const std::vector<int> drafts = {3};  // (every format still, greedy and sampled)
#else
  const std::vector<int> drafts = {1, 3, 6};
#endif
  for (const auto& f : test::all_formats()) {
    for (const float temp : {0.0f, 0.9f}) {
      GenerationOptions go;
      go.max_tokens = 120;
      go.sampler.temperature = temp;
      go.sampler.seed = 17;
      const Reply plain = generate(m, session_for(f, 0), prompt, go);
      for (const int draft : drafts) {
        go.lookup = draft;
        const Reply spec = generate(m, session_for(f, draft), prompt, go);
        EXPECT_EQ(spec.tokens, plain.tokens) << f.name << " temp " << temp << " draft " << draft;
        EXPECT_EQ(spec.text, plain.text) << f.name;
        EXPECT_GT(spec.spec.rounds, 0) << f.name;
        EXPECT_LT(spec.steps, plain.steps) << f.name << " temp " << temp << " draft " << draft;
        accepted += spec.spec.accepted;
        go.lookup = 0;
      }
    }
  }
  EXPECT_GT(accepted, 0);
}

// A small llama shape of `layers` layers, `dim` wide (head_dim 16), for random models.
model::ModelConfig small_llama(int layers, int dim, int vocab) {
  model::ModelConfig mc;
  model::apply_arch_defaults(mc, "llama");
  mc.n_layers = layers;
  mc.dim = dim;
  mc.n_heads = dim / 16;
  mc.n_kv_heads = std::max(1, dim / 32);
  mc.hidden_dim = 2 * dim;
  mc.vocab_size = vocab;
  mc.ctx = 256;
  mc.rope_theta = 10000.0f;
  return mc;
}

// A draft model: stories260K drafting for itself from a kivi2 cache (it mostly agrees;
// sampling rejects some drafts), and a random-weight model drafting for another of the
// same synthetic vocabulary (it mostly disagrees): the replies are plain decoding's, and
// the draft's cache follows the text through every cut back.
TEST(DraftModel, RepliesEqualPlainDecoding) {
  KIVI_REQUIRE_MODEL();
  const auto& m = test::stories();
  const std::vector<int> prompt = copy_prompt(m.tokenizer());
  SessionOptions draft_so;
  draft_so.threads = 1;
  draft_so.ctx = 512;
  draft_so.cache.k = draft_so.cache.v = {kv::Format::kKivi2};
  draft_so.cache.group_size = 32;
  draft_so.cache.residual = 32;
  DraftModel self(model::Model::load(test::model_path(), test::tokenizer_path()), m, draft_so, 6);
  for (const auto& f : test::all_formats()) {
    for (const float temp : {0.0f, 0.9f}) {
      GenerationOptions go;
      go.max_tokens = 100;
      go.sampler.temperature = temp;
      go.sampler.seed = 23;
      const Reply plain = generate(m, session_for(f, 0), prompt, go);
      go.lookup = 6;
      go.draft_model = &self;
      const Reply spec = generate(m, session_for(f, 6), prompt, go);
      EXPECT_EQ(spec.tokens, plain.tokens) << f.name << " temp " << temp;
      EXPECT_EQ(spec.text, plain.text) << f.name;
      EXPECT_LT(spec.steps, plain.steps) << f.name << " temp " << temp;
      if (temp == 0.0f) {
        EXPECT_GT(spec.spec.accepted, spec.spec.drafted / 2) << f.name;
      } else {
        EXPECT_LT(spec.spec.accepted, spec.spec.drafted) << f.name;
      }
    }
  }
  test::TempDir dir;
  const auto target =
      model::Model::load(test::synth_model(dir, "target", small_llama(2, 64, 300), 3), "");
  draft_so.ctx = 256;
  DraftModel other(
      model::Model::load(test::synth_model(dir, "draft", small_llama(1, 32, 300), 4), ""), *target,
      draft_so, 4);
  const std::vector<int> p = {1, 17, 42, 99, 17, 42};
  for (const float temp : {0.0f, 1.0f}) {
    GenerationOptions go;
    go.max_tokens = 80;
    go.sampler.temperature = temp;
    go.sampler.seed = 5;
    const test::FormatCase& f16 = test::format_named("f16");
    SessionOptions so = session_for(f16, 0);
    so.ctx = 256;
    const Reply plain = generate(*target, so, p, go);
    go.lookup = 4;
    go.draft_model = &other;
    so.rewind = 4;
    const Reply spec = generate(*target, so, p, go);
    EXPECT_EQ(spec.tokens, plain.tokens) << "temp " << temp;
    EXPECT_GT(spec.spec.rounds, 0);
  }
}

TEST(DraftModel, AnotherVocabularyIsRefused) {
  KIVI_REQUIRE_MODEL();
  test::TempDir dir;
  model::ModelConfig mc = small_llama(1, 32, 512);  // stories260K's vocabulary size, other pieces
  SessionOptions so;
  so.ctx = 256;
  const std::string same_size = test::synth_model(dir, "same_size", mc, 1);
  mc.vocab_size = 300;
  const std::string smaller = test::synth_model(dir, "smaller", mc, 1);
  for (const std::string& path : {same_size, smaller}) {
    try {
      DraftModel d(model::Model::load(path, ""), test::stories(), so, 4);
      ADD_FAILURE() << path << " accepted";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("--draft-model"), std::string::npos) << msg;
      EXPECT_NE(msg.find("not the model's vocabulary"), std::string::npos) << msg;
      EXPECT_NE(msg.find(path == smaller ? "300 tokens in the draft, 512" : "token "),
                std::string::npos)
          << msg;
    }
  }
}

// Cutting back to n tokens leaves the cache feeding n tokens leaves: the next logits
// are equal bit for bit.
TEST(Speculative, TruncatedSessionEqualsStreaming) {
  KIVI_REQUIRE_MODEL();
  const auto& m = test::stories();
  const std::vector<int> prompt = copy_prompt(m.tokenizer());
  const int V = m.config().vocab_size;
  for (const auto& f : test::all_formats()) {
    Session a(m, session_for(f, 8)), b(m, session_for(f, 0));
    a.prefill(std::vector<int>(prompt.begin(), prompt.begin() + 40));
    b.prefill(std::vector<int>(prompt.begin(), prompt.begin() + 40));
    std::vector<float> all(static_cast<size_t>(8) * V);
    ASSERT_GT(prompt.size(), 40u + 6 * 4 + 8);
    for (int round = 0, at = 40; round < 6; ++round, at += 4) {
      // Feed 8, keep 3 of them (as if 2 of 7 drafts were accepted), then one more.
      a.verify(std::vector<int>(prompt.begin() + at, prompt.begin() + at + 8), all.data());
      a.truncate(at + 3);
      for (int i = 0; i < 3; ++i) b.decode(prompt[at + i]);
      const float* la = a.decode(prompt[at + 3]);
      const float* lb = b.decode(prompt[at + 3]);
      ASSERT_EQ(std::memcmp(la, lb, V * sizeof(float)), 0) << f.name << " round " << round;
    }
  }
}

// The rows a KIVI ring keeps for cutting back change nothing else: a ring slack that is
// not a whole number of key groups once let a flushed group wrap around the ring's end.
TEST(Speculative, RingSlackLeavesTheNumbersAlone) {
  KIVI_REQUIRE_MODEL();
  const auto& m = test::stories();
  const std::vector<int> prompt = copy_prompt(m.tokenizer());
  GenerationOptions go;
  go.max_tokens = 120;
  go.sampler.temperature = 0;
  for (const char* name : {"kivi2", "K kivi4 / V kivi2"}) {
    const auto& f = test::format_named(name);
    const Reply a = generate(m, session_for(f, 0), prompt, go);
    for (int slack : {1, 6, 40}) {
      EXPECT_EQ(generate(m, session_for(f, slack), prompt, go).tokens, a.tokens)
          << name << " slack " << slack;
    }
  }
}

// KV files hold the streaming ring in token order (kv/snapshot.h): a session whose ring
// keeps more rows for cutting back saves a file a plain session continues bit for bit,
// and continues, and cuts back into, a file a plain session saved.
TEST(Speculative, KvFilesMoveBetweenRingsOfAnyLength) {
  KIVI_REQUIRE_MODEL();
  const auto& m = test::stories();
  const std::vector<int> prompt = copy_prompt(m.tokenizer());
  const int V = m.config().vocab_size;
  test::TempDir dir;
  for (const char* name : {"kivi2", "K kivi4 / V kivi2"}) {
    const auto& f = test::format_named(name);
    auto logits_after = [&](Session& s, int token) {
      const float* l = s.decode(token);
      return std::vector<float>(l, l + V);
    };
    Session plain(m, session_for(f, 0));
    plain.prefill(prompt);
    save_session(plain, prompt, 0, 0.0, dir.file("plain.kv"));
    const std::vector<float> ref = logits_after(plain, 42);
    const std::vector<float> ref2 = logits_after(plain, 17);

    Session slack(m, session_for(f, 8));
    slack.prefill(prompt);
    save_session(slack, prompt, 0, 0.0, dir.file("slack.kv"));
    Session a(m, session_for(f, 0));
    load_session(a, dir.file("slack.kv"));
    EXPECT_EQ(logits_after(a, 42), ref) << name;
    EXPECT_EQ(logits_after(a, 17), ref2) << name;

    Session b(m, session_for(f, 40));
    load_session(b, dir.file("plain.kv"));
    EXPECT_EQ(logits_after(b, 42), ref) << name;
    logits_after(b, 99);
    // Cut back past the 99 and on again: the same logits.
    const int n = static_cast<int>(prompt.size());
    b.truncate(n + 1);
    EXPECT_EQ(logits_after(b, 17), ref2) << name;
    // Within the rewind, but before the file's residual window: those rows were never
    // in this ring.
    EXPECT_THROW(b.truncate(n - 24), Error) << name;
  }
}

TEST(Speculative, SessionsRefuseWhatTheyCannotCutBack) {
  KIVI_REQUIRE_MODEL();
  const auto& m = test::stories();
  SessionOptions o = session_for(test::format_named("kivi2"), 4);
  Session s(m, o);
  s.prefill({1, 2, 3, 4, 5, 6, 7, 8});
  EXPECT_THROW(s.truncate(3), Error);  // 5 back, rewind 4
  EXPECT_THROW(s.truncate(9), Error);
  s.truncate(4);
  EXPECT_EQ(s.pos(), 4);
  o.overflow = ContextOverflow::kShift;
  o.cache.key_rope = kv::KeyRope::kPre;
  EXPECT_THROW(Session(m, o), Error);
  GenerationOptions go;
  go.lookup = 5;  // more than the session's rewind
  Session t(m, session_for(test::format_named("kivi2"), 4));
  EXPECT_THROW(Generator(t, go, 1), Error);
}

}  // namespace
}  // namespace kivi::runtime
