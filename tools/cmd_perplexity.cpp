#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "common.h"
#include "dist/dist.h"
#include "core/error.h"
#include "core/json.h"
#include "core/progress.h"
#include "core/sysinfo.h"
#include "core/timer.h"
#include "io/atomic_file.h"
#include "io/mapped_file.h"
#include "kv/format.h"
#include "runtime/perplexity.h"
#include "runtime/sampler.h"

namespace kivi::tools {

namespace {

// The run's result as one JSON object or a table; ks: the KL statistics with --kld-base.
void print_perplexity(const Args& a, const model::Model& m, runtime::Session& s,
                      runtime::EvalMode mode, const runtime::PerplexityResult& r,
                      const runtime::KldStats* ks, double secs, bool json) {
  const auto& cc = s.options().cache;
  const double bits_k = kv::bits_per_element(cc, kv::Stream::kKey),
               bits_v = kv::bits_per_element(cc, kv::Stream::kValue);

  if (json) {
    JsonWriter j;
    j.begin_object();
    j.kv("ppl", r.ppl)
        .kv("mean_nll", r.mean_nll)
        .kv("nll_stderr", r.nll_stderr)
        .kv("tokens", r.tokens);
    j.kv("mode", runtime::eval_mode_name(mode)).kv("ctx", s.ctx()).kv("chunks", r.chunks);
    j.kv("kv_cache", describe_cache(cc))
        .kv("bits_per_element_k", bits_k)
        .kv("bits_per_element_v", bits_v);
    j.kv("int8_clamped", s.cache().clamped());
    j.kv("seconds", secs).kv("tokens_per_second", r.tokens / secs);
    if (s.sparse()) {
      const auto& ss = s.sparse()->stats();
      j.kv("sparse", sparse::describe(s.options().sparse));
      j.kv("sparse_attended_fraction",
           ss.tokens_context ? double(ss.tokens_attended) / ss.tokens_context : 0.0);
      j.kv("sparse_select_seconds", ss.select_seconds)
          .kv("sparse_attend_seconds", ss.attend_seconds);
    }
    if (ks) {
      j.kv("kld_mean", ks->mean)
          .kv("kld_median", ks->median)
          .kv("kld_p99", ks->p99)
          .kv("kld_max", ks->max);
      j.kv("top1_agree", ks->top1_agree).kv("first_disagree", ks->first_disagree);
    }
    j.end_object();
    std::printf("%s\n", j.str().c_str());
    return;
  }
  std::printf("model        %s\n", m.path().c_str());
  std::printf("text         %s (%lld tokens, %d chunk%s of up to %d scored tokens)\n",
              a.str("file").c_str(), static_cast<long long>(r.tokens), r.chunks,
              r.chunks == 1 ? "" : "s", s.ctx() - 1);
  std::printf("KV cache     %s, %.3f/%.3f bits per element (K/V)\n", describe_cache(cc).c_str(),
              bits_k, bits_v);
  std::printf("mode         %s\n", runtime::eval_mode_name(mode));
  std::printf("perplexity   %.4f\n", r.ppl);
  std::printf("mean NLL     %.6f +/- %.6f\n", r.mean_nll, r.nll_stderr);
  if (s.sparse()) {
    const auto& ss = s.sparse()->stats();
    std::printf("sparse       %s: %.1f%% of the tokens attended\n",
                sparse::describe(s.options().sparse).c_str(),
                ss.tokens_context ? 100.0 * ss.tokens_attended / ss.tokens_context : 0.0);
  }
  if (s.cache().clamped())
    std::printf("int8 clamped %lld elements\n", static_cast<long long>(s.cache().clamped()));
  if (ks) {
    std::printf("KL divergence vs %s: mean %.6g, median %.6g, p99 %.6g, max %.6g\n",
                a.str("kld-base").c_str(), ks->mean, ks->median, ks->p99, ks->max);
    std::printf("top-1 agreement %.2f%%, first disagreement at scored token %lld\n", ks->top1_agree,
                static_cast<long long>(ks->first_disagree));
  }
  std::printf("speed        %.1f tokens/s\n", r.tokens / secs);
}

}  // namespace

int cmd_perplexity(int argc, char** argv) {
  Args a(
      "perplexity",
      "[-m MODEL] [-t TOKENIZER] -f TEXT [--ctx N] [--mode streaming|batched] [KV options] "
      "[--save-logits FILE] [--kld-base FILE] [--json]",
      "Scores a text with the model and the configured KV cache, exactly as deployed.\n"
      "\n"
      "Convention: the text is tokenized once (a dummy-prefix space at its start, no BOS) and\n"
      "split into chunks of ctx - 1 tokens. Each chunk starts from an empty cache and is fed as\n"
      "[BOS] + chunk; every text token is scored once, by the log-probability the model gave it\n"
      "after the chunk tokens before it. Reports perplexity, the mean negative log-likelihood\n"
      "with its standard error, and the token count.\n"
      "  streaming  feeds the tokens one at a time through the cache, as generation does.\n"
      "  batched    prefills each chunk at once. The cache is updated in the same order, so the\n"
      "             result equals streaming (except int8/tensor, whose scale comes from the first\n"
      "             batch: all of the chunk in batched mode, BOS alone in streaming mode).\n"
      "\n"
      "--save-logits writes every scored token's log-probabilities (normally of an f32 run) to a\n"
      "file; --kld-base compares this run against such a file: KL divergence per token (mean,\n"
      "median, 99th percentile, max), top-1 agreement and the first disagreement.");
  a.section("Evaluation");
  a.add("file", 'f', "TEXT", "The text file to score.");
  a.add("mode", 0, "MODE", "streaming or batched (see above).", "streaming");
  a.add("prompt", 0, "N",
        "Streaming: prefill each chunk's first N inputs at once, as a prompt (what "
        "--sparse-preselect observes), and stream the rest. 0 = stream everything.",
        "0");
  a.add("save-logits", 0, "FILE",
        "Write the log-probabilities of every scored token: header \"KIVILP2\\0\", u32 vocab, u32 "
        "ctx, "
        "u64 tokens, u64 token hash, u64 model fingerprint; then per token u32 id + f32[vocab].");
  a.add("kld-base", 0, "FILE",
        "Compare against log-probabilities saved by --save-logits (the same model, text and --ctx: "
        "the file "
        "records them and a mismatch is an error).");
  add_kv_sensitivity_options(a);
  a.add_flag(
      "json", 0,
      "Print one JSON object: ppl, mean_nll, nll_stderr, tokens, mode, ... (and kld_* fields).");
  add_model_options(a);
  add_kv_options(a);
  add_sparse_options(a);
  if (!parse_command_line(a, argc, argv)) return 0;  // --help printed
  if (!a.given("file")) fail("perplexity: give the text with -f TEXT");
  const bool json = a.flag("json");
  const auto mode = runtime::parse_eval_mode(a.str("mode"));
  const int prompt = static_cast<int>(a.integer("prompt", 0, model::kMaxContext));
  if (prompt > 0 && mode != runtime::EvalMode::kStreaming)
    fail("--prompt %d: only with --mode streaming (batched prefills whole chunks)", prompt);
  const std::string text = text_everywhere(a.str("file"));
  if (a.given("save-logits")) {
    std::vector<std::string> inputs = model_input_paths(a);
    inputs.push_back(a.str("file"));
    if (a.given("kld-base")) inputs.push_back(a.str("kld-base"));
    io::check_output_is_not_input(a.str("save-logits"), inputs, "--save-logits");
  }
  if (a.given("kv-budget") && !a.given("kv-sensitivity"))
    fail("--kv-budget: only with --kv-sensitivity FORMATS");
  auto m = load_model(a);
  const std::vector<int> tokens = m->tokenizer().encode(text, false);
  if (tokens.size() < 2) {
    fail("%s: the text has %zu token%s; perplexity needs at least 2", a.str("file").c_str(),
         tokens.size(), tokens.size() == 1 ? "" : "s");
  }
  if (a.given("kv-sensitivity")) {
    if (a.given("save-logits") || a.given("kld-base"))
      fail("--kv-sensitivity: measures against its own f32 run; drop --save-logits/--kld-base");
    return report_kv_sensitivity(a, *m, session_options(a, *m), tokens, mode, json);
  }
  // Under mpirun every rank meets a bad option or size at once: one message, from rank 0.
  const std::unique_ptr<runtime::Session> session =
      on_every_rank([&] { return std::make_unique<runtime::Session>(*m, session_options(a, *m)); });
  runtime::Session& s = *session;
  const int V = m->config().vocab_size;
  const uint64_t hash = runtime::hash_tokens(tokens), model_hash = runtime::model_fingerprint(*m);
  std::unique_ptr<runtime::LogprobWriter> writer;
  std::unique_ptr<runtime::LogprobReader> reader;
  // Open both before the (possibly long) run so bad paths fail at once.
  // Rank 0 alone writes and compares (the others compute the same logits).
  if (a.given("save-logits") && dist::is_root()) {
    writer = std::make_unique<runtime::LogprobWriter>(
        a.str("save-logits"), V, s.ctx(), static_cast<int64_t>(tokens.size()), hash, model_hash);
  }
  if (a.given("kld-base") && dist::is_root()) {
    reader = std::make_unique<runtime::LogprobReader>(
        a.str("kld-base"), V, s.ctx(), static_cast<int64_t>(tokens.size()), hash, model_hash);
  }
  std::vector<float> base(V);
  std::vector<double> kld;
  std::vector<char> agree;
  auto sink = [&](int64_t, int token, const float* lp) {
    if (writer) writer->write(token, lp);
    if (reader) {
      const int bt = reader->read(base.data());
      if (bt != token)
        fail("%s: token mismatch at a scored position (file %d, text %d)",
             a.str("kld-base").c_str(), bt, token);
      kld.push_back(runtime::kl_divergence(base.data(), lp, V));
      agree.push_back(runtime::argmax(base.data(), V) == runtime::argmax(lp, V));
    }
  };
  Progress bar("perplexity", static_cast<int64_t>(tokens.size()), "tok", !json);
  const double t0 = now_seconds();
  const auto r = runtime::evaluate_perplexity(
      s, tokens, mode, sink, [&](int64_t d, int64_t) { bar.update(d); }, prompt);
  const double secs = now_seconds() - t0;
  bar.finish();
  if (writer) writer->close();
  const auto ks = runtime::summarize_kld(kld, agree);
  print_perplexity(a, *m, s, mode, r, reader ? &ks : nullptr, secs, json);
  return 0;
}

}  // namespace kivi::tools
