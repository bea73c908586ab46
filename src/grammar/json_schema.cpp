#include "grammar/json_schema.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <deque>
#include <map>
#include <set>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "grammar/gbnf.h"
#include "grammar/json_schema_rules.h"

namespace kivi::grammar {

SchemaError::SchemaError(const std::string& message, std::string pointer)
    : Error(pointer.empty() ? "json schema: " + message
                            : "json schema at " + pointer + ": " + message),
      pointer_(std::move(pointer)),
      message_(message) {}

namespace {

using namespace schema_rules;

template <class Json>
class Converter {
 public:
  explicit Converter(const Json& root) : root_(root) {
    for (const auto& p : primitives()) taken_.insert(p.first);
    taken_.insert("root");
  }

  std::string run() {
    refs_[""] = "root";
    slot("root");
    current_ = "root";
    at_head_ = true;
    set_rule("root", visit(root_, "", 0, "root"));
    while (!todo_.empty()) {
      const Pending p = todo_.front();
      todo_.pop_front();
      current_ = p.name;
      at_head_ = true;
      set_rule(p.name, visit(*p.schema, p.pointer, p.depth, p.name));
    }
    check_ref_cycles();
    std::string out;
    for (const auto& [name, body] : rules_) out += name + " ::= " + body + "\n";
    check_productive(out);
    return out;
  }

 private:
  struct Pending {
    const Json* schema;
    std::string pointer;
    int depth;
    std::string name;
  };
  struct Edge {
    std::string to, pointer;
  };
  struct Bound {
    bool set = false;
    int64_t v = 0;
    bool strict = false;
  };

  const Json& root_;
  std::vector<std::pair<std::string, std::string>> rules_;  // in the order made
  std::unordered_map<std::string, size_t> index_;           // rule name -> rules_ position
  std::unordered_map<std::string, std::string> by_body_;    // shared helper rules
  std::set<std::string> taken_;                             // every name in use or reserved
  std::set<std::string> added_primitives_;
  std::map<std::string, std::string> refs_;             // reference pointer -> rule name
  std::deque<Pending> todo_;                            // referenced schemas still to convert
  std::map<std::string, std::vector<Edge>> head_refs_;  // rule -> refs it starts with
  std::string current_;                                 // the rule being converted
  bool at_head_ = true;  // nothing is matched yet in the current rule
  size_t bytes_ = 0;
  std::unordered_map<const Json*, std::unordered_map<std::string, const Json*>> key_index_;

  // --- rules -------------------------------------------------------------------

  void charge(size_t n, const std::string& ptr) {
    bytes_ += n;
    if (bytes_ > kMaxGrammarBytes) {
      throw SchemaError(strfmt("the grammar grows past %zu bytes", kMaxGrammarBytes), ptr);
    }
  }

  std::string fresh_name(const std::string& hint) {
    const std::string base = sanitize_name(hint);
    std::string name = base;
    for (int k = 2; taken_.count(name); ++k) name = base + "-v" + std::to_string(k);
    taken_.insert(name);
    return name;
  }

  void slot(const std::string& name) {
    index_[name] = rules_.size();
    rules_.push_back({name, ""});
  }

  void set_rule(const std::string& name, const std::string& body) {
    charge(name.size() + body.size() + 6, "");
    rules_[index_.at(name)].second = body;
  }

  // A helper rule; rules with the same body are shared.
  std::string add_rule(const std::string& hint, const std::string& body) {
    auto it = by_body_.find(body);
    if (it != by_body_.end()) return it->second;
    const std::string name = fresh_name(hint);
    slot(name);
    set_rule(name, body);
    by_body_[body] = name;
    return name;
  }

  std::string prim(const std::string& name) {
    if (added_primitives_.insert(name).second) {
      const Primitive& p = primitives().at(name);
      slot(name);
      set_rule(name, p.body);
      for (const char* d : p.deps) prim(d);
    }
    return name;
  }

  // --- keyword readers ---------------------------------------------------------

  static std::string at(const std::string& ptr, const std::string& key) {
    return ptr + "/" + escape_pointer(key);
  }

  // A non-negative integer count (minItems, maxLength, ...), or -1 when absent.
  int64_t read_count(const Json& s, const char* key, const std::string& ptr, int64_t limit) {
    auto it = s.find(key);
    if (it == s.end()) return -1;
    const std::string kp = at(ptr, key);
    const double v = it->is_number() ? it->template get<double>() : -1;
    if (!(v >= 0) || std::floor(v) != v) {
      throw SchemaError(strfmt("'%s' must be a non-negative integer", key), kp);
    }
    if (v > static_cast<double>(limit)) {
      throw SchemaError(
          strfmt("'%s' above %lld is not supported", key, static_cast<long long>(limit)), kp);
    }
    return static_cast<int64_t>(v);
  }

