// JSON Schema to GBNF: documents valid under a schema are whole sentences of its
// grammar, invalid ones are refused, every random sentence of the grammar validates
// (checked by a small validator here), and schemas the converter cannot honour throw
// SchemaError with the pointer of the place.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "grammar/gbnf.h"
#include "grammar/json_schema.h"
#include "grammar/matcher.h"

namespace kivi::grammar {
namespace {

using ojson = nlohmann::ordered_json;

std::shared_ptr<const Grammar> compile(const std::string& gbnf) {
  return std::make_shared<const Grammar>(Grammar::parse(gbnf));
}

std::shared_ptr<const Grammar> schema_grammar(const std::string& schema) {
  return compile(json_schema_to_gbnf(ojson::parse(schema)));
}

bool whole(const std::shared_ptr<const Grammar>& g, const std::string& doc) {
  Matcher m(g);
  return m.accept(doc) && m.accepting();
}

// Checks that each good document is a sentence and no bad one is.
void expect_sentences(const std::string& schema, const std::vector<std::string>& good,
                      const std::vector<std::string>& bad) {
  SCOPED_TRACE(schema);
  std::shared_ptr<const Grammar> g;
  ASSERT_NO_THROW(g = schema_grammar(schema)) << json_schema_to_gbnf(ojson::parse(schema));
  for (const std::string& d : good) EXPECT_TRUE(whole(g, d)) << "should accept: " << d;
  for (const std::string& d : bad) EXPECT_FALSE(whole(g, d)) << "should reject: " << d;
}

TEST(JsonSchema, ObjectWithRequiredAndOptionalProperties) {
  const std::string schema = R"({"type": "object", "properties": {
      "name": {"type": "string"}, "age": {"type": "integer"}, "ok": {"type": "boolean"}},
      "required": ["age"]})";
  expect_sentences(schema,
                   {R"({"age":3})", R"({"name":"x","age":-2})", R"({"age":0,"ok":true})",
                    R"({"name":"","age":12,"ok":false})", R"({ "age" : 7 } )",
                    "{\n  \"name\": \"Bo\",\n  \"age\": 41,\n\t\"ok\": true\n}"},
                   {R"({})", R"({"name":"x"})", R"({"age":"3"})", R"({"age":3,"extra":1})",
                    R"({"age":3,})", R"({,"age":3})", R"({"age":03})", R"({"age":3.5})",
                    R"({"age":3}{)", R"({"age":3)", R"([{"age":3}])", " {\"age\":3}"});
  // Properties come in the schema's order.
  EXPECT_FALSE(whole(schema_grammar(schema), R"({"age":3,"name":"x"})"));
}

TEST(JsonSchema, OptionalPropertiesTakeCommasOnlyBetween) {
  expect_sentences(
      R"({"type": "object", "properties": {"a": {"type": "integer"},
                       "b": {"type": "integer"}, "c": {"type": "integer"}}})",
      {"{}", R"({"a":1})", R"({"b":2})", R"({"c":3})", R"({"a":1,"c":3})", R"({"b":2,"c":3})",
       R"({"a":1,"b":2,"c":3})", "{ }"},
      {R"({,"b":2})", R"({"a":1,})", R"({"a":1,,"c":3})", R"({"a":1 "b":2})", R"({"a":1,"a":1})"});
  // A required property after optional ones, and one before them.
  expect_sentences(R"({"properties": {"a": {"type": "null"}, "b": {"type": "null"},
                       "c": {"type": "null"}, "d": {"type": "null"}}, "required": ["c"]})",
                   {R"({"c":null})", R"({"a":null,"c":null})", R"({"b":null,"c":null,"d":null})",
                    R"({"a":null,"b":null,"c":null,"d":null})"},
                   {R"({"a":null})", R"({"a":null,"d":null})", "{}"});
}

