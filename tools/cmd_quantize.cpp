#include <sys/stat.h>

#include <cstdio>
#include <string>

#include "common.h"
#include "io/atomic_file.h"
#include "core/error.h"
#include "core/json.h"
#include "core/progress.h"
#include "core/sysinfo.h"
#include "core/threadpool.h"
#include "core/timer.h"
#include "quant/quantize_file.h"

namespace kivi::tools {

int cmd_quantize(int argc, char** argv) {
  Args a(
      "quantize", "IN.gguf OUT.gguf TYPE [--threads N] [--json]",
      "Writes OUT.gguf: IN.gguf with its weight matrices stored as TYPE. Metadata and the\n"
      "tensors that are not weight matrices (norms, one-dimensional tensors) are copied as they\n"
      "are; the matrices are dequantized exactly and quantized again, so any readable type can\n"
      "be the input.\n"
      "\n"
      "Plain types store every matrix in that type (llama.cpp's quantize --pure). q4_k_m is\n"
      "llama.cpp's Q4_K_M mix: Q4_K, but Q6_K for output.weight (token_embd.weight when the\n"
      "classifier is tied to it) and for attn_v and ffn_down in the layers llama.cpp gives more\n"
      "bits (the first and last eighth, and every third layer in between). A matrix whose rows\n"
      "are not whole blocks falls back: Q4_K->Q5_0, Q5_K->Q5_1, Q6_K->Q8_0, Q2_K/Q3_K->Q4_0,\n"
      "else F16. Q8_0, Q4_0, Q4_1, Q5_0 and Q5_1 give ggml's bytes; docs/WEIGHTS.md describes\n"
      "the K-quants.");
  add_threads_options(a);
  a.add_flag("json", 0,
             "Print one JSON object: input, output, type, tensors, converted, bytes_in, bytes_out, "
             "file_bytes, "
             "per_type [{type, tensors, bytes}], seconds.");
  a.add("simd", 0, "TARGET", "Force a SIMD target (no effect on the bytes written).");
  a.positionals("IN.gguf OUT.gguf TYPE", 3, 3);
  if (!parse_command_line(a, argc, argv)) return 0;  // --help printed
  const bool json = a.flag("json");
  const std::string in = a.positional()[0], out = a.positional()[1];
  const quant::FileType& ft = quant::parse_file_type(a.positional()[2]);
  // The same file by any name (./t.gguf, an absolute path, a link) is refused, before
  // anything is written or removed.
  io::check_output_is_not_input(out, {in}, "quantize: the output");
  struct stat st;
  if (stat(out.c_str(), &st) == 0 && S_ISDIR(st.st_mode))
    fail("quantize: %s is a directory; give a file path", out.c_str());

  // Sizes first: nothing is written if the disk cannot hold the result.
  const quant::QuantizeFileResult plan = quant::plan_quantize_file(in, ft);
  const uint64_t free_disk = sys::free_disk_bytes(out);
  struct stat in_st;
  const uint64_t in_size = stat(in.c_str(), &in_st) == 0 ? static_cast<uint64_t>(in_st.st_size) : 0;
  // Tensor data, plus metadata and padding as large as the input's.
  const uint64_t need = plan.bytes_out + (in_size > plan.bytes_in ? in_size - plan.bytes_in : 0);
  if (free_disk > 0 && need > free_disk) {
    fail("'%s' would take about %s but only %s of disk space is free there", out.c_str(),
         sys::human_bytes(static_cast<double>(need)).c_str(),
         sys::human_bytes(static_cast<double>(free_disk)).c_str());
  }

  ThreadPool pool(threads_option(a));
  Progress bar("quantize", 1, "B", !json && Progress::stderr_is_terminal());
  const double t0 = now_seconds();
  quant::QuantizeFileResult r;
  try {
    r = quant::quantize_file(in, out, ft, &pool, [&](uint64_t done, uint64_t total) {
      bar.set_total(static_cast<int64_t>(total));
      bar.update(static_cast<int64_t>(done));
    });
  } catch (...) {
    std::remove(out.c_str());  // no partial file left behind
    throw;
  }
  const double secs = now_seconds() - t0;
  bar.finish();
  if (json) {
    JsonWriter j;
    j.begin_object();
    j.kv("input", in)
        .kv("output", out)
        .kv("type", ft.name)
        .kv("tensors", r.n_tensors)
        .kv("converted", r.n_converted);
    j.kv("bytes_in", r.bytes_in).kv("bytes_out", r.bytes_out).kv("file_bytes", r.file_bytes);
    j.key("per_type").begin_array();
    for (const auto& t : r.per_type)
      j.begin_object()
          .kv("type", t.type)
          .kv("tensors", t.tensors)
          .kv("bytes", t.bytes)
          .end_object();
    j.end_array();
    j.kv("seconds", secs).end_object();
    std::printf("%s\n", j.str().c_str());
    return 0;
  }
  std::fprintf(stderr, "wrote %s (%s): %d tensors, %d converted, weights %s -> %s, in %.1f s\n",
               out.c_str(), ft.name, r.n_tensors, r.n_converted,
               sys::human_bytes(static_cast<double>(r.bytes_in)).c_str(),
               sys::human_bytes(static_cast<double>(r.bytes_out)).c_str(), secs);
  for (const auto& t : r.per_type) {
    std::fprintf(stderr, "  %-6s %5d tensors %s\n", t.type.c_str(), t.tensors,
                 sys::human_bytes(static_cast<double>(t.bytes)).c_str());
  }
  return 0;
}

}  // namespace kivi::tools