  // The tighter of minimum / exclusiveMinimum (lower) or maximum / exclusiveMaximum
  // (draft 4's boolean exclusive keywords included), clamped to +-kHuge. A bound that
  // is not a whole number is rounded toward the inside for integers and refused for
  // numbers.
  Bound read_bound(const Json& s, const std::string& ptr, bool lower, bool integers) {
    const char* plain = lower ? "minimum" : "maximum";
    const char* excl = lower ? "exclusiveMinimum" : "exclusiveMaximum";
    Bound b;
    auto ex = s.find(excl);
    auto consider = [&](const char* key, bool strict) {
      auto it = s.find(key);
      if (it == s.end()) return;
      const std::string kp = at(ptr, key);
      Bound c{true, 0, strict};
      if (it->is_number_unsigned()) {
        c.v = static_cast<int64_t>(std::min<uint64_t>(it->template get<uint64_t>(), kHuge));
      } else if (it->is_number_integer()) {
        c.v = std::clamp<int64_t>(it->template get<int64_t>(), -kHuge, kHuge);
      } else if (it->is_number_float()) {
        double d = it->template get<double>();
        if (std::floor(d) != d) {
          if (!integers) {
            throw SchemaError(strfmt("'%s' is supported for numbers only as a whole number", key),
                              kp);
          }
          d = lower ? std::ceil(d) : std::floor(d);
          c.strict = false;
        }
        c.v = d > kHuge ? kHuge : d < -kHuge ? -kHuge : static_cast<int64_t>(d);
      } else {
        throw SchemaError(strfmt("'%s' must be a number", key), kp);
      }
      const bool tighter =
          !b.set || (lower ? c.v > b.v : c.v < b.v) || (c.v == b.v && c.strict && !b.strict);
      if (tighter) b = c;
    };
    consider(plain, ex != s.end() && ex->is_boolean() && ex->template get<bool>());
    if (ex != s.end() && !ex->is_boolean()) consider(excl, true);
    return b;
  }

  std::vector<std::string> read_types(const Json& s, const std::string& ptr) {
    std::vector<std::string> out;
    auto it = s.find("type");
    if (it == s.end()) return out;
    const std::string tp = at(ptr, "type");
    auto add = [&](const Json& t, const std::string& p) {
      if (!t.is_string()) throw SchemaError("'type' must be a string or an array of them", p);
      const std::string name = t.template get<std::string>();
      if (std::find(std::begin(kTypes), std::end(kTypes), name) == std::end(kTypes)) {
        throw SchemaError("unknown type '" + name + "'", p);
      }
      if (std::find(out.begin(), out.end(), name) == out.end()) out.push_back(name);
    };
    if (it->is_array()) {
      if (it->empty()) throw SchemaError("'type' is an empty array", tp);
      for (size_t i = 0; i < it->size(); ++i) add((*it)[i], tp + "/" + std::to_string(i));
    } else {
      add(*it, tp);
    }
    return out;
  }

  static bool has_type(const Json& v, const std::string& type) {
    if (type == "null") return v.is_null();
    if (type == "boolean") return v.is_boolean();
    if (type == "object") return v.is_object();
    if (type == "array") return v.is_array();
    if (type == "string") return v.is_string();
    if (type == "number") return v.is_number();
    if (v.is_number_integer()) return true;
    if (!v.is_number_float()) return false;
    const double d = v.template get<double>();
    return std::isfinite(d) && std::floor(d) == d;
  }

  // A handled validation keyword of `s` other than those allowed, or nullptr.
  static const char* other_keyword(const Json& s, std::initializer_list<const char*> allowed) {
    for (auto it = s.begin(); it != s.end(); ++it) {
      const std::string& k = it.key();
      if (!kHandled.count(k)) continue;
      bool ok = false;
      for (const char* a : allowed) ok = ok || k == a;
      if (!ok) return kHandled.find(k)->c_str();
    }
    return nullptr;
  }

  void refuse_others(const Json& s, const std::string& ptr, const char* keyword,
                     std::initializer_list<const char*> allowed) {
    if (const char* k = other_keyword(s, allowed)) {
      throw SchemaError(strfmt("'%s' together with '%s' is not supported", keyword, k), at(ptr, k));
    }
  }

  // --- schemas -----------------------------------------------------------------

