// The server's endpoints beside generation: /tokenize and /detokenize against the
// tokenizer they serve (ids, pieces, special tokens, a round trip), and every malformed
// body answered with a 400 naming the field.
#include <httplib.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "server/api_error.h"
#include "server/token_api.h"
#include "server_test_util.h"
#include "test_util.h"

namespace kivi {
namespace {

using nlohmann::json;
using test::error_of;
using test::stories;
using test::TestServer;

TEST(ServerApi, TokenizeGivesTheTokenizersIds) {
  KIVI_REQUIRE_MODEL();
  const auto& tk = stories().tokenizer();
  const std::string text = "Once upon a time, there was a little girl named Lily.";
  const json plain = json::parse(server::tokenize_body(json{{"content", text}}.dump(), tk));
  EXPECT_EQ(plain["tokens"].get<std::vector<int>>(), tk.encode(text, false));
  const json special =
      json::parse(server::tokenize_body(json{{"content", text}, {"add_special", true}}.dump(), tk));
  EXPECT_EQ(special["tokens"].get<std::vector<int>>(), tk.encode(text, true));
  ASSERT_EQ(special["tokens"][0].get<int>(), tk.bos_id());
  const json pieces =
      json::parse(server::tokenize_body(json{{"content", text}, {"with_pieces", true}}.dump(), tk));
  ASSERT_EQ(pieces["tokens"].size(), plain["tokens"].size());
  std::string joined;
  for (size_t i = 0; i < pieces["tokens"].size(); ++i) {
    const json& p = pieces["tokens"][i];
    EXPECT_EQ(p["id"], plain["tokens"][i]);
    EXPECT_EQ(p["piece"].get<std::string>(), tk.token_text(p["id"].get<int>(), true));
    joined += p["piece"].get<std::string>();
  }
  EXPECT_NE(joined.find("Lily"), std::string::npos) << joined;
  // Back to the text.
  const json back =
      json::parse(server::detokenize_body(json{{"tokens", plain["tokens"]}}.dump(), tk));
  EXPECT_EQ(back["content"].get<std::string>(),
            tk.decode_all(plain["tokens"].get<std::vector<int>>()));
  EXPECT_NE(back["content"].get<std::string>().find(text.substr(1)), std::string::npos)
      << back["content"];
  // Empty text and an empty list.
  EXPECT_EQ(json::parse(server::tokenize_body(R"({"content": ""})", tk))["tokens"].size(), 0u);
  EXPECT_EQ(json::parse(server::detokenize_body(R"({"tokens": []})", tk))["content"], "");
}

TEST(ServerApi, MalformedBodiesNameTheField) {
  KIVI_REQUIRE_MODEL();
  const auto& tk = stories().tokenizer();
  struct Case {
    bool tokenize;
    std::string body, param, says;
  };
  const Case cases[] = {
      {true, "not json", "", "not valid JSON"},
      {true, "[1, 2]", "", "JSON object"},
      {true, "{}", "content", "'content' is required"},
      {true, R"({"content": 5})", "content", "must be a string"},
      {true, R"({"content": "a", "add_special": "yes"})", "add_special", "boolean"},
      {true, R"({"content": "a", "with_pieces": 1})", "with_pieces", "boolean"},
      {true, "{\"content\": \"\xff\"}", "", "UTF-8"},
      {false, "{}", "tokens", "'tokens' is required"},
      {false, R"({"tokens": "1 2"})", "tokens", "array"},
      {false, R"({"tokens": [1, -1]})", "tokens", "tokens[1]"},
      {false, R"({"tokens": [1, 512]})", "tokens", "0 to 511"},
      {false, R"({"tokens": [1.5]})", "tokens", "tokens[0]"},
  };
  for (const Case& c : cases) {
    try {
      c.tokenize ? server::tokenize_body(c.body, tk) : server::detokenize_body(c.body, tk);
      ADD_FAILURE() << "accepted " << c.body;
    } catch (const server::ApiError& e) {
      EXPECT_EQ(e.status(), 400) << c.body;
      EXPECT_EQ(e.param(), c.param) << c.body;
      EXPECT_NE(std::string(e.what()).find(c.says), std::string::npos)
          << c.body << ": " << e.what();
    }
  }
}

TEST(ServerApi, TokenizeOverHttp) {
  KIVI_REQUIRE_MODEL();
  server::ServerOptions o;
  o.api_key = "secret";
  TestServer s(test::kivi2_options(1, 4), o);
  httplib::Client c = s.client();
  const std::string body = json{{"content", "Lily had a small cat."}}.dump();
  // The API key guards these routes as it guards /v1/.
  auto r = c.Post("/tokenize", body, "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 401);
  c.set_bearer_token_auth("secret");
  r = c.Post("/tokenize", body, "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const json ids = json::parse(r->body)["tokens"];
  EXPECT_EQ(ids.get<std::vector<int>>(),
            stories().tokenizer().encode("Lily had a small cat.", false));
  r = c.Post("/detokenize", json{{"tokens", ids}}.dump(), "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_NE(json::parse(r->body)["content"].get<std::string>().find("Lily had a small cat."),
            std::string::npos)
      << r->body;
  r = c.Post("/detokenize", R"({"tokens": [99999]})", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  EXPECT_EQ(error_of(r)["param"], "tokens");
}

}  // namespace
}  // namespace kivi
