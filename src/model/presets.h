// Named model shapes: for `kivi synth` (random weights at a real model's size) and
// for `kivi info --preset` (KV memory tables without the model).
#pragma once

#include <string>
#include <vector>

#include "model/config.h"

namespace kivi::model {

struct Preset {
  std::string name;
  std::string description;
  ModelConfig config;
};

const std::vector<Preset>& presets();
// Throws kivi::Error listing the names if unknown.
const Preset& find_preset(const std::string& name);

}  // namespace kivi::model