  std::string visit(const Json& s, const std::string& ptr, int depth, const std::string& hint) {
    if (depth > kMaxDepth) {
      throw SchemaError(strfmt("schemas nest deeper than %d levels", kMaxDepth), ptr);
    }
    if (s.is_boolean()) {
      if (s.template get<bool>()) return prim("value");
      throw SchemaError("the schema false admits no value", ptr);
    }
    if (!s.is_object()) throw SchemaError("a schema must be an object or a boolean", ptr);
    for (auto it = s.begin(); it != s.end(); ++it) {
      if (kUnsupported.count(it.key())) {
        throw SchemaError(
            "'" + it.key() + "' is not supported" + (it.key() == "oneOf" ? "; use 'anyOf'" : ""),
            at(ptr, it.key()));
      }
    }
    if (!ptr.empty() && s.contains("$id")) {
      throw SchemaError("'$id' is supported only at the root", at(ptr, "$id"));
    }
    if (s.contains("$ref")) {
      refuse_others(s, ptr, "$ref", {"$ref"});
      const Json& r = s["$ref"];
      if (!r.is_string()) throw SchemaError("'$ref' must be a string", at(ptr, "$ref"));
      return reference(r.template get<std::string>(), at(ptr, "$ref"));
    }
    if (s.contains("allOf")) {
      refuse_others(s, ptr, "allOf", {"allOf"});
      const Json& a = s["allOf"];
      const std::string ap = at(ptr, "allOf");
      if (!a.is_array() || a.empty()) throw SchemaError("'allOf' must be a non-empty array", ap);
      if (a.size() > 1) throw SchemaError("'allOf' with more than one schema is not supported", ap);
      return visit(a[0], ap + "/0", depth + 1, hint);
    }
    if (s.contains("anyOf")) {
      refuse_others(s, ptr, "anyOf", {"anyOf"});
      const Json& a = s["anyOf"];
      const std::string ap = at(ptr, "anyOf");
      if (!a.is_array() || a.empty()) throw SchemaError("'anyOf' must be a non-empty array", ap);
      std::vector<std::string> alts;
      std::set<std::string> seen;
      for (size_t i = 0; i < a.size(); ++i) {
        std::string e = visit(a[i], ap + "/" + std::to_string(i), depth + 1,
                              a.size() == 1 ? hint : join_name(hint, "alt" + std::to_string(i)));
        if (seen.insert(e).second) alts.push_back(std::move(e));
      }
      return group(alts);
    }
    if (s.contains("enum") || s.contains("const")) return enumeration(s, ptr);

    std::vector<std::string> types = read_types(s, ptr);
    if (types.empty()) {
      for (const auto& [type, keys] : implied_types()) {
        for (const std::string& k : keys) {
          if (s.contains(k) && std::find(types.begin(), types.end(), type) == types.end()) {
            types.push_back(type);
          }
        }
      }
    }
    if (types.empty()) return prim("value");
    if (std::find(types.begin(), types.end(), "number") != types.end()) {
      types.erase(std::remove(types.begin(), types.end(), "integer"), types.end());
    }
    std::vector<std::string> alts;
    for (const std::string& t : types) {
      if (t == "object") {
        alts.push_back(object(s, ptr, depth, hint));
      } else if (t == "array") {
        alts.push_back(array(s, ptr, depth, hint));
      } else if (t == "string") {
        alts.push_back(string(s, ptr));
      } else if (t == "integer") {
        alts.push_back(integer(s, ptr, hint));
      } else if (t == "number") {
        alts.push_back(number(s, ptr, hint));
      } else {
        alts.push_back(prim(t));
      }
    }
    return group(alts);
  }

  // A rule for a local reference ("#", "#/$defs/name", any JSON pointer into the
  // document), converted later from the queue so that recursive schemas work.
  std::string reference(const std::string& ref, const std::string& ref_ptr) {
    if (ref.empty() || ref[0] != '#') {
      throw SchemaError("only local references ('#/...') are supported", ref_ptr);
    }
    std::string frag;  // the fragment, percent-decoded
    auto hex = [](char c) {
      return c >= '0' && c <= '9'   ? c - '0'
             : c >= 'a' && c <= 'f' ? c - 'a' + 10
             : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                    : -1;
    };
    for (size_t i = 1; i < ref.size(); ++i) {
      if (ref[i] == '%' && i + 2 < ref.size() && hex(ref[i + 1]) >= 0 && hex(ref[i + 2]) >= 0) {
        frag += static_cast<char>(hex(ref[i + 1]) * 16 + hex(ref[i + 2]));
        i += 2;
      } else {
        frag += ref[i];
      }
    }
    std::string name;
    auto known = refs_.find(frag);
    if (known != refs_.end()) {
      name = known->second;
    } else {
      int levels = 0;
      std::string last = "ref";
      const Json* target = resolve(frag, levels, last);
      if (!target) {
        throw SchemaError(
            "'$ref' " + ref + " points nowhere (only '#' and JSON pointers are supported)",
            ref_ptr);
      }
      if (levels > kMaxDepth) {
        throw SchemaError(strfmt("schemas nest deeper than %d levels", kMaxDepth), ref_ptr);
      }
      name = fresh_name(last);
      slot(name);
      refs_[frag] = name;
      todo_.push_back({target, frag, levels, name});
    }
    if (at_head_) head_refs_[current_].push_back({name, ref_ptr});
    return name;
  }