TEST(JsonSchema, NestedObjectsAndAdditionalProperties) {
  expect_sentences(
      R"({"type": "object", "additionalProperties": false, "properties": {
          "user": {"type": "object", "properties": {"id": {"type": "integer", "minimum": 1},
                   "tags": {"type": "array", "items": {"type": "string"}}},
                   "required": ["id", "tags"], "additionalProperties": true}},
          "required": ["user"]})",
      {R"({"user":{"id":1,"tags":[]}})", R"({"user":{"id":99,"tags":["a","b"]}})",
       "{\n  \"user\": {\n    \"id\": 5,\n    \"tags\": [\n      \"x\"\n    ]\n  }\n}"},
      {R"({"user":{"id":0,"tags":[]}})", R"({"user":{"tags":[]}})", R"({"user":{"id":1}})",
       R"({"user":{"id":1,"tags":[1]}})", R"({"user":{"id":1,"tags":[],"more":1}})"});
  // No properties: a map from any key to additionalProperties, or any object.
  expect_sentences(R"({"type": "object", "additionalProperties": {"type": "integer"}})",
                   {"{}", R"({"a":1})", R"({"a":1,"b":-2,"":0})"},
                   {R"({"a":"1"})", R"({"a":1,})", "[]"});
  expect_sentences(R"({"type": "object", "maxProperties": 2, "minProperties": 1})",
                   {R"({"a":1})", R"({"a":[1,{"b":null}],"b":"x"})"},
                   {"{}", R"({"a":1,"b":2,"c":3})"});
  expect_sentences(R"({"type": "object", "additionalProperties": false})", {"{}"}, {R"({"a":1})"});
  // Required but undeclared properties take additionalProperties' schema.
  expect_sentences(R"({"type": "object", "required": ["x"],
                       "additionalProperties": {"type": "boolean"}})",
                   {R"({"x":true})"}, {"{}", R"({"x":1})"});
}

TEST(JsonSchema, ArraysWithBoundsAndPrefixItems) {
  expect_sentences(R"({"type": "array", "items": {"type": "integer"}, "minItems": 1,
                       "maxItems": 3})",
                   {"[1]", "[1,2,3]", "[ 1 , 2 ]", "[\n  1,\n  2\n]"},
                   {"[]", "[1,2,3,4]", "[1,]", "[,1]", "[\"a\"]", "[1 2]", "[01]"});
  expect_sentences(R"({"type": "array", "maxItems": 0})", {"[]", "[ ]"}, {"[1]"});
  expect_sentences(R"({"type": "array"})", {"[]", R"([1,"a",[null],{"b":true}])"}, {"[1,]"});
  expect_sentences(R"({"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}],
                       "items": false, "minItems": 1})",
                   {R"(["a"])", R"(["a",1])"}, {"[]", R"([1])", R"(["a",1,2])", R"(["a","b"])"});
  expect_sentences(R"({"type": "array", "prefixItems": [{"type": "string"}],
                       "items": {"type": "boolean"}, "minItems": 3})",
                   {R"(["a",true,false])", R"(["a",true,false,true])"},
                   {R"(["a",true])", R"([true,true,true])"});
  // Draft 2019's tuple form.
  expect_sentences(R"({"type": "array", "items": [{"const": 1}, {"const": 2}],
                       "additionalItems": false})",
                   {"[]", "[1]", "[1,2]"}, {"[2]", "[1,2,3]"});
}

TEST(JsonSchema, EnumAndConstAreLiterals) {
  expect_sentences(R"({"enum": ["red", "gr\"een", "back\\slash", "tab\t", "é😀", 1, 2.5, null,
                                 true, {"a": [1, 2]}, [], "\u0001"]})",
                   {R"("red")", R"("gr\"een")", R"("back\\slash")", R"("tab\t")", "\"é😀\"", "1",
                    "2.5", "null", "true", R"({"a":[1,2]})", "[]", R"("\u0001")", "\"red\" "},
                   {R"("blue")", R"("Red")", "2", "false", R"({"a": [1, 2]})", R"("red)"});
  expect_sentences(R"({"const": "only"})", {R"("only")"}, {R"("other")"});
  // type filters the values; const must be among enum.
  expect_sentences(R"({"type": "string", "enum": ["a", 1, "b"]})", {R"("a")", R"("b")"}, {"1"});
  expect_sentences(R"({"type": "integer", "enum": [1.0, 1.5, "x"]})", {"1.0"}, {"1.5", "\"x\""});
  expect_sentences(R"({"enum": ["a", "b"], "const": "b"})", {R"("b")"}, {R"("a")"});
}

TEST(JsonSchema, AnyOfTypeUnionsAndAllOf) {
  expect_sentences(R"({"anyOf": [{"type": "string", "maxLength": 2}, {"type": "null"}]})",
                   {R"("ab")", "null", R"("")"}, {R"("abc")", "0", "nul"});
  expect_sentences(R"({"type": ["integer", "boolean"], "minimum": 5})", {"5", "true", "123"},
                   {"4", "-5", "null", "5.5"});
  expect_sentences(R"({"type": ["number", "integer"]})", {"1", "1.5", "-2e10"}, {"\"1\""});
  expect_sentences(R"({"allOf": [{"type": "boolean"}], "description": "x"})", {"true"}, {"1"});
  expect_sentences("true", {"1", R"({"a":[]})", "\"s\""}, {"", "[1,]"});
  expect_sentences("{}", {"null"}, {"nul"});
}

