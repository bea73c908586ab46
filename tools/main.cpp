// The `kivi` command: generate, chat, serve, info, convert, logits, perplexity, bench, bench-attn,
// synth, eval, ...
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "common.h"
#include "serve_options.h"
#include "core/error.h"
#include "core/suggest.h"
#include "dist/dist.h"

namespace {

const char* kUsage =
    "Usage: kivi COMMAND [OPTIONS]\n"
    "\n"
    "kivi.cpp runs Llama-family models with a compressed KV cache (f16, int8, KIVI 2/4-bit)\n"
    "whose attention reads the compressed bytes directly.\n"
    "\n"
    "Commands:\n"
    "  generate     Generate text from a prompt, streaming it as it is produced.\n"
    "  chat         Interactive multi-turn chat in the model's chat format.\n"
    "  serve        OpenAI-compatible HTTP server: many requests batched over one KV block pool.\n"
    "  perplexity   Perplexity and KL divergence of a text, computed as deployed (streaming).\n"
    "  bench        Speed, memory and agreement of KV formats side by side on one model.\n"
    "  bench-attn   Decode-attention kernel benchmark per format, with a memory-bandwidth probe.\n"
    "  bench-batch  Batched decode steps at long random-filled contexts, per format and batch.\n"
    "  info         Describe a model (architecture, tensors, tokenizer) or a cache's memory "
    "needs.\n"
    "  convert      Convert a llama2.c checkpoint and tokenizer to GGUF.\n"
    "  synth        Write a GGUF with seeded random weights at a real model's shape (speed "
    "tests).\n"
    "  logits       Print or save the logits of every position of a prompt (for checks).\n"
    "  quantize     Rewrite a GGUF with its weight matrices in another type (q8_0, q4_k_m, ...).\n"
    "  bench-matvec Matrix-vector speed per weight type, against the memory-bandwidth probe.\n"
    "  bench-serve  Load generator for the server: concurrent streaming clients, tokens/s, "
    "latency.\n"
    "  bench-comm   Under mpirun: the time of --dist tp's collectives between the ranks.\n"
    "  bench-grammar Structured output's cost per token: grammar masks beside a decode step.\n"
    "  bench-sparse Decode attention per token, dense against block-sparse, selection timed "
    "apart.\n"
    "  eval         Long-context retrieval (passkey, needle, kv-retrieval) and the attention "
    "recall\n"
    "               of block-sparse selection.\n"
    "\n"
    "Run 'kivi COMMAND --help' for a command's options. Docs: docs/README.md.\n";

// The commands that run as one job over the ranks of mpirun (--dist).
bool runs_distributed(const std::string& cmd) {
  return cmd == "generate" || cmd == "chat" || cmd == "perplexity" || cmd == "logits" ||
         cmd == "serve" || cmd == "bench" || cmd == "bench-comm";
}

// Under mpirun: every rank must run the same distributed command with the same
// arguments; ranks other than 0 then print nothing.
void start_ranks(int argc, char** argv) {
  namespace dist = kivi::dist;
  if (dist::size() == 1) return;
  const std::string cmd = argc > 1 ? argv[1] : "";
  if (!runs_distributed(cmd)) {
    throw dist::CollectiveError(
        kivi::strfmt("'kivi %s' runs in one process; under mpirun only generate, chat, "
                     "perplexity, logits, serve, bench and bench-comm run (with --dist)",
                     cmd.c_str()));
  }
  uint64_t h = 1469598103934665603ull;  // FNV-1a of the arguments
  for (int i = 1; i < argc; ++i) {
    for (const char* p = argv[i]; *p; ++p)
      h = (h ^ static_cast<unsigned char>(*p)) * 1099511628211ull;
    h = (h ^ 0xff) * 1099511628211ull;
  }
  dist::check_same(h, "command lines");
  dist::silence_other_ranks();
}

int run(int argc, char** argv) {
  using namespace kivi::tools;
  if (argc < 2) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  const std::string cmd = argv[1];
  if (cmd == "--help" || cmd == "-h" || cmd == "help") {
    std::fputs(kUsage, stdout);
    return 0;
  }
  if (cmd == "--version") {
    std::printf("kivi 0.1.0 (%s)\n",
                kivi::dist::built_with_mpi() ? "with MPI: --dist" : "without MPI");
    return 0;
  }
  using Command = int (*)(int, char**);
  static const std::pair<const char*, Command> kCommands[] = {
      {"generate", cmd_generate},
      {"info", cmd_info},
      {"convert", cmd_convert},
      {"logits", cmd_logits},
      {"perplexity", cmd_perplexity},
      {"bench-attn", cmd_bench_attn},
      {"bench", cmd_bench},
      {"bench-batch", cmd_bench_batch},
      {"synth", cmd_synth},
      {"chat", cmd_chat},
      {"quantize", cmd_quantize},
      {"bench-matvec", cmd_bench_matvec},
      {"bench-sparse", cmd_bench_sparse},
      {"serve", cmd_serve},
      {"bench-serve", cmd_bench_serve},
      {"bench-comm", cmd_bench_comm},
      {"bench-grammar", cmd_bench_grammar},
      {"eval", cmd_eval},
  };
  try {
    start_ranks(argc, argv);
    std::vector<std::string> names;
    for (const auto& [name, fn] : kCommands) {
      if (cmd == name) return fn(argc, argv);
      names.push_back(name);
    }
    std::fprintf(stderr, "kivi: error: unknown command '%s'%s (run 'kivi --help' for the list)\n",
                 cmd.c_str(), kivi::did_you_mean(cmd, names).c_str());
    return 2;
  } catch (const kivi::dist::CollectiveError& e) {
    kivi::dist::exit_on_error(e.what(), true, 1);
  } catch (const kivi::Error& e) {
    kivi::dist::exit_on_error(e.what(), false, 1);
  } catch (const std::bad_alloc&) {
    kivi::dist::exit_on_error("out of memory", false, 1);
  } catch (const std::exception& e) {
    kivi::dist::exit_on_error(e.what(), false, 1);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "serve") == 0) kivi::tools::block_stop_signals();
  kivi::dist::init(&argc, &argv);
  const int rc = run(argc, argv);
  kivi::dist::finalize();
  return rc;
}
