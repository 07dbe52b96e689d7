// A family's hyper-parameters as data: each one's key (as in Model::hyper() and in a model
// override, `llama-tiny:n_layer=4`) and the config member it lives in. One table per family
// (gpt_hyper_fields(), llama_hyper_fields()) serves the overrides' parser, their canonical text
// and the typed values of hyper().
#pragma once

#include <charconv>
#include <cmath>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "models/config/input_text.h"

namespace memtrade {

template <typename Config>
struct HyperField {
  std::string_view key;
  // int: a positive integer; double: a positive finite number; bool: true/false (or 1/0).
  std::variant<int Config::*, double Config::*, bool Config::*> member;
};

// The value as canonical text: "4", "500000", "1e-05", "true". Two spellings of one value give
// one text (that is what makes a model override's id unique).
template <typename Config>
std::string hyper_text(const Config& c, const HyperField<Config>& f) {
  return std::visit(
      [&](auto m) -> std::string {
        using T = std::remove_reference_t<decltype(c.*m)>;
        if constexpr (std::is_same_v<T, bool>)
          return c.*m ? "true" : "false";
        else
          return fmt::format("{}", c.*m);  // shortest round-trip text of a double
      },
      f.member);
}

template <typename Config>
nlohmann::json hyper_value(const Config& c, const HyperField<Config>& f) {
  return std::visit([&](auto m) { return nlohmann::json(c.*m); }, f.member);
}

// Parses `text` into the member; returns what is wrong with it (without the key) or nullopt.
template <typename Config>
std::optional<std::string> set_hyper(Config& c, const HyperField<Config>& f,
                                     std::string_view text) {
  return std::visit(
      [&](auto m) -> std::optional<std::string> {
        using T = std::remove_reference_t<decltype(c.*m)>;
        const char* end = text.data() + text.size();
        if constexpr (std::is_same_v<T, bool>) {
          if (text != "true" && text != "1" && text != "false" && text != "0")
            return fmt::format("expected true or false, got '{}'", echo(text));
          c.*m = text == "true" || text == "1";
        } else if constexpr (std::is_same_v<T, int>) {
          int v = 0;
          auto [p, ec] = std::from_chars(text.data(), end, v);
          if (ec != std::errc() || p != end || v < 1)
            return fmt::format("expected a positive integer, got '{}'", echo(text));
          c.*m = v;
        } else {
          double v = 0;
          auto [p, ec] = std::from_chars(text.data(), end, v);
          if (ec != std::errc() || p != end || !(v > 0) || !std::isfinite(v))
            return fmt::format("expected a positive number, got '{}'", echo(text));
          c.*m = v;
        }
        return std::nullopt;
      },
      f.member);
}

template <typename Config>
const HyperField<Config>* find_hyper(const std::vector<HyperField<Config>>& fields,
                                     std::string_view key) {
  for (const auto& f : fields)
    if (f.key == key) return &f;
  return nullptr;
}

}  // namespace memtrade

namespace memtrade {

// Where a model's hyper-parameters came from when a file gave them (--model-config): the file's
// stem and the SHA-256 of its bytes. Empty for the size table's models.
struct ConfigFile {
  std::string name;    // "Meta-Llama-3-8B"
  std::string sha256;  // 64 hex digits
};

// Adds "model_config": {"name", "sha256"} to a model's hyper() when a file gave it.
inline void add_config_file(nlohmann::json& hyper, const ConfigFile& f) {
  if (!f.name.empty()) hyper["model_config"] = {{"name", f.name}, {"sha256", f.sha256}};
}

}  // namespace memtrade