TEST(JsonSchema, RecursiveDefinitions) {
  const std::string tree = R"({"$ref": "#/$defs/node", "$defs": {"node": {"type": "object",
      "properties": {"value": {"type": "integer"}, "children": {"type": "array",
      "items": {"$ref": "#/$defs/node"}}}, "required": ["value"],
      "additionalProperties": false}}})";
  expect_sentences(tree,
                   {R"({"value":1})", R"({"value":1,"children":[]})",
                    R"({"value":1,"children":[{"value":2},{"value":3,"children":[{"value":4}]}]})"},
                   {R"({"value":1,"children":[{}]})", R"({"children":[]})",
                    R"({"value":1,"children":[{"value":"x"}]})"});
  // "#" is the root; definitions and escaped pointers work too.
  expect_sentences(R"({"type": "object", "properties": {"next": {"$ref": "#"}}})",
                   {"{}", R"({"next":{"next":{}}})"}, {R"({"next":1})"});
  expect_sentences(R"({"definitions": {"a/b": {"type": "boolean"}}, "type": "array",
                       "items": {"$ref": "#/definitions/a~1b"}})",
                   {"[true,false]"}, {"[1]"});
  // A list: null or a cell whose tail is a list.
  expect_sentences(
      R"({"$defs": {"list": {"anyOf": [{"type": "null"}, {"type": "object",
                       "properties": {"head": {"type": "integer"}, "tail": {"$ref": "#/$defs/list"}},
                       "required": ["head", "tail"]}]}}, "$ref": "#/$defs/list"})",
      {"null", R"({"head":1,"tail":null})", R"({"head":1,"tail":{"head":2,"tail":null}})"},
      {R"({"head":1})"});
}

TEST(JsonSchema, StringLengthCountsCharactersAndEscapes) {
  expect_sentences(R"({"type": "string", "minLength": 1, "maxLength": 2})",
                   {R"("a")", R"("ab")", R"("\n")", R"("\u00e9x")", "\"é😀\"", R"("\\\"")",
                    R"("\ud83d\ude00")", R"("\/")"},
                   {R"("")", R"("abc")", R"("\x")", "\"a\nb\"", R"("\ud83d")", R"("\ude00")",
                    R"("\u12")", "\"\x01\"", R"("a)"});
  expect_sentences(R"({"type": "string", "maxLength": 0})", {R"("")"}, {R"("a")"});
  expect_sentences(R"({"type": "string", "minLength": 3})", {R"("abc")", R"("abcdefgh")"},
                   {R"("ab")"});
}

TEST(JsonSchema, StringFormats) {
  expect_sentences(R"({"type": "string", "format": "date"})",
                   {R"("2024-02-29")", R"("2000-02-29")", R"("2023-02-28")", R"("1999-12-31")",
                    R"("2023-04-30")", R"("1600-02-29")"},
                   {R"("2023-02-29")", R"("1900-02-29")", R"("2024-04-31")", R"("2024-13-01")",
                    R"("2024-00-10")", R"("2024-01-00")", R"("0999-01-01")", R"("2024-1-01")",
                    R"("2024-01-32")"});
  expect_sentences(
      R"({"type": "string", "format": "time"})",
      {R"("23:59:59Z")", R"("00:00:00.123+05:30")", R"("12:30:00-08:00")"},
      {R"("24:00:00Z")", R"("12:60:00Z")", R"("12:00:00")", R"("12:00Z")", R"("12:00:00+24:00")"});
  expect_sentences(R"({"type": "string", "format": "date-time"})",
                   {R"("2024-02-29T13:45:00Z")", R"("1999-01-01T00:00:00.5+01:00")"},
                   {R"("2024-02-29 13:45:00Z")", R"("2024-02-30T13:45:00Z")"});
  expect_sentences(
      R"({"type": "string", "format": "uuid"})",
      {R"("123e4567-e89b-12d3-a456-426614174000")", R"("123E4567-E89B-12D3-A456-426614174000")"},
      {R"("123e4567e89b12d3a456426614174000")", R"("123e4567-e89b-12d3-a456-42661417400")",
       R"("g23e4567-e89b-12d3-a456-426614174000")"});
  expect_sentences(R"({"type": "string", "format": "ipv4"})",
                   {R"("0.0.0.0")", R"("255.255.255.255")", R"("192.168.1.10")"},
                   {R"("256.1.1.1")", R"("01.1.1.1")", R"("1.1.1")", R"("1.1.1.1.1")"});
}

TEST(JsonSchema, NumbersHaveJsonSyntax) {
  expect_sentences(R"({"type": "number"})",
                   {"0", "-0", "12", "-3.25", "1e5", "1.5E-7", "2e+10", "0.0001"},
                   {"01", "1.", ".5", "+1", "1e", "--1", "1.5e123", "NaN", "0x10", "1 2"});
  expect_sentences(R"({"type": "integer"})", {"0", "-7", "1234567890123456"},
                   {"1.0", "12345678901234567", "-", "00"});
}

