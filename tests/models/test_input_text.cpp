// What memtrade says back about bad input (models/config/input_text.h): one bounded, escaped line
// per value, whatever the value; and the JSON reader that refuses what would crash later (a value
// nested 100,000 levels deep, a number beyond a double) as one line instead.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "models/config/hf_config.h"
#include "models/config/input_text.h"
#include "models/model.h"

namespace memtrade {
namespace {

using nlohmann::json;

std::string parse_error(const std::string& text) {
  try {
    (void)parse_json_input(text);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  ADD_FAILURE() << "accepted: " << text.substr(0, 80);
  return "";
}

TEST(Echo, EscapesControlCharactersAndCutsLongValues) {
  EXPECT_EQ(echo("fp8"), "fp8");
  EXPECT_EQ(echo("Foo\nBar\r\t\x01"), "Foo\\nBar\\r\\t\\x01");
  const std::string huge(1'000'000, 'x');
  const std::string shown = echo(huge);
  EXPECT_EQ(shown, std::string(kEchoMax, 'x') + "... (1000000 bytes)");
  // Never half a UTF-8 character: 'é' is two bytes.
  std::string accents;
  for (int i = 0; i < 100; ++i) accents += "\xc3\xa9";
  const std::string cut = echo(accents);
  EXPECT_EQ(cut.substr(0, cut.find("...")).size() % 2, 0u) << cut;
  EXPECT_EQ(echo(std::string(300, 'p'), kEchoPathMax).size(),
            kEchoPathMax + std::string("... (300 bytes)").size());
}

TEST(Echo, JsonValuesAreBoundedHoweverLargeOrDeep) {
  EXPECT_EQ(echo_json(json("Foo\nBar")), "\"Foo\\nBar\"");
  EXPECT_EQ(echo_json(json(3)), "3");
  EXPECT_EQ(echo_json(json{{"a", 1}}), "{\"a\":1}");
  EXPECT_LE(echo_json(json(std::string(1'000'000, 'y'))).size(), kEchoMax + 3);
  json deep = json::array();
  for (int i = 0; i < 1000; ++i) deep = json::array({std::move(deep)});
  EXPECT_EQ(echo_json(deep), "[[[[[...]]]]]");
  EXPECT_LE(echo_json(json(std::vector<int>(100000, 7))).size(), kEchoMax + 3);
}

TEST(Echo, OneLineKeepsAnyMessageOnOneBoundedLine) {
  EXPECT_EQ(one_line("a\nb"), "a\\nb");
  EXPECT_LT(one_line(std::string(1'000'000, 'z')).size(), 1100u);
}

TEST(ParseJsonInput, RefusesDeepNestingAndOverflowingNumbersAsOneLine) {
  const std::string deep =
      "{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":" + std::string(100000, '[') +
      std::string(100000, ']') + "}";
  EXPECT_EQ(parse_error(deep), "not JSON memtrade reads: nested deeper than 64 levels");
  EXPECT_EQ(parse_error("{\"ignored\": 1e400}"),
            "not JSON memtrade reads: number overflow parsing '1e400'");
  EXPECT_EQ(parse_error("{\"a\": -1e400}"),
            "not JSON memtrade reads: number overflow parsing '-1e400'");
  EXPECT_EQ(parse_error("{").rfind("not JSON (", 0), 0u);
  // A syntax error quotes the bad token bounded and on one line.
  const std::string bad = parse_error("{\"a\": \"" + std::string(100000, 'q') + "\n\"}");
  EXPECT_EQ(bad.find('\n'), std::string::npos);
  EXPECT_LT(bad.size(), 400u);
  // 64 levels are read.
  EXPECT_NO_THROW(parse_json_input(std::string(64, '[') + std::string(64, ']')));
  // A NUL byte ends nlohmann's input: "{...}\0garbage" read as "{...}" before (found by the
  // fuzzer, tests/fuzz).
  EXPECT_EQ(parse_error(std::string("{\"a\": 1}\0xx", 11)), "not JSON (a NUL byte at offset 8)");
}

std::string hf_error(const json& j) {
  try {
    (void)parse_hf_config(j.dump(), ConfigFile{"x", "0"});
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  ADD_FAILURE() << "accepted: " << j.dump();
  return "";
}

json tiny_llama() {
  return {{"architectures", {"LlamaForCausalLM"}},
          {"hidden_size", 64},
          {"num_hidden_layers", 2},
          {"num_attention_heads", 4},
          {"intermediate_size", 176},
          {"vocab_size", 256},
          {"max_position_embeddings", 32}};
}

TEST(HfConfigHardening, ValuesAreEchoedBoundedAndEscaped) {
  json j = tiny_llama();
  j["architectures"] = {"Foo\nBar"};
  EXPECT_EQ(hf_error(j),
            "unsupported architecture 'Foo\\nBar' (memtrade reads LlamaForCausalLM, "
            "Qwen2ForCausalLM, Qwen3ForCausalLM, MistralForCausalLM, Phi3ForCausalLM, "
            "Gemma2ForCausalLM, MixtralForCausalLM, Qwen2MoeForCausalLM and GPT2LMHeadModel)");
  const std::size_t short_name = hf_error(j).size() - std::string("Foo\\nBar").size();
  j["architectures"] = {std::string(1'000'000, 'x')};
  // The echo's bound and its note, plus the message around it (the list of architectures).
  EXPECT_LE(hf_error(j).size(), short_name + kEchoMax + std::string("... (1000000 bytes)").size());
  j = tiny_llama();
  j["hidden_size"] = std::string(1'000'000, 'h');
  EXPECT_LT(hf_error(j).size(), 200u);
}

TEST(HfConfigHardening, ProductsAndNarrowingAreChecked) {
  json j = tiny_llama();
  j["head_dim"] = 1073741840;  // × 4 heads wraps to 64 in an int
  // Llama takes head_dim as it is (bounded); Qwen2 must have hidden_size / num_heads, checked in
  // 64 bits.
  EXPECT_EQ(hf_error(j), "key 'head_dim' 1073741840 is above memtrade's bound of 1024 (head dim)");
  j["architectures"] = {"Qwen2ForCausalLM"};
  EXPECT_EQ(hf_error(j),
            "unsupported head_dim 1073741840: Qwen2ForCausalLM has hidden_size / "
            "num_attention_heads = 64/4");
  j = tiny_llama();
  j["hidden_size"] = 4294967360;  // 2^32 + 64: an int would keep 64
  EXPECT_EQ(hf_error(j),
            "key 'hidden_size' 4294967360 is above memtrade's bound of 131072 (hidden size)");
  j["hidden_size"] = 18446744073709551615u;
  EXPECT_EQ(hf_error(j), "key 'hidden_size' must be a positive integer, got 18446744073709551615");
}

TEST(HfConfigHardening, SizesHaveSanityBounds) {
  for (const auto& [key, bound] : std::vector<std::pair<std::string, std::string>>{
           {"num_hidden_layers", "4096 (layers)"},
           {"num_attention_heads", "4096 (attention heads)"},
           {"hidden_size", "131072 (hidden size)"},
           {"intermediate_size", "1048576 (MLP size)"},
           {"vocab_size", "16777216 (vocabulary)"},
           {"max_position_embeddings", "16777216 (positions)"}}) {
    json j = tiny_llama();
    j[key] = 2147483647;
    EXPECT_EQ(hf_error(j),
              fmt::format("key '{}' 2147483647 is above memtrade's bound of {}", key, bound));
  }
}

TEST(ModelOverrideHardening, SizesHaveSanityBounds) {
  // Refused before a layer is built: no hang, no bad_alloc.
  try {
    (void)canonical_model_name("gpt-tiny:n_layer=2000000000");
    ADD_FAILURE();
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()),
              "gpt-tiny:n_layer=2000000000: n_layer 2000000000 is above memtrade's bound of 4096 "
              "(layers)");
  }
  EXPECT_THROW((void)canonical_model_name("llama-tiny:vocab_size=2000000000"),
               std::invalid_argument);
  EXPECT_THROW((void)canonical_model_name("llama-tiny:n_layer=4294967297"),
               std::invalid_argument);  // beyond an int: from_chars refuses it
  EXPECT_NO_THROW((void)canonical_model_name("llama-tiny:n_layer=4096"));
}

}  // namespace
}  // namespace memtrade
