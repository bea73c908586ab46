#include "core/cpu.h"

#include <hwy/highway.h>
#include <hwy/targets.h>

#include <algorithm>
#include <cctype>
#include <fstream>

#include "core/error.h"

namespace kivi::cpu {

std::vector<Target> available_targets() {
  std::vector<Target> out;
  for (int64_t t : hwy::SupportedAndGeneratedTargets()) out.push_back({t, hwy::TargetName(t)});
  return out;
}

std::string current_target_name() {
  // The best target still enabled is what HWY_DYNAMIC_DISPATCH chooses.
  const auto targets = hwy::SupportedAndGeneratedTargets();
  return targets.empty() ? std::string("none") : std::string(hwy::TargetName(targets.front()));
}

static std::string upper(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

void force_target_bits(int64_t bits) { hwy::SetSupportedTargetsForTest(bits); }

void reset_target() { hwy::SetSupportedTargetsForTest(0); }

void force_target(const std::string& name) {
  reset_target();
  const auto avail = available_targets();
  std::string want = upper(name);
  if (want == "SCALAR") want = "EMU128";
  for (const auto& t : avail) {
    if (upper(t.name) == want || (want == "EMU128" && upper(t.name) == "SCALAR")) {
      force_target_bits(t.bits);
      return;
    }
  }
  std::string choices;
  for (const auto& t : avail) choices += (choices.empty() ? "" : ", ") + t.name;
  fail("unknown or unsupported SIMD target '%s' (available here: %s)", name.c_str(),
       choices.c_str());
}

std::string cpu_description() {
  std::string model = "unknown CPU";
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("model name", 0) == 0) {
      auto p = line.find(':');
      if (p != std::string::npos) model = line.substr(p + 2);
      break;
    }
  }
  std::string targets;
  for (const auto& t : available_targets()) targets += (targets.empty() ? "" : " ") + t.name;
  return model + " (SIMD targets: " + targets + ")";
}

}  // namespace kivi::cpu