// Every integer in a window around the bounds is a sentence exactly when it is in range.
TEST(JsonSchema, IntegerRangesMatchExactly) {
  const std::vector<std::pair<long long, long long>> ranges = {
      {0, 0},       {0, 9},      {0, 10},    {1, 9},       {3, 7},     {5, 250},
      {10, 99},     {10, 100},   {12, 4567}, {99, 1000},   {100, 999}, {101, 1099},
      {-5, 5},      {-250, -17}, {-1, 0},    {-1000, 999}, {7, 7},     {-3, -3},
      {199, 20001}, {0, 1},      {9, 11},    {-120, 3}};
  for (const auto& [lo, hi] : ranges) {
    const std::string schema = "{\"type\": \"integer\", \"minimum\": " + std::to_string(lo) +
                               ", \"maximum\": " + std::to_string(hi) + "}";
    SCOPED_TRACE(schema);
    const auto g = schema_grammar(schema);
    const long long span = std::max<long long>(hi - lo, 30);
    for (long long v = lo - span - 3; v <= hi + span + 3; ++v) {
      EXPECT_EQ(whole(g, std::to_string(v)), v >= lo && v <= hi) << v;
    }
    EXPECT_FALSE(whole(g, "-0"));
    if (lo <= 0 && hi >= 0) {
      EXPECT_FALSE(whole(g, "00"));
    }
  }
  // Open and exclusive sides, and bounds that are not whole numbers.
  expect_sentences(R"({"type": "integer", "minimum": 0})", {"0", "1", "9999999999999999"},
                   {"-1", "-0", "10000000000000000"});
  expect_sentences(R"({"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 10})",
                   {"1", "9"}, {"0", "10"});
  expect_sentences(R"({"type": "integer", "minimum": 0.5, "maximum": 2.5})", {"1", "2"},
                   {"0", "3"});
  expect_sentences(R"({"type": "integer", "maximum": -2})", {"-2", "-99999"}, {"-1", "0"});
  expect_sentences(R"({"type": "integer", "minimum": 1, "exclusiveMinimum": true})", {"2"}, {"1"});
  expect_sentences(R"({"type": "integer", "minimum": 100000000000000000})",
                   {"100000000000000000", "999999999999999999"}, {"99999999999999999"});
}

// Numbers between whole-number bounds: a grid of decimals around the bounds.
TEST(JsonSchema, NumberBoundsMatchExactly) {
  struct Case {
    const char* bounds;
    double lo, hi;
    bool lo_strict, hi_strict;
  };
  const Case cases[] = {
      {R"("minimum": 0, "maximum": 1)", 0, 1, false, false},
      {R"("exclusiveMinimum": 0, "maximum": 1)", 0, 1, true, false},
      {R"("minimum": -2, "exclusiveMaximum": 3)", -2, 3, false, true},
      {R"("exclusiveMinimum": -3, "exclusiveMaximum": -1)", -3, -1, true, true},
      {R"("minimum": 2)", 2, 1e300, false, false},
      {R"("exclusiveMaximum": 0)", -1e300, 0, false, true},
      {R"("maximum": -1)", -1e300, -1, false, false},
      {R"("minimum": 1, "maximum": 1)", 1, 1, false, false},
  };
  const char* fracs[] = {"", ".0", ".00", ".5", ".05", ".000001", ".99"};
  for (const Case& c : cases) {
    const std::string schema = std::string("{\"type\": \"number\", ") + c.bounds + "}";
    SCOPED_TRACE(schema);
    const auto g = schema_grammar(schema);
    for (int i = -5; i <= 5; ++i) {
      for (const char* f : fracs) {
        for (const char* sign : {"", "-"}) {
          if (*sign && i < 0) continue;
          const std::string text = sign + std::to_string(i < 0 ? -i : i) + f;
          const std::string doc = i < 0 ? "-" + text : text;
          const double v = std::stod(doc);
          const bool in =
              (c.lo_strict ? v > c.lo : v >= c.lo) && (c.hi_strict ? v < c.hi : v <= c.hi);
          // "-0" forms may be refused (the grammar is allowed to be stricter).
          if (v == 0 && doc[0] == '-') {
            if (!in) {
              EXPECT_FALSE(whole(g, doc)) << doc;
            }
            continue;
          }
          EXPECT_EQ(whole(g, doc), in) << doc;
        }
      }
    }
    EXPECT_FALSE(whole(g, "1e0"));
  }
}

