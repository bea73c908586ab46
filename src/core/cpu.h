// SIMD target selection. Kernels are compiled for every target Highway supports on
// this architecture and one is chosen at run time; these helpers name the targets and
// let tests and benchmarks force one.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kivi::cpu {

struct Target {
  int64_t bits;      // Highway's HWY_* bit
  std::string name;  // "AVX3", "AVX2", "SSE4", "EMU128", ...
};

// Targets compiled into this binary and supported by this CPU, best first.
std::vector<Target> available_targets();

// The target dispatch currently picks.
std::string current_target_name();

// Restricts dispatch to the named target ("avx2", "AVX2", "scalar" = EMU128/SCALAR).
// Throws kivi::Error naming the valid choices if unknown or unsupported here.
void force_target(const std::string& name);

// Restores the default choice (the best available target).
void reset_target();

// Forces the target with the given Highway bit (tests loop over available_targets()).
void force_target_bits(int64_t bits);

// A one-line description of the CPU: model name and the SIMD features that matter.
std::string cpu_description();

}  // namespace kivi::cpu