  // The value at a JSON pointer, or null; with the schema levels down to it (the
  // segments, less the keywords that hold schemas by name or index) and the last
  // segment. Objects get a key index, since ordered_json looks keys up one by one.
  const Json* resolve(const std::string& pointer, int& levels, std::string& last) {
    static const std::set<std::string> containers =
        words("$defs definitions properties anyOf allOf prefixItems");
    if (!pointer.empty() && pointer[0] != '/') return nullptr;
    const Json* cur = &root_;
    for (size_t i = 1; i <= pointer.size();) {
      const size_t j = std::min(pointer.find('/', i), pointer.size());
      std::string seg;
      for (size_t k = i; k < j; ++k) {
        if (pointer[k] != '~') {
          seg += pointer[k];
        } else if (k + 1 < j && (pointer[k + 1] == '0' || pointer[k + 1] == '1')) {
          seg += pointer[++k] == '0' ? '~' : '/';
        } else {
          return nullptr;
        }
      }
      i = j + 1;
      levels += containers.count(seg) ? 0 : 1;
      last = seg;
      if (cur->is_object()) {
        auto [index, fresh] = key_index_.try_emplace(cur);
        if (fresh) {
          for (auto it = cur->begin(); it != cur->end(); ++it)
            index->second.emplace(it.key(), &*it);
        }
        auto it = index->second.find(seg);
        if (it == index->second.end()) return nullptr;
        cur = it->second;
      } else if (cur->is_array() && !seg.empty() && seg.size() < 10 &&
                 seg.find_first_not_of("0123456789") == std::string::npos &&
                 (seg == "0" || seg[0] != '0') && std::stoul(seg) < cur->size()) {
        cur = &(*cur)[std::stoul(seg)];
      } else {
        return nullptr;
      }
    }
    return cur;
  }

  // Every rule must match some finite text: a recursive schema whose every value
  // contains another (an array of itself with minItems 1) has no finite document, and
  // generation that entered it could never end. Checked on the parsed grammar: a rule
  // is productive once one of its alternatives holds only characters and productive
  // rules (a worklist, linear in the grammar).
  void check_productive(const std::string& text) {
    Grammar g;
    try {
      g = Grammar::parse(text);
    } catch (const GrammarError& e) {
      throw SchemaError(std::string("the grammar does not parse: ") + e.what(), "");
    }
    const auto& rules = g.rules();
    const auto& elements = g.elements();
    struct Alt {
      uint32_t rule;
      uint32_t pending;  // references to rules not yet known productive
    };
    std::vector<Alt> alts;
    std::vector<std::vector<uint32_t>> users(rules.size());  // rule -> alts referring to it
    std::vector<uint32_t> ready;                             // productive, to propagate
    std::vector<char> productive(rules.size(), 0);
    for (uint32_t r = 0; r < rules.size(); ++r) {
      for (uint32_t start : rules[r]) {
        const uint32_t a = static_cast<uint32_t>(alts.size());
        alts.push_back({r, 0});
        for (uint32_t pos = start; elements[pos].kind != Element::kEnd; ++pos) {
          if (elements[pos].kind != Element::kRule) continue;
          ++alts[a].pending;
          users[elements[pos].value].push_back(a);
        }
        if (alts[a].pending == 0 && !productive[r]) {
          productive[r] = 1;
          ready.push_back(r);
        }
      }
    }
    while (!ready.empty()) {
      const uint32_t r = ready.back();
      ready.pop_back();
      for (uint32_t a : users[r]) {
        if (--alts[a].pending == 0 && !productive[alts[a].rule]) {
          productive[alts[a].rule] = 1;
          ready.push_back(alts[a].rule);
        }
      }
    }
    // Blame a definition before the root, which may only refer to it.
    std::map<std::string, std::string> pointer_of;  // definition rule -> its pointer
    for (const auto& [ptr, name] : refs_) pointer_of[name] = ptr;
    for (int pass = 0; pass < 2; ++pass) {
      for (uint32_t r = 0; r < rules.size(); ++r) {
        auto it = pointer_of.find(g.rule_name(r));
        if (productive[r] || it == pointer_of.end() || (pass == 0 && it->second.empty())) continue;
        throw SchemaError("the schema admits no finite value (it always contains itself)",
                          it->second);
      }
    }
    for (uint32_t r = 0; r < rules.size(); ++r) {
      if (!productive[r]) {
        throw SchemaError("the schema admits no finite value (rule " + g.rule_name(r) + ")", "");
      }
    }
  }

  // A reference cycle with nothing matched in between would be left recursion (a
  // schema that is itself, or one of its own alternatives).
  void check_ref_cycles() {
    std::map<std::string, int> state;  // 1 on the path, 2 done
    std::vector<std::pair<std::string, size_t>> path;
    for (const auto& start : head_refs_) {
      if (state[start.first]) continue;
      path.push_back({start.first, 0});
      state[start.first] = 1;
      while (!path.empty()) {
        auto& [rule, k] = path.back();
        const std::vector<Edge>& edges = head_refs_[rule];
        if (k == edges.size()) {
          state[rule] = 2;
          path.pop_back();
          continue;
        }
        const Edge& e = edges[k++];
        if (state[e.to] == 1) {
          throw SchemaError("'$ref' cycle with no object or array in between", e.pointer);
        }
        if (state[e.to] == 0) {
          state[e.to] = 1;
          path.push_back({e.to, 0});
        }
      }
    }
  }

