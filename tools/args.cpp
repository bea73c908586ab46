#include "args.h"

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "core/error.h"
#include "core/suggest.h"

namespace kivi::tools {

Args::Args(std::string command, std::string synopsis, std::string description)
    : command_(std::move(command)),
      synopsis_(std::move(synopsis)),
      description_(std::move(description)) {
  add_flag("help", 'h', "Show this help and exit.");
}

void Args::add(const std::string& l, char s, const std::string& mv, const std::string& h,
               const std::string& def) {
  opts_.push_back({l, s, mv, h, def, false, current_section_, {}});
}
void Args::replace(const std::string& l, const std::string& mv, const std::string& h,
                   const std::string& def) {
  for (auto& o : opts_) {
    if (o.long_name == l) {
      o.metavar = mv;
      o.help = h;
      o.def = def;
      return;
    }
  }
  fail("internal: option --%s is not declared for '%s'", l.c_str(), command_.c_str());
}

void Args::alias(const std::string& spelled, const std::string& l) {
  for (auto& o : opts_) {
    if (o.long_name == l) {
      o.aliases.push_back(spelled);
      return;
    }
  }
  fail("internal: option --%s is not declared for '%s'", l.c_str(), command_.c_str());
}

const Args::Opt* Args::find_alias(const std::string& spelled) const {
  for (const auto& o : opts_) {
    for (const auto& a : o.aliases)
      if (a == spelled) return &o;
  }
  return nullptr;
}

std::vector<std::string> Args::spellings() const {
  std::vector<std::string> out;
  for (const auto& o : opts_) {
    out.push_back("--" + o.long_name);
    for (const auto& a : o.aliases) out.push_back(a);
  }
  return out;
}

void Args::add_flag(const std::string& l, char s, const std::string& h) {
  opts_.push_back({l, s, "", h, "", true, current_section_, {}});
}
void Args::positionals(const std::string& names, int mn, int mx) {
  pos_names_ = names;
  pos_min_ = mn;
  pos_max_ = mx;
}
void Args::section(const std::string& title) { current_section_ = title; }

const Args::Opt* Args::find_long(const std::string& n) const {
  for (const auto& o : opts_)
    if (o.long_name == n) return &o;
  return nullptr;
}
const Args::Opt* Args::find_short(char c) const {
  for (const auto& o : opts_)
    if (c && o.short_name == c) return &o;
  return nullptr;
}
const Args::Opt& Args::spec(const std::string& name) const {
  const Opt* o = find_long(name);
  if (!o) fail("internal: option --%s is not declared for '%s'", name.c_str(), command_.c_str());
  return *o;
}

bool Args::parse(int argc, char** argv, int first) {
  const std::string see = " (see 'kivi " + command_ + " --help')";
  for (int i = first; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--") {
      for (++i; i < argc; ++i) pos_.push_back(argv[i]);
      break;
    }
    const Opt* o = nullptr;
    std::string value;
    bool has_value = false;
    const std::string head = a.substr(0, a.find('='));
    if (head == "-ngl" || head == "--n-gpu-layers" || head == "--gpu-layers") {
      fail("%s: kivi.cpp runs on the CPU and has no GPU offload; leave it out", head.c_str());
    }
    if (head == "-fa" || head == "--flash-attn") {
      // llama.cpp's fused attention switch: kivi.cpp's attention is always fused.
      std::fprintf(stderr, "note: %s is accepted and ignored (attention here is always fused)\n",
                   head.c_str());
      if (a == head && i + 1 < argc &&
          (std::string(argv[i + 1]) == "on" || std::string(argv[i + 1]) == "off" ||
           std::string(argv[i + 1]) == "auto"))
        ++i;
      continue;
    }
    if (const Opt* al = find_alias(head)) {
      o = al;
      if (head.size() < a.size()) {
        value = a.substr(head.size() + 1);
        has_value = true;
      }
    } else if (a.rfind("--", 0) == 0) {
      std::string name = a.substr(2);
      const auto eq = name.find('=');
      if (eq != std::string::npos) {
        value = name.substr(eq + 1);
        name = name.substr(0, eq);
        has_value = true;
      }
      o = find_long(name);
      if (!o)
        fail("unknown option '--%s' for 'kivi %s'%s%s", name.c_str(), command_.c_str(),
             did_you_mean("--" + name, spellings()).c_str(), see.c_str());
    } else if (a.size() >= 2 && a[0] == '-' &&
               !(std::isdigit(static_cast<unsigned char>(a[1])) || a[1] == '.')) {
      o = find_short(a[1]);
      if (!o)
        fail("unknown option '%s' for 'kivi %s'%s%s", a.c_str(), command_.c_str(),
             did_you_mean(head, spellings()).c_str(), see.c_str());
      if (a.size() > 2) {
        value = a.substr(2);
        has_value = true;
      }
    } else {
      pos_.push_back(a);
      continue;
    }
    if (o->is_flag) {
      if (has_value) fail("option --%s takes no value%s", o->long_name.c_str(), see.c_str());
      values_[o->long_name] = "1";
      continue;
    }
    if (!has_value) {
      if (i + 1 >= argc)
        fail("option --%s needs a value (%s)%s", o->long_name.c_str(), o->metavar.c_str(),
             see.c_str());
      value = argv[++i];
    }
    values_[o->long_name] = value;
  }
  if (flag("help")) return false;
  const int np = static_cast<int>(pos_.size());
  if (np < pos_min_) {
    fail("'kivi %s' needs %s%s", command_.c_str(),
         pos_names_.empty() ? "arguments" : pos_names_.c_str(), see.c_str());
  }
  if (np > pos_max_) {
    fail("unexpected argument '%s' for 'kivi %s'%s", pos_[pos_max_].c_str(), command_.c_str(),
         see.c_str());
  }
  return true;
}