TEST(JsonSchema, JsonObjectGrammar) {
  const auto g = compile(json_object_gbnf());
  for (const char* d : {"{}", R"({"a":1})", R"({"a":{"b":[1,2.5,-3e2,"x",true,false,null]}})",
                        R"({"esc":"q\"b\\s\/n\nt\tu\u00e9\ud83d\ude00","raw":"é😀"})",
                        "{\n  \"a\": [\n    {},\n    []\n  ]\n}"}) {
    EXPECT_TRUE(whole(g, d)) << d;
  }
  for (const char* d : {"[]", "[{}]", "1", "\"a\"", "null", R"({"a":})", R"({a:1})", R"({"a":1,})",
                        R"({"a":"\q"})", "{\"a\":\"\x01\"}"}) {
    EXPECT_FALSE(whole(g, d)) << d;
  }
}

// Keys of nlohmann::json are sorted, and the grammar follows that order.
TEST(JsonSchema, UnorderedJsonSortsProperties) {
  const nlohmann::json schema = nlohmann::json::parse(
      R"({"type": "object", "properties": {"b": {"type": "integer"}, "a": {"type": "integer"}},
          "required": ["a", "b"]})");
  const auto g = compile(json_schema_to_gbnf(schema));
  EXPECT_TRUE(whole(g, R"({"a":1,"b":2})"));
  EXPECT_FALSE(whole(g, R"({"b":2,"a":1})"));
}

// The pointer of each refusal: the keyword at fault, else the schema.
TEST(JsonSchema, UnsupportedSchemasThrowWithThePointer) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"(false)", ""},
      {R"(5)", ""},
      {R"({"oneOf": [{"type": "string"}]})", "/oneOf"},
      {R"({"type": "object", "properties": {"age": {"type": "integer", "multipleOf": 2}}})",
       "/properties/age/multipleOf"},
      {R"({"type": "string", "pattern": "^a$"})", "/pattern"},
      {R"({"not": {}})", "/not"},
      {R"({"if": {}, "then": {}})", "/if"},
      {R"({"type": "object", "patternProperties": {}})", "/patternProperties"},
      {R"({"type": "object", "dependentRequired": {}})", "/dependentRequired"},
      {R"({"allOf": [{"type": "string"}, {"maxLength": 3}]})", "/allOf"},
      {R"({"type": "string", "format": "email"})", "/format"},
      {R"({"type": "number", "minimum": 0.5})", "/minimum"},
      {R"({"type": "object", "properties": {"a/b": {"type": "number", "maximum": 1.5}}})",
       "/properties/a~1b/maximum"},
      {R"({"type": "object", "required": 5})", "/required"},
      {R"({"type": "object", "required": ["a", 5]})", "/required/1"},
      {R"({"type": "object", "properties": []})", "/properties"},
      {R"({"type": "array", "minItems": -1})", "/minItems"},
      {R"({"type": "array", "maxItems": "3"})", "/maxItems"},
      {R"({"type": "array", "maxItems": 10001})", "/maxItems"},
      {R"({"type": "string", "maxLength": 20000})", "/maxLength"},
      {R"({"type": "array", "minItems": 3, "maxItems": 2})", "/minItems"},
      {R"({"type": "array", "uniqueItems": true})", "/uniqueItems"},
      {R"({"type": "strng"})", "/type"},
      {R"({"type": []})", "/type"},
      {R"({"type": ["string", 1]})", "/type/1"},
      {R"({"enum": []})", "/enum"},
      {R"({"enum": "a"})", "/enum"},
      {R"({"type": "integer", "enum": ["a"]})", ""},
      {R"({"type": "string", "enum": ["a"], "maxLength": 3})", "/maxLength"},
      {R"({"$ref": "#/$defs/missing"})", "/$ref"},
      {R"({"$ref": "other.json#/a"})", "/$ref"},
      {R"({"$ref": "#anchor"})", "/$ref"},
      {R"({"$ref": 3})", "/$ref"},
      {R"({"$ref": "#/$defs/a", "type": "object", "$defs": {"a": {}}})", "/type"},
      {R"({"$ref": "#"})", "/$ref"},
      {R"({"$defs": {"a": {"anyOf": [{"$ref": "#/$defs/b"}]}, "b": {"$ref": "#/$defs/a"}},
          "$ref": "#/$defs/a"})",
       "/$defs/b/$ref"},
      {R"({"$defs": {"a": {"type": "string", "format": "phone"}},
          "type": "array", "items": {"$ref": "#/$defs/a"}})",
       "/$defs/a/format"},
      {R"({"type": "object", "properties": {"a": {"$id": "x"}}})", "/properties/a/$id"},
      {R"({"type": "object", "properties": {"a": false}, "required": ["a"]})", "/properties/a"},
      {R"({"type": "object", "required": ["a"], "additionalProperties": false})", "/required/0"},
      {R"({"type": "object", "properties": {"a": {}}, "minProperties": 1})", "/minProperties"},
      {R"({"type": "object", "properties": {"a": {}, "b": {}}, "maxProperties": 1})",
       "/maxProperties"},
      {R"({"type": "object", "additionalProperties": 3})", "/additionalProperties"},
      {R"({"type": "integer", "minimum": 5, "maximum": 4})", ""},
      {R"({"type": "integer", "minimum": 1e30})", ""},
      {R"({"type": "number", "exclusiveMinimum": 1, "exclusiveMaximum": 1})", ""},
      {R"({"type": "integer", "minimum": "0"})", "/minimum"},
      {R"({"type": "string", "format": "date", "maxLength": 5})", ""},
      {R"({"$defs": {"a": {"type": "array", "items": {"$ref": "#/$defs/a"}, "minItems": 1}},
          "$ref": "#/$defs/a"})",
       "/$defs/a"},
      {R"({"type": "object", "properties": {"n": {"$ref": "#"}}, "required": ["n"]})", ""},
      {R"({"anyOf": []})", "/anyOf"},
      {R"({"anyOf": [{"type": "string"}, false]})", "/anyOf/1"},
  };
  for (const auto& [schema, pointer] : cases) {
    try {
      const std::string g = json_schema_to_gbnf(ojson::parse(schema));
      ADD_FAILURE() << "no error for " << schema << ":\n" << g;
    } catch (const SchemaError& e) {
      EXPECT_EQ(e.pointer(), pointer) << schema << ": " << e.what();
      const std::string what = e.what();
      EXPECT_EQ(what.rfind("json schema", 0), 0u) << what;
    }
  }
  try {
    json_schema_to_gbnf(ojson::parse(R"({"properties": {"age": {"type": "integer",
                                         "multipleOf": 3}}})"));
  } catch (const SchemaError& e) {
    EXPECT_STREQ(e.what(),
                 "json schema at /properties/age/multipleOf: 'multipleOf' is not supported");
  }
}

