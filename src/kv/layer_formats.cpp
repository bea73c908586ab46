#include "kv/layer_formats.h"

#include <cstdlib>

#include "core/error.h"

namespace kivi::kv {

namespace {

// A layer number of at most 7 digits, or -1.
long layer_number(const std::string& s) {
  if (s.empty() || s.size() > 7 || s.find_first_not_of("0123456789") != std::string::npos)
    return -1;
  return std::strtol(s.c_str(), nullptr, 10);
}

std::string trim(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t"), b = s.find_last_not_of(" \t");
  return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}

}  // namespace

std::vector<CacheConfig::LayerFormats> parse_layer_formats(const std::string& spec, int n_layers,
                                                           Int8Granularity gran,
                                                           const char* option) {
  std::vector<CacheConfig::LayerFormats> out(n_layers);
  std::vector<char> set(n_layers, 0);
  bool have_rest = false;
  CacheConfig::LayerFormats rest;
  if (trim(spec).empty()) fail("%s: an empty map (expected LAYERS:FORMAT;...)", option);
  size_t i = 0;
  while (i <= spec.size()) {
    const size_t e = std::min(spec.find(';', i), spec.size());
    const std::string rule = trim(spec.substr(i, e - i));
    i = e + 1;
    if (rule.empty()) continue;
    const size_t colon = rule.find(':');
    if (colon == std::string::npos || colon == 0 || colon + 1 == rule.size() ||
        rule.find(':', colon + 1) != std::string::npos)
      fail("%s: rule '%s' is not LAYERS:FORMAT (e.g. 0,1:kivi4 or *:kivi2)", option, rule.c_str());
    const std::string layers = trim(rule.substr(0, colon)), fmt = trim(rule.substr(colon + 1));
    CacheConfig::LayerFormats f;
    const size_t slash = fmt.find('/');
    const std::string kf = trim(fmt.substr(0, slash));
    const std::string vf = slash == std::string::npos ? kf : trim(fmt.substr(slash + 1));
    f.k = {parse_format(kf, option), gran};
    f.v = {parse_format(vf, option), gran};
    if (layers == "*") {
      if (have_rest) fail("%s: '*' appears in two rules", option);
      have_rest = true;
      rest = f;
      continue;
    }
    size_t j = 0;
    while (j <= layers.size()) {
      const size_t c = std::min(layers.find(',', j), layers.size());
      const std::string item = trim(layers.substr(j, c - j));
      j = c + 1;
      const size_t dash = item.find('-');
      const long a = layer_number(trim(item.substr(0, dash)));
      const long b = dash == std::string::npos ? a : layer_number(trim(item.substr(dash + 1)));
      if (a < 0 || b < 0 || b < a)
        fail("%s: '%s' in rule '%s' is not a layer or a range A-B of layers", option, item.c_str(),
             rule.c_str());
      if (b >= n_layers)
        fail("%s: rule '%s' names layer %ld, but the model has %d layers (0 to %d)", option,
             rule.c_str(), b, n_layers, n_layers - 1);
      for (long l = a; l <= b; ++l) {
        if (set[l]) fail("%s: layer %ld is named by two rules", option, l);
        set[l] = 1;
        out[l] = f;
      }
    }
  }
  for (int l = 0; l < n_layers; ++l) {
    if (set[l]) continue;
    if (!have_rest)
      fail("%s: layer %d has no format (name it, or add a rule '*:FORMAT' for the rest)", option,
           l);
    out[l] = rest;
  }
  return out;
}

std::string describe_layer_formats(const CacheConfig& c) {
  const std::vector<CacheConfig::LayerFormats> f = c.formats();
  auto one = [](const CacheConfig::LayerFormats& x) {
    return x.k == x.v ? describe(x.k) : "K " + describe(x.k) + " / V " + describe(x.v);
  };
  if (f.size() == 1) return one(f[0]);
  std::string s = "layers";
  for (size_t a = 0; a < f.size();) {
    size_t b = a;
    while (b + 1 < f.size() && f[b + 1] == f[a]) ++b;
    s += a == 0 ? " " : ", ";
    s += a == b ? strfmt("%zu ", a) : strfmt("%zu-%zu ", a, b);
    s += one(f[a]);
    a = b + 1;
  }
  return s;
}

}  // namespace kivi::kv
