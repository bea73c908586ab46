// Per-layer precision: a map from layers to key and value formats (--kv-cache-layers), and
// its description.
//
// A map is rules separated by ';', each LAYERS:FORMAT. LAYERS is '*' (every layer no other
// rule names) or a comma-separated list of layer numbers and ranges A-B; FORMAT is one format
// for keys and values (kivi4) or KEY/VALUE (kivi4/kivi2). Every layer of the model is
// covered exactly once. Example: "0,1,15:kivi4;*:kivi2" keeps the first two layers and the
// last of a 16-layer model at 4 bits and the others at 2.
#pragma once

#include <string>
#include <vector>

#include "kv/format.h"

namespace kivi::kv {

// The formats of n_layers layers from a map; int8 streams take `gran`. Throws kivi::Error
// naming the rule and the problem: a malformed rule, an unknown format, a layer the model
// lacks, a layer named twice or one left uncovered.
std::vector<CacheConfig::LayerFormats> parse_layer_formats(
    const std::string& spec, int n_layers, Int8Granularity gran,
    const char* option = "--kv-cache-layers");

// "layers 0-1 kivi4, 2-15 K kivi2 / V kivi4": runs of consecutive layers with equal formats.
std::string describe_layer_formats(const CacheConfig& c);

}  // namespace kivi::kv
