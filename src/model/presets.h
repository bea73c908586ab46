// Named model shapes: for `kivi synth` (random weights at a real model's size) and
// for `kivi info --preset` (KV memory tables without the model).
#pragma once

#include <string>
#include <vector>

#include "model/config.h"

namespace kivi::model {

// Llama 3.1 RoPE scaling parameters (llama3_rope_factors); factor 0 = none.
struct RopeScaling {
  float factor = 0.0f;
  float low_freq_factor = 1.0f;
  float high_freq_factor = 4.0f;
  float original_ctx = 8192.0f;
};

struct Preset {
  std::string name;
  std::string description;
  ModelConfig config;
  RopeScaling rope_scaling;  // applied by `kivi synth` after its shape options
};

// Synthetic LongRoPE (Phi-3.5, Phi-4-mini style) over c's rotated channels for a model
// trained on `orig` tokens: short divisors from 1 to 1.25 and long ones from 1 to `factor`
// over the pairs, attention factor sqrt(1 + ln factor / ln orig) (1 when orig is 1).
void synthetic_long_rope(ModelConfig& c, float factor, int orig);

const std::vector<Preset>& presets();
// Throws kivi::Error listing the names if unknown.
const Preset& find_preset(const std::string& name);

}  // namespace kivi::model