TEST(JsonSchema, HostileSchemasAreRefused) {
  // Nesting past 64 levels, through properties and through items.
  std::string deep = R"({"type": "integer"})";
  for (int i = 0; i < 70; ++i) deep = R"({"type": "object", "properties": {"a": )" + deep + "}}";
  EXPECT_THROW(json_schema_to_gbnf(ojson::parse(deep)), SchemaError);
  std::string ok = R"({"type": "integer"})";
  for (int i = 0; i < 60; ++i) ok = R"({"type": "array", "items": )" + ok + "}";
  EXPECT_NO_THROW(compile(json_schema_to_gbnf(ojson::parse(ok))));
  // A deep enum value.
  std::string value = "1";
  for (int i = 0; i < 100; ++i) value = "[" + value + "]";
  EXPECT_THROW(json_schema_to_gbnf(ojson::parse("{\"enum\": [" + value + "]}")), SchemaError);
  // A grammar past 1 MiB.
  ojson big = {{"enum", ojson::array()}};
  for (int i = 0; i < 2000; ++i) big["enum"].push_back(std::string(1000, 'a' + i % 26));
  EXPECT_THROW(json_schema_to_gbnf(big), SchemaError);
  ojson many = {{"type", "object"}, {"properties", ojson::object()}};
  for (int i = 0; i < 200; ++i) {
    many["properties"]["p" + std::to_string(i)] = {{"type", "string"}, {"maxLength", 10000 - i}};
  }
  EXPECT_THROW(json_schema_to_gbnf(many), SchemaError);
  // Many optional properties stay linear (no nesting limit of the parser is reached).
  ojson wide = {{"type", "object"}, {"properties", ojson::object()}};
  for (int i = 0; i < 400; ++i) wide["properties"]["p" + std::to_string(i)] = {{"type", "null"}};
  const auto g = compile(json_schema_to_gbnf(wide));
  EXPECT_TRUE(whole(g, R"({"p7":null,"p399":null})"));
  // Names that look like the parser's own generated rules, or clash with the built-in
  // ones, stay distinct.
  expect_sentences(R"({"$defs": {"string": {"type": "integer"}, "root": {"type": "boolean"},
                       "1": {"type": "null"}}, "type": "object", "properties": {
                       "1": {"$ref": "#/$defs/string"}, "2": {"$ref": "#/$defs/root"},
                       "_": {"$ref": "#/$defs/1"}, "a b": {"type": ["string", "null"]}},
                       "required": ["1", "2", "_", "a b"]})",
                   {R"({"1":5,"2":true,"_":null,"a b":"x"})"},
                   {R"({"1":"5","2":true,"_":null,"a b":"x"})"});
}