std::string Args::help() const {
  std::ostringstream o;
  o << "Usage: kivi " << command_ << " " << synopsis_ << "\n\n" << description_ << "\n";
  std::string section;
  for (const auto& opt : opts_) {
    if (opt.section != section) {
      section = opt.section;
      o << "\n" << section << ":\n";
    }
    std::string left = "  ";
    left += opt.short_name ? std::string("-") + opt.short_name + ", " : "    ";
    left += "--" + opt.long_name;
    for (const auto& al : opt.aliases) left += ", " + al;
    if (!opt.is_flag) left += " " + opt.metavar;
    o << left;
    if (left.size() < 30) {
      o << std::string(30 - left.size(), ' ');
    } else {
      o << "\n" << std::string(30, ' ');
    }
    // Wrap help at ~100 columns.
    std::istringstream words(opt.help + (opt.def.empty() ? "" : " (default: " + opt.def + ")"));
    std::string w;
    size_t col = 30;
    bool first = true;
    while (words >> w) {
      if (!first && col + 1 + w.size() > 100) {
        o << "\n" << std::string(30, ' ');
        col = 30;
        first = true;
      }
      if (!first) {
        o << ' ';
        ++col;
      }
      o << w;
      col += w.size();
      first = false;
    }
    o << "\n";
  }
  return o.str();
}

bool Args::given(const std::string& name) const {
  spec(name);
  return values_.count(name) != 0;
}

bool Args::flag(const std::string& name) const {
  spec(name);
  return values_.count(name) != 0;
}

std::string Args::str(const std::string& name) const {
  const Opt& o = spec(name);
  auto it = values_.find(name);
  return it == values_.end() ? o.def : it->second;
}

int64_t Args::integer(const std::string& name, int64_t lo, int64_t hi) const {
  const std::string s = str(name);
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (s.empty() || *end != '\0' || errno == ERANGE)
    fail("--%s: '%s' is not an integer", name.c_str(), s.c_str());
  if (v < lo || v > hi) {
    fail("--%s = %lld is out of range (valid: %lld to %lld)", name.c_str(), v,
         static_cast<long long>(lo), static_cast<long long>(hi));
  }
  return v;
}

double Args::number(const std::string& name, double lo, double hi) const {
  const std::string s = str(name);
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (s.empty() || *end != '\0' || !std::isfinite(v))
    fail("--%s: '%s' is not a number", name.c_str(), s.c_str());
  if (v < lo || v > hi)
    fail("--%s = %g is out of range (valid: %g to %g)", name.c_str(), v, lo, hi);
  return v;
}

std::vector<std::string> Args::list(const std::string& name) const {
  std::vector<std::string> out;
  std::string s = str(name), cur;
  for (char c : s) {
    if (c == ',') {
      if (!cur.empty()) out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  if (!cur.empty()) out.push_back(cur);
  return out;
}

std::vector<int64_t> Args::int_list(const std::string& name, int64_t lo, int64_t hi) const {
  std::vector<int64_t> out;
  for (const auto& s : list(name)) {
    char* end = nullptr;
    errno = 0;
    int64_t mult = 1;
    std::string t = s;
    if (!t.empty() && (t.back() == 'k' || t.back() == 'K')) {
      mult = 1024;
      t.pop_back();
    }
    const long long v = std::strtoll(t.c_str(), &end, 10);
    if (t.empty() || *end != '\0' || errno == ERANGE)
      fail("--%s: '%s' is not an integer", name.c_str(), s.c_str());
    const int64_t x = v * mult;
    if (x < lo || x > hi) {
      fail("--%s = %lld is out of range (valid: %lld to %lld)", name.c_str(),
           static_cast<long long>(x), static_cast<long long>(lo), static_cast<long long>(hi));
    }
    out.push_back(x);
  }
  if (out.empty()) fail("--%s: empty list", name.c_str());
  return out;
}

}  // namespace kivi::tools
