#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common.h"
#include "dist/dist.h"
#include "core/error.h"
#include "core/json.h"
#include "io/atomic_file.h"
#include "model/forward.h"

namespace kivi::tools {

int cmd_logits(int argc, char** argv) {
  Args a("logits", "[-m MODEL] [-p PROMPT] [--mode prefill|stream|no-cache] [-o FILE] [--json]",
         "Computes the logits after every position of PROMPT (BOS prepended) and prints them as\n"
         "JSON, or writes them to FILE as raw little-endian f32 [positions, vocab] after a header\n"
         "(magic 'KVLG', u32 positions, u32 vocab). Used to check the engine against independent\n"
         "references and its own paths against each other.");
  a.add("prompt", 'p', "TEXT", "The text.", "");
  a.add("mode", 0, "MODE",
        "prefill: batched prefill through the KV cache; stream: one token at a time; no-cache: "
        "recompute from scratch at every position.",
        "prefill");
  a.add("output", 'o', "FILE", "Write binary logits here instead of printing JSON.");
  a.add_flag("json", 0, "Print JSON (the default when -o is not given).");
  add_model_options(a);
  add_kv_options(a);
  add_sparse_options(a);
  if (!parse_command_line(a, argc, argv)) return 0;  // --help printed
  const std::string mode = a.str("mode");
  if (mode != "prefill" && mode != "stream" && mode != "no-cache") {
    fail("--mode: unknown value '%s' (valid: prefill, stream, no-cache)", mode.c_str());
  }
  if (mode == "no-cache" && dist::size() > 1)
    throw dist::CollectiveError("--mode no-cache runs in one process only");
  if (mode == "no-cache")
    refuse_kv_options(a, "--mode no-cache (it recomputes keys and values, it has no cache)");
  // The output is written through a temporary file renamed into place at the end.
  std::unique_ptr<io::AtomicFile> out;
  if (a.given("output") && dist::is_root()) {  // rank 0 alone writes
    io::check_output_is_not_input(a.str("output"), model_input_paths(a), "-o");
    out = std::make_unique<io::AtomicFile>(a.str("output"));
  }
  auto m = load_model(a);
  const int V = m->config().vocab_size;
  const std::vector<int> tokens = m->tokenizer().encode(a.str("prompt"), m->tokenizer().add_bos());
  const int n = static_cast<int>(tokens.size());
  runtime::SessionOptions opt = on_every_rank([&] { return session_options(a, *m); });
  const int ctx = opt.ctx > 0 ? opt.ctx : m->config().ctx;
  if (n > ctx) fail("the prompt is %d tokens, longer than the context (%d)", n, ctx);
  std::vector<float> logits(static_cast<size_t>(n) * V);
  if (mode == "no-cache") {
    ThreadPool pool(opt.threads);
    for (int i = 1; i <= n; ++i) {
      auto l =
          model::forward_no_cache(*m, std::vector<int>(tokens.begin(), tokens.begin() + i), &pool);
      std::memcpy(&logits[static_cast<size_t>(i - 1) * V], l.data(), V * sizeof(float));
    }
  } else {
    // Under mpirun every rank meets a bad option or size at once: one message, from rank 0.
    const std::unique_ptr<runtime::Session> session =
        on_every_rank([&] { return std::make_unique<runtime::Session>(*m, opt); });
    runtime::Session& s = *session;
    if (mode == "prefill") {
      s.prefill(tokens, logits.data());
    } else {
      for (int i = 0; i < n; ++i) {
        const float* l = s.decode(tokens[i]);
        std::memcpy(&logits[static_cast<size_t>(i) * V], l, V * sizeof(float));
      }
    }
  }
  if (a.given("output")) {
    if (!out) return 0;
    const uint32_t head[3] = {0x474C564Bu, static_cast<uint32_t>(n), static_cast<uint32_t>(V)};
    out->write(head, sizeof head);
    out->write(logits.data(), logits.size() * sizeof(float));
    out->commit();
    return 0;
  }
  JsonWriter j;
  j.begin_object();
  j.kv("mode", mode);
  j.kv("vocab", V);
  j.key("tokens").begin_array();
  for (int t : tokens) j.value(t);
  j.end_array();
  j.key("logits").begin_array();
  for (int i = 0; i < n; ++i) {
    j.begin_array();
    for (int v = 0; v < V; ++v) j.value(logits[static_cast<size_t>(i) * V + v]);
    j.end_array();
  }
  j.end_array();
  j.end_object();
  std::printf("%s\n", j.str().c_str());
  return 0;
}

}  // namespace kivi::tools