  std::string enumeration(const Json& s, const std::string& ptr) {
    const char* keyword = s.contains("const") ? "const" : "enum";
    refuse_others(s, ptr, keyword, {"enum", "const", "type"});
    std::vector<std::pair<const Json*, std::string>> values;  // value, pointer
    auto checked = [&](const Json& v, const std::string& p) -> const Json& {
      if (value_depth(v, kMaxDepth) > kMaxDepth) {
        throw SchemaError(strfmt("values nest deeper than %d levels", kMaxDepth), p);
      }
      return v;
    };
    if (s.contains("enum")) {
      const Json& e = s["enum"];
      if (!e.is_array() || e.empty()) {
        throw SchemaError("'enum' must be a non-empty array", at(ptr, "enum"));
      }
      for (size_t i = 0; i < e.size(); ++i) {
        const std::string p = at(ptr, "enum") + "/" + std::to_string(i);
        values.push_back({&checked(e[i], p), p});
      }
    }
    if (s.contains("const")) {
      const Json& c = checked(s["const"], at(ptr, "const"));
      if (s.contains("enum")) {
        values.erase(std::remove_if(values.begin(), values.end(),
                                    [&](const auto& v) { return !(*v.first == c); }),
                     values.end());
      } else {
        values.push_back({&c, at(ptr, "const")});
      }
    }
    const std::vector<std::string> types = read_types(s, ptr);
    if (!types.empty()) {
      values.erase(std::remove_if(values.begin(), values.end(),
                                  [&](const auto& v) {
                                    for (const std::string& t : types) {
                                      if (has_type(*v.first, t)) return false;
                                    }
                                    return true;
                                  }),
                   values.end());
    }
    if (values.empty()) {
      throw SchemaError(strfmt("no value satisfies both '%s' and its sibling keywords", keyword),
                        ptr);
    }
    std::vector<std::string> alts;
    std::set<std::string> seen;
    size_t size = 0;
    for (const auto& [v, p] : values) {
      std::string text;
      try {
        text = v->dump(-1, ' ', false, Json::error_handler_t::strict);
      } catch (const std::exception&) {
        throw SchemaError("invalid UTF-8 in a string", p);
      }
      std::string lit = gbnf_literal(text, p);
      size += lit.size() + 3;
      if (size > kMaxGrammarBytes) {
        throw SchemaError(strfmt("the grammar grows past %zu bytes", kMaxGrammarBytes), p);
      }
      if (seen.insert(lit).second) alts.push_back(std::move(lit));
    }
    prim("space");
    return group(alts) + " space";
  }

