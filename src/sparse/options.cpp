#include "sparse/options.h"

#include "core/error.h"

namespace kivi::sparse {

Kind parse_kind(const std::string& s) {
  if (s == "off") return Kind::kOff;
  if (s == "quest") return Kind::kQuest;
  if (s == "max") return Kind::kMax;
  if (s == "mean") return Kind::kMean;
  if (s == "random") return Kind::kRandom;
  if (s == "fix") return Kind::kFix;
  fail("--sparse: unknown value '%s' (valid: quest, max, mean, fix, random, off)", s.c_str());
}

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::kOff:
      return "off";
    case Kind::kQuest:
      return "quest";
    case Kind::kMax:
      return "max";
    case Kind::kMean:
      return "mean";
    case Kind::kRandom:
      return "random";
    case Kind::kFix:
      return "fix";
  }
  return "?";
}

Heads parse_heads(const std::string& s) {
  if (s == "per") return Heads::kPer;
  if (s == "shared") return Heads::kShared;
  fail("--sparse-heads: unknown value '%s' (valid: per, shared)", s.c_str());
}

const char* heads_name(Heads h) { return h == Heads::kShared ? "shared" : "per"; }

void Options::validate() const {
  if (!enabled()) return;
  if (block < 1 || block > 65536) fail("--sparse-block %d: expected 1 to 65536 tokens", block);
  if (budget < 0) fail("--sparse-budget %d: expected 0 or more tokens", budget);
  if (sinks < 0) fail("--sparse-sinks %d: expected 0 or more tokens", sinks);
  if (local < 1)
    fail("--sparse-local %d: expected 1 or more tokens (the query itself is local)", local);
  if (dense_layers < 0) fail("--sparse-dense-layers %d: expected 0 or more", dense_layers);
  if (reselect < 1 || reselect > 65536)
    fail("--sparse-reselect %d: expected 1 to 65536 decode steps", reselect);
  if (reuse_layers < 1 || reuse_layers > 65536)
    fail("--sparse-reuse-layers %d: expected 1 to 65536 layers", reuse_layers);
  if (preselect < 0) fail("--sparse-preselect %d: expected 0 or more tokens", preselect);
  if (candidates < 0) fail("--sparse-candidates %d: expected 0 or more tokens", candidates);
}

std::string describe(const Options& o) {
  if (!o.enabled()) return "";
  std::string s = strfmt("%s, blocks of %d, budget %d, sinks %d, local %d", kind_name(o.kind),
                         o.block, o.budget, o.sinks, o.local);
  if (o.dense_layers > 0)
    s += strfmt(", %d dense layer%s", o.dense_layers, o.dense_layers == 1 ? "" : "s");
  if (o.heads == Heads::kShared) s += ", shared by the KV heads";
  if (o.reselect > 1) s += strfmt(", reselect every %d steps", o.reselect);
  if (o.reuse_layers > 1) s += strfmt(", one selection per %d layers", o.reuse_layers);
  if (o.preselect > 0)
    s += strfmt(", preselect %d candidate tokens by the last %d prompt tokens", o.candidates,
                o.preselect);
  return s;
}

SummaryKind summary_kind(Kind k) {
  switch (k) {
    case Kind::kQuest:
      return SummaryKind::kMinMax;
    case Kind::kMax:
      return SummaryKind::kMax;
    case Kind::kMean:
      return SummaryKind::kMean;
    case Kind::kFix:
      return SummaryKind::kFixed;
    default:
      return SummaryKind::kNone;
  }
}

int fixed_count(int B) { return B < 4 ? B : 4; }
int fixed_offset(int B, int j) { return B < 4 ? j : j * B / 4; }

int summary_vectors(SummaryKind s) {
  return s == SummaryKind::kMinMax ? 2 : s == SummaryKind::kNone ? 0 : 1;
}

}  // namespace kivi::sparse
