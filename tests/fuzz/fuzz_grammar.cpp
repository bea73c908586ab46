// Grammars and schemas from untrusted requests. Byte 0 picks the input: even, GBNF text
// (the rest up to the first NUL; what follows it is fed to the matcher when the grammar
// parses); odd, a JSON schema, whose converted grammar must then parse (a converter that
// writes GBNF the parser refuses is a failure). Only GrammarError and SchemaError (and
// the matcher's kivi::Error for an ambiguous grammar) may come out.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "core/error.h"
#include "grammar/gbnf.h"
#include "grammar/json_schema.h"
#include "grammar/matcher.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string in(reinterpret_cast<const char*>(data) + 1, size - 1);
  using kivi::grammar::Grammar;
  if (data[0] % 2 == 0) {
    const size_t nul = in.find('\0');
    const std::string text = in.substr(0, nul);
    const std::string feed = nul == std::string::npos ? "" : in.substr(nul + 1);
    std::shared_ptr<const Grammar> g;
    try {
      g = std::make_shared<const Grammar>(Grammar::parse(text));
    } catch (const kivi::grammar::GrammarError&) {
      return 0;
    }
    try {
      kivi::grammar::Matcher m(g);
      for (char c : feed) {
        if (!m.accept(std::string(1, c))) break;
      }
      (void)m.accepting();
      (void)m.can_continue();
    } catch (const kivi::Error&) {
    }
    return 0;
  }
  const nlohmann::ordered_json j = nlohmann::ordered_json::parse(in, nullptr, false);
  if (j.is_discarded()) return 0;
  std::string gbnf;
  try {
    gbnf = kivi::grammar::json_schema_to_gbnf(j);
  } catch (const kivi::grammar::SchemaError&) {
    return 0;
  }
  auto g = std::make_shared<const Grammar>(Grammar::parse(gbnf));  // must not throw
  kivi::grammar::Matcher m(g);
  (void)m.accept("{\"a\": [1, \"x\", null, true]}");
  return 0;
}