  // Objects emit only the declared properties (valid whatever additionalProperties
  // says), in the schema's order; required ones always, optional ones or not. With no
  // properties declared the object is a map from any key to additionalProperties.
  std::string object(const Json& s, const std::string& ptr, int depth, const std::string& hint) {
    FlagScope inside(at_head_, false);
    const Json* props = nullptr;
    if (auto it = s.find("properties"); it != s.end()) {
      if (!it->is_object())
        throw SchemaError("'properties' must be an object", at(ptr, "properties"));
      props = &*it;
    }
    std::vector<std::string> required;  // in order, without repeats
    std::set<std::string> required_set;
    if (auto it = s.find("required"); it != s.end()) {
      const std::string rp = at(ptr, "required");
      if (!it->is_array()) throw SchemaError("'required' must be an array of strings", rp);
      for (size_t i = 0; i < it->size(); ++i) {
        const Json& k = (*it)[i];
        if (!k.is_string()) {
          throw SchemaError("'required' must be an array of strings", rp + "/" + std::to_string(i));
        }
        const std::string key = k.template get<std::string>();
        if (required_set.insert(key).second) required.push_back(key);
      }
    }
    const Json* extra = nullptr;  // the additionalProperties schema; null: any value
    bool extra_allowed = true;
    const std::string xp = at(ptr, "additionalProperties");
    if (auto it = s.find("additionalProperties"); it != s.end()) {
      if (it->is_boolean()) {
        extra_allowed = it->template get<bool>();
      } else if (it->is_object()) {
        extra = &*it;
      } else {
        throw SchemaError("'additionalProperties' must be a schema", xp);
      }
    }
    const int64_t min_props = read_count(s, "minProperties", ptr, INT64_MAX);
    const int64_t max_props = read_count(s, "maxProperties", ptr, INT64_MAX);
    prim("space");

    struct Prop {
      std::string key;
      const Json* schema;  // null: any value
      std::string ptr;
      bool required;
    };
    std::vector<Prop> items;
    std::set<std::string> declared;  // ordered_json looks keys up one by one
    if (props) {
      for (auto it = props->begin(); it != props->end(); ++it) {
        const std::string pp = at(at(ptr, "properties"), it.key());
        const bool req = required_set.count(it.key()) > 0;
        if (it->is_boolean() && !it->template get<bool>()) {
          if (req)
            throw SchemaError("required property '" + it.key() + "' has the schema false", pp);
          continue;
        }
        declared.insert(it.key());
        items.push_back({it.key(), &*it, pp, req});
      }
    }
    for (size_t i = 0; i < required.size(); ++i) {
      if (declared.count(required[i])) continue;
      if (!extra_allowed) {
        throw SchemaError("required property '" + required[i] +
                              "' is not declared and additionalProperties is false",
                          at(ptr, "required") + "/" + std::to_string(i));
      }
      items.push_back({required[i], extra, extra ? xp : ptr, true});
    }

    if (items.empty() && (!props || props->empty()) && extra_allowed) {
      // A map: any keys, values under additionalProperties. Repeated keys can only
      // lower the count of properties, so maxProperties holds, and minProperties 1.
      if (min_props > 1) {
        throw SchemaError("'minProperties' above 1 is not supported without 'properties'",
                          at(ptr, "minProperties"));
      }
      if (max_props > kMaxCount) {
        throw SchemaError(strfmt("'maxProperties' above %lld is not supported",
                                 static_cast<long long>(kMaxCount)),
                          at(ptr, "maxProperties"));
      }
      if (max_props == 0) return add_rule(hint, "\"{\" space \"}\" space");
      if (!extra && min_props < 1 && max_props < 0) return prim("object");
      const std::string value =
          extra ? visit(*extra, xp, depth + 1, join_name(hint, "value")) : prim("value");
      const std::string kv = prim("string") + " \":\" space " + value;
      std::string members = kv;
      if (max_props != 1) {
        if (max_props > 0) charge(kRepeatCost * static_cast<size_t>(max_props), ptr);
        members +=
            " (\",\" space " + kv + ")" + repeat_suffix(0, max_props < 0 ? -1 : max_props - 1);
      }
      if (min_props < 1) members = "(" + members + ")?";
      return add_rule(hint, "\"{\" space " + members + " \"}\" space");
    }

    const int64_t n_required =
        std::count_if(items.begin(), items.end(), [](const Prop& p) { return p.required; });
    if (min_props > n_required) {
      throw SchemaError("'minProperties' above the number of required properties is not supported",
                        at(ptr, "minProperties"));
    }
    if (max_props >= 0 && max_props < static_cast<int64_t>(items.size())) {
      throw SchemaError("'maxProperties' below the number of properties is not supported",
                        at(ptr, "maxProperties"));
    }
    if (items.empty()) return add_rule(hint, "\"{\" space \"}\" space");

    std::vector<std::string> kvs;
    for (const Prop& p : items) {
      std::string key_text;
      try {
        key_text = Json(p.key).dump(-1, ' ', false, Json::error_handler_t::strict);
      } catch (const std::exception&) {
        throw SchemaError("invalid UTF-8 in a property name", p.ptr);
      }
      const std::string value =
          p.schema ? visit(*p.schema, p.ptr, depth + 1, join_name(hint, p.key)) : prim("value");
      kvs.push_back(gbnf_literal(key_text, p.ptr) + " space \":\" space " + value);
    }
    const size_t n = items.size();
    if (n_required == static_cast<int64_t>(n)) {
      std::string body = "\"{\" space " + kvs[0];
      for (size_t k = 1; k < n; ++k) body += " \",\" space " + kvs[k];
      return add_rule(hint, body + " \"}\" space");
    }

    // With optional properties a comma goes before every property but the first one
    // present. after(k): properties k.. once one is out; first(k): properties k.. while
    // none is yet (up to the first required one).
    for (size_t k = 0; k < n; ++k) {
      kvs[k] = add_rule(join_name(join_name(hint, items[k].key), "kv"), kvs[k]);
    }
    std::vector<std::string> after(n + 1);
    for (size_t k = n; k-- > 1;) {
      std::string body =
          items[k].required ? "\",\" space " + kvs[k] : "(\",\" space " + kvs[k] + ")?";
      if (!after[k + 1].empty()) body += " " + after[k + 1];
      after[k] = add_rule(join_name(hint, "after" + std::to_string(k)), body);
    }
    size_t first_required = 0;
    while (first_required < n && !items[first_required].required) ++first_required;
    std::string first;  // first(k) for k going down
    for (size_t k = std::min(first_required, n - 1) + 1; k-- > 0;) {
      std::string body = kvs[k] + (after[k + 1].empty() ? "" : " " + after[k + 1]);
      if (k < first_required && !first.empty()) body += " | " + first;
      first = add_rule(join_name(hint, "first" + std::to_string(k)), body);
    }
    const std::string members = first_required < n ? first : first + "?";
    return add_rule(hint, "\"{\" space " + members + " \"}\" space");
  }