// --- Random sentences validate ---------------------------------------------------

// A validator for the keywords the converter supports.
bool valid(const ojson& v, const ojson& s, const ojson& root);

size_t code_points(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

bool valid_format(const std::string& f, const std::string& t) {
  auto digits = [&](size_t at, size_t n) {
    if (at + n > t.size()) return -1;
    int v = 0;
    for (size_t i = at; i < at + n; ++i) {
      if (t[i] < '0' || t[i] > '9') return -1;
      v = v * 10 + (t[i] - '0');
    }
    return v;
  };
  auto date = [&](size_t at) {
    const int y = digits(at, 4), m = digits(at + 5, 2), d = digits(at + 8, 2);
    if (y < 1 || m < 1 || m > 12 || d < 1 || t[at + 4] != '-' || t[at + 7] != '-') return false;
    const bool leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    const int days[] = {31, leap ? 29 : 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    return d <= days[m - 1];
  };
  auto time = [&](size_t at) {
    if (digits(at, 2) > 23 || digits(at, 2) < 0 || t[at + 2] != ':' || digits(at + 3, 2) > 59 ||
        digits(at + 3, 2) < 0 || t[at + 5] != ':' || digits(at + 6, 2) > 59 ||
        digits(at + 6, 2) < 0)
      return false;
    size_t i = at + 8;
    if (i < t.size() && t[i] == '.') {
      const size_t s = ++i;
      while (i < t.size() && t[i] >= '0' && t[i] <= '9') ++i;
      if (i == s) return false;
    }
    if (i < t.size() && t[i] == 'Z') return i + 1 == t.size();
    return i + 6 == t.size() && (t[i] == '+' || t[i] == '-') && digits(i + 1, 2) >= 0 &&
           digits(i + 1, 2) <= 23 && t[i + 3] == ':' && digits(i + 4, 2) >= 0 &&
           digits(i + 4, 2) <= 59;
  };
  if (f == "date") return t.size() == 10 && date(0);
  if (f == "time") return t.size() >= 9 && time(0);
  if (f == "date-time") return t.size() >= 20 && date(0) && t[10] == 'T' && time(11);
  if (f == "uuid") {
    if (t.size() != 36) return false;
    for (size_t i = 0; i < 36; ++i) {
      const bool dash = i == 8 || i == 13 || i == 18 || i == 23;
      if (dash != (t[i] == '-') || (!dash && !std::isxdigit(static_cast<unsigned char>(t[i]))))
        return false;
    }
    return true;
  }
  if (f == "ipv4") {
    unsigned a, b, c, d;
    char tail;
    if (std::sscanf(t.c_str(), "%3u.%3u.%3u.%3u%c", &a, &b, &c, &d, &tail) != 4) return false;
    return a < 256 && b < 256 && c < 256 && d < 256;
  }
  return false;
}

bool valid(const ojson& v, const ojson& s, const ojson& root) {
  if (s.is_boolean()) return s.get<bool>();
  if (s.contains("$ref")) {
    const std::string r = s["$ref"].get<std::string>();
    return valid(v, root.at(ojson::json_pointer(r.substr(1))), root);
  }
  if (s.contains("anyOf")) {
    bool any = false;
    for (const ojson& a : s["anyOf"]) any = any || valid(v, a, root);
    if (!any) return false;
  }
  if (s.contains("allOf")) {
    for (const ojson& a : s["allOf"]) {
      if (!valid(v, a, root)) return false;
    }
  }
  if (s.contains("const") && !(v == s["const"])) return false;
  if (s.contains("enum") && std::find(s["enum"].begin(), s["enum"].end(), v) == s["enum"].end())
    return false;
  if (s.contains("type")) {
    const ojson types = s["type"].is_array() ? s["type"] : ojson::array({s["type"]});
    bool any = false;
    for (const ojson& t : types) {
      const std::string n = t.get<std::string>();
      any = any || (n == "null" && v.is_null()) || (n == "boolean" && v.is_boolean()) ||
            (n == "object" && v.is_object()) || (n == "array" && v.is_array()) ||
            (n == "string" && v.is_string()) || (n == "number" && v.is_number()) ||
            (n == "integer" && v.is_number() && std::floor(v.get<double>()) == v.get<double>());
    }
    if (!any) return false;
  }
  if (v.is_object()) {
    const ojson props = s.value("properties", ojson::object());
    for (const ojson& r : s.value("required", ojson::array())) {
      if (!v.contains(r.get<std::string>())) return false;
    }
    for (auto it = v.begin(); it != v.end(); ++it) {
      const ojson& sub =
          props.contains(it.key()) ? props[it.key()] : s.value("additionalProperties", ojson(true));
      if (!valid(*it, sub, root)) return false;
    }
    if (s.contains("maxProperties") && v.size() > s["maxProperties"].get<size_t>()) return false;
    if (s.contains("minProperties") && v.size() < s["minProperties"].get<size_t>()) return false;
  }
  if (v.is_array()) {
    const ojson prefix = s.value("prefixItems", ojson::array());
    for (size_t i = 0; i < v.size(); ++i) {
      const ojson& sub = i < prefix.size() ? prefix[i] : s.value("items", ojson(true));
      if (!valid(v[i], sub, root)) return false;
    }
    if (v.size() < s.value("minItems", 0u) || v.size() > s.value("maxItems", 1000000u))
      return false;
  }
  if (v.is_string()) {
    const std::string t = v.get<std::string>();
    if (code_points(t) < s.value("minLength", 0u) ||
        code_points(t) > s.value("maxLength", 1000000u))
      return false;
    if (s.contains("format") && !valid_format(s["format"].get<std::string>(), t)) return false;
  }
  if (v.is_number()) {
    const double x = v.get<double>();
    if (!std::isfinite(x)) return false;
    if (s.contains("minimum") && x < s["minimum"].get<double>()) return false;
    if (s.contains("maximum") && x > s["maximum"].get<double>()) return false;
    if (s.contains("exclusiveMinimum") && x <= s["exclusiveMinimum"].get<double>()) return false;
    if (s.contains("exclusiveMaximum") && x >= s["exclusiveMaximum"].get<double>()) return false;
  }
  return true;
}

// A random sentence: characters chosen at random among those the grammar takes,
// preferring closing ones once the text is long.
std::string random_sentence(const std::shared_ptr<const Grammar>& g, std::mt19937& rng) {
  static const std::vector<std::string> alphabet = [] {
    std::vector<std::string> a;
    for (char c = 0x20; c < 0x7F; ++c) a.push_back(std::string(1, c));
    for (const char* s : {"\n", "\t", "é", "😀"}) a.push_back(s);
    return a;
  }();
  Matcher m(g);
  std::string out;
  std::vector<std::string> order = alphabet;
  for (;;) {
    const bool is_long = out.size() > 120;
    if (m.accepting() && (is_long || rng() % 8 == 0)) return out;
    std::shuffle(order.begin(), order.end(), rng);
    if (is_long) {
      std::stable_partition(order.begin(), order.end(), [](const std::string& c) {
        return c == "\"" || c == "]" || c == "}" || c == ",";
      });
    }
    bool moved = false;
    for (const std::string& c : order) {
      if (m.accept(c)) {
        out += c;
        moved = true;
        break;
      }
    }
    if (!moved) return out;  // only an accepting state can have no way on
  }
}

TEST(JsonSchema, RandomSentencesValidate) {
  const char* schemas[] = {
      R"({"type": "object", "properties": {"name": {"type": "string", "maxLength": 5},
          "age": {"type": "integer", "minimum": 0, "maximum": 120},
          "score": {"type": "number", "exclusiveMinimum": -1, "maximum": 1},
          "tags": {"type": "array", "items": {"enum": ["a", "b", 3]}, "maxItems": 3},
          "when": {"type": "string", "format": "date-time"}},
          "required": ["age"], "additionalProperties": false})",
      R"({"$defs": {"node": {"type": "object", "properties": {"v": {"type": ["integer", "null"],
          "exclusiveMaximum": 10}, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"},
          "maxItems": 2}}, "required": ["v"]}}, "$ref": "#/$defs/node"})",
      R"({"type": "array", "prefixItems": [{"type": "string", "format": "date"},
          {"type": "string", "format": "uuid"}], "items": {"type": "string", "format": "ipv4"},
          "minItems": 1, "maxItems": 4})",
      R"({"anyOf": [{"type": "string", "minLength": 2, "maxLength": 3}, {"type": "number"},
          {"type": "object", "additionalProperties": {"type": "boolean"}, "maxProperties": 2},
          {"const": {"k": [1, "x"]}}]})",
      R"({"type": "string", "format": "time"})",
      R"({"type": "integer", "minimum": -123, "exclusiveMaximum": 4567})",
  };
  std::mt19937 rng(7);
  for (const char* text : schemas) {
    const ojson schema = ojson::parse(text);
    const auto g = compile(json_schema_to_gbnf(schema));
    for (int i = 0; i < 150; ++i) {
      const std::string doc = random_sentence(g, rng);
      ojson v;
      ASSERT_NO_THROW(v = ojson::parse(doc)) << text << "\n" << doc;
      EXPECT_TRUE(valid(v, schema, schema)) << text << "\n" << doc;
    }
  }
}

}  // namespace
}  // namespace kivi::grammar
