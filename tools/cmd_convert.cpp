#include <cstdio>
#include <string>
#include <vector>

#include "common.h"
#include "core/error.h"
#include "core/progress.h"
#include "model/convert.h"

namespace kivi::tools {

int cmd_convert(int argc, char** argv) {
  Args a(
      "convert", "IN.bin -t TOKENIZER.bin -o OUT.gguf [--outtype f32|f16]",
      "Converts a llama2.c checkpoint and its tokenizer to GGUF v3 with the key and tensor names\n"
      "of the GGUF spec and llama.cpp (llama architecture, 'llama' SentencePiece tokenizer), so\n"
      "other GGUF tools accept the file. Weights keep their layout: llama2.c's rotary pairs are\n"
      "already the interleaved pairs GGUF's llama layout expects.");
  a.add("tokenizer", 't', "FILE", "llama2.c tokenizer file (required).");
  a.add("output", 'o', "FILE", "Output GGUF path (required).");
  a.add("outtype", 0, "TYPE", "Matrix storage: f32 (bit-exact) or f16. Norms stay f32.", "f32");
  a.add("name", 0, "NAME", "general.name (default: the input file name).");
  a.positionals("IN.bin", 1, 1);
  if (!parse_command_line(a, argc, argv)) return 0;  // --help printed
  const std::string in = a.positional()[0];
  if (!a.given("tokenizer")) fail("convert: give the tokenizer with -t TOKENIZER.bin");
  if (!a.given("output")) fail("convert: give the output path with -o OUT.gguf");
  const std::string out = a.str("output"), outtype = a.str("outtype");
  if (outtype != "f32" && outtype != "f16")
    fail("--outtype: unknown value '%s' (valid: f32, f16)", outtype.c_str());
  const bool f16 = outtype == "f16";

  Progress bar("convert", 1, "B", true);
  const auto r = model::convert_llama2c_to_gguf(in, a.str("tokenizer"), out, f16, a.str("name"),
                                                [&](uint64_t done, uint64_t total) {
                                                  bar.set_total(static_cast<int64_t>(total));
                                                  bar.update(static_cast<int64_t>(done));
                                                });
  bar.finish();
  std::fprintf(stderr, "wrote %s (%llu bytes, %d tensors, %s)\n", out.c_str(),
               static_cast<unsigned long long>(r.bytes), r.n_tensors, outtype.c_str());
  return 0;
}

}  // namespace kivi::tools