  // Arrays: prefixItems (or draft 2019's array-valued items) position by position, then
  // items for the rest, with minItems / maxItems as bounded repetition.
  std::string array(const Json& s, const std::string& ptr, int depth, const std::string& hint) {
    FlagScope inside(at_head_, false);
    const int64_t min_items = std::max<int64_t>(read_count(s, "minItems", ptr, kMaxCount), 0);
    int64_t max_items = read_count(s, "maxItems", ptr, kMaxCount);  // -1: unbounded
    if (max_items >= 0 && min_items > max_items) {
      throw SchemaError("'minItems' is above 'maxItems'", at(ptr, "minItems"));
    }
    if (auto it = s.find("uniqueItems"); it != s.end()) {
      if (!it->is_boolean())
        throw SchemaError("'uniqueItems' must be a boolean", at(ptr, "uniqueItems"));
      if (it->template get<bool>() && (max_items < 0 || max_items > 1)) {
        throw SchemaError("'uniqueItems' is not supported", at(ptr, "uniqueItems"));
      }
    }
    std::vector<std::pair<const Json*, std::string>> prefix;  // schema, pointer
    const Json* tail = nullptr;                               // null: any value
    std::string tail_ptr;
    bool tail_allowed = true;
    auto set_tail = [&](const Json& t, const std::string& p) {
      if (t.is_boolean()) {
        tail_allowed = t.template get<bool>();
      } else {
        tail = &t;
        tail_ptr = p;
      }
    };
    auto read_prefix = [&](const Json& a, const std::string& p) {
      if (!a.is_array()) throw SchemaError("'prefixItems' must be an array of schemas", p);
      for (size_t i = 0; i < a.size(); ++i) prefix.push_back({&a[i], p + "/" + std::to_string(i)});
    };
    auto items = s.find("items");
    if (auto pi = s.find("prefixItems"); pi != s.end()) {
      read_prefix(*pi, at(ptr, "prefixItems"));
      if (s.contains("additionalItems")) {
        throw SchemaError("'additionalItems' with 'prefixItems' is not supported",
                          at(ptr, "additionalItems"));
      }
      if (items != s.end()) {
        if (items->is_array()) {
          throw SchemaError("'items' must be a schema beside 'prefixItems'", at(ptr, "items"));
        }
        set_tail(*items, at(ptr, "items"));
      }
    } else if (items != s.end() && items->is_array()) {
      read_prefix(*items, at(ptr, "items"));
      if (auto ai = s.find("additionalItems"); ai != s.end()) {
        set_tail(*ai, at(ptr, "additionalItems"));
      }
    } else if (items != s.end()) {
      set_tail(*items, at(ptr, "items"));
    }
    // A prefix schema false ends the array before it.
    for (size_t i = 0; i < prefix.size(); ++i) {
      const Json& p = *prefix[i].first;
      if (p.is_boolean() && !p.template get<bool>()) {
        prefix.resize(i);
        tail_allowed = false;
        break;
      }
    }
    if (!tail_allowed) {
      const int64_t most = static_cast<int64_t>(prefix.size());
      if (min_items > most) {
        throw SchemaError("'minItems' is above the number of items the schema allows",
                          at(ptr, "minItems"));
      }
      max_items = max_items < 0 ? most : std::min(max_items, most);
    }
    prim("space");
    if (max_items == 0) return add_rule(hint, "\"[\" space \"]\" space");
    if (max_items > 0) charge(kRepeatCost * static_cast<size_t>(max_items), ptr);

    const size_t k =
        max_items < 0 ? prefix.size() : std::min(prefix.size(), static_cast<size_t>(max_items));
    std::string tail_expr;  // the items after the prefix, each with its comma
    if (tail_allowed && (max_items < 0 || max_items > static_cast<int64_t>(k))) {
      const std::string t =
          tail ? visit(*tail, tail_ptr, depth + 1, join_name(hint, "item")) : prim("value");
      if (k == 0) {
        // No prefix: the first item has no comma.
        std::string seq = t;
        const int64_t hi = max_items < 0 ? -1 : max_items - 1;
        if (hi != 0)
          seq +=
              " (\",\" space " + t + ")" + repeat_suffix(std::max<int64_t>(min_items - 1, 0), hi);
        if (min_items == 0) seq = "(" + seq + ")?";
        return add_rule(hint, "\"[\" space " + seq + " \"]\" space");
      }
      const int64_t lo = std::max<int64_t>(min_items - static_cast<int64_t>(k), 0);
      const int64_t hi = max_items < 0 ? -1 : max_items - static_cast<int64_t>(k);
      tail_expr = "(\",\" space " + t + ")" + repeat_suffix(lo, hi);
    }
    std::string rest = tail_expr;
    for (size_t i = k; i-- > 0;) {
      const std::string item = visit(*prefix[i].first, prefix[i].second, depth + 1,
                                     join_name(hint, "item" + std::to_string(i)));
      std::string seq = (i ? "\",\" space " : "") + item + (rest.empty() ? "" : " " + rest);
      if (static_cast<int64_t>(i) >= min_items) {
        rest = add_rule(join_name(hint, "from" + std::to_string(i)), seq) + "?";
      } else {
        rest = seq;
      }
    }
    return add_rule(hint, "\"[\" space " + rest + " \"]\" space");
  }

  std::string string(const Json& s, const std::string& ptr) {
    const int64_t min_len = std::max<int64_t>(read_count(s, "minLength", ptr, kMaxCount), 0);
    const int64_t max_len = read_count(s, "maxLength", ptr, kMaxCount);
    if (max_len >= 0 && min_len > max_len) {
      throw SchemaError("'minLength' is above 'maxLength'", at(ptr, "minLength"));
    }
    prim("space");
    if (auto it = s.find("format"); it != s.end()) {
      const std::string fp = at(ptr, "format");
      if (!it->is_string()) throw SchemaError("'format' must be a string", fp);
      const std::string name = it->template get<std::string>();
      for (const Format& f : kFormats) {
        if (name != f.name) continue;
        if (f.min_len < min_len || (max_len >= 0 && f.max_len > max_len)) {
          throw SchemaError(
              "'minLength' or 'maxLength' together with 'format' '" + name + "' is not supported",
              ptr);
        }
        return prim(name + "-string");
      }
      throw SchemaError("'format' '" + name + "' is not supported", fp);
    }
    if (min_len == 0 && max_len < 0) return prim("string");
    if (max_len == 0) return add_rule("string-empty", "\"\\\"\\\"\" space");
    prim("char");
    charge(kRepeatCost * static_cast<size_t>(max_len < 0 ? min_len : max_len), ptr);
    const std::string name = "string-" + std::to_string(min_len) + "to" +
                             (max_len < 0 ? std::string("any") : std::to_string(max_len));
    return add_rule(name, "\"\\\"\" char" + repeat_suffix(min_len, max_len) + " \"\\\"\" space");
  }

  // Integers in [lo, hi], each bound inclusive after rounding toward the inside; an
  // open side stops at 16 digits (18 when the other bound is already past 16).
  std::string integer(const Json& s, const std::string& ptr, const std::string& hint) {
    const Bound lower = read_bound(s, ptr, true, true), upper = read_bound(s, ptr, false, true);
    if (!lower.set && !upper.set) return prim("integer");
    int64_t lo = lower.strict ? lower.v + 1 : lower.v;
    int64_t hi = upper.strict ? upper.v - 1 : upper.v;
    if (!upper.set) hi = lo > kIntCap ? kBoundCap : kIntCap;
    if (!lower.set) lo = hi < -kIntCap ? -kBoundCap : -kIntCap;
    lo = std::max(lo, -kBoundCap);
    hi = std::min(hi, kBoundCap);
    if (lo > hi) {
      throw SchemaError("no integer of at most 18 digits lies within the bounds", ptr);
    }
    std::vector<std::string> alts;
    if (lo < 0) alts.push_back("\"-\" " + integer_range(std::max<int64_t>(-hi, 1), -lo));
    if (hi >= 0) alts.push_back(integer_range(std::max<int64_t>(lo, 0), hi));
    prim("space");
    return add_rule(hint, group(alts) + " space");
  }

  // Numbers between whole-number bounds: no exponent, the integer part ranged and
  // the fraction required zero or non-zero where a bound is reached.
  std::string number(const Json& s, const std::string& ptr, const std::string& hint) {
    Bound lower = read_bound(s, ptr, true, false), upper = read_bound(s, ptr, false, false);
    if (!lower.set && !upper.set) return prim("number");
    if (lower.set && lower.v < -kBoundCap) lower = {true, -kBoundCap, false};
    if (upper.set && upper.v > kBoundCap) upper = {true, kBoundCap, false};
    if ((lower.set && lower.v > kBoundCap) || (upper.set && upper.v < -kBoundCap)) {
      throw SchemaError("no number of at most 18 integer digits lies within the bounds", ptr);
    }
    std::vector<std::string> alts;
    // x < 0 as -m: m above -maximum (or above 0), below -minimum.
    if (!lower.set || lower.v < 0) {
      const bool hi_neg = upper.set && upper.v < 0;
      const int64_t m_lo = hi_neg ? -upper.v : 0;
      const bool m_lo_strict = hi_neg ? upper.strict : true;
      const int64_t cap = m_lo > kIntCap ? kBoundCap : kIntCap;
      magnitude_pieces(m_lo, m_lo_strict, lower.set, lower.set ? -lower.v : 0, lower.strict, cap,
                       "\"-\" ", alts);
    }
    // x >= 0.
    if (!upper.set || upper.v >= 0) {
      const bool lo_pos = lower.set && lower.v >= 0;
      const int64_t x_lo = lo_pos ? lower.v : 0;
      const int64_t cap = x_lo > kIntCap ? kBoundCap : kIntCap;
      magnitude_pieces(x_lo, lo_pos && lower.strict, upper.set, upper.set ? upper.v : 0,
                       upper.strict, cap, "", alts);
    }
    if (alts.empty()) throw SchemaError("no number lies within the bounds", ptr);
    prim("space");
    return add_rule(hint, group(alts) + " space");
  }
};

}  // namespace

std::string json_schema_to_gbnf(const nlohmann::json& schema) {
  return Converter<nlohmann::json>(schema).run();
}

std::string json_schema_to_gbnf(const nlohmann::ordered_json& schema) {
  return Converter<nlohmann::ordered_json>(schema).run();
}

std::string json_object_gbnf() { return json_schema_to_gbnf(nlohmann::json{{"type", "object"}}); }

}  // namespace kivi::grammar
