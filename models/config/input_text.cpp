#include "models/config/input_text.h"

#include <optional>
#include <stdexcept>

#include <fmt/format.h>

namespace memtrade {
namespace {

using nlohmann::json;

// The longest message one_line() passes whole: memtrade's longest (a path, then a list of every
// model name) is under half of it.
constexpr std::size_t kMessageMax = 1024;
// How deep echo() walks a JSON value before it shows [...] / {...}.
constexpr int kEchoDepth = 4;

bool continuation_byte(char c) {
  return (static_cast<unsigned char>(c) & 0xC0) == 0x80;
}

// `text` escaped; when the escaped text is longer than `max`, its first characters (never half
// a UTF-8 character) and "...", with `total` (the value's length in bytes) where it is known.
std::string escape_cut(std::string_view text, std::size_t max, std::optional<std::size_t> total) {
  std::string out;
  std::size_t shown = 0;
  for (; shown < text.size(); ++shown) {
    const auto c = static_cast<unsigned char>(text[shown]);
    std::string piece;
    switch (c) {
      case '\n':
        piece = "\\n";
        break;
      case '\r':
        piece = "\\r";
        break;
      case '\t':
        piece = "\\t";
        break;
      default:
        piece = c < 0x20 || c == 0x7f ? fmt::format("\\x{:02x}", c) : std::string(1, text[shown]);
    }
    if (out.size() + piece.size() > max) break;
    out += piece;
  }
  if (shown == text.size()) return out;
  while (shown > 0 && shown < text.size() && continuation_byte(text[shown])) {
    --shown;
    out.pop_back();  // a byte of a multi-byte character: shown as itself, one byte
  }
  return total ? fmt::format("{}... ({} bytes)", out, *total) : out + "...";
}

// JSON text of `v`, stopping once `out` is past `budget`: a huge or deep value costs no more
// than its first characters.
void render(const json& v, std::string& out, std::size_t budget, int depth) {
  if (out.size() > budget) return;
  const auto dump = [](const json& x) {
    return x.dump(-1, ' ', false, json::error_handler_t::replace);
  };
  if (v.is_array() || v.is_object()) {
    const bool array = v.is_array();
    if (depth >= kEchoDepth) {
      out += array ? "[...]" : "{...}";
      return;
    }
    out += array ? '[' : '{';
    bool first = true;
    for (auto it = v.begin(); it != v.end(); ++it) {
      if (!first) out += ',';
      first = false;
      if (!array) out += dump(json(it.key().substr(0, budget))) + ':';
      render(it.value(), out, budget, depth + 1);
      if (out.size() > budget) return;
    }
    out += array ? ']' : '}';
  } else if (v.is_string()) {
    out += dump(json(v.get_ref<const std::string&>().substr(0, budget + 1)));
  } else {
    out += dump(v);
  }
}

[[noreturn]] void fail(const std::string& what) {
  throw std::invalid_argument(what);
}

// The reader's complaint without nlohmann's "[json.exception.parse_error.101] " prefix.
std::string_view without_prefix(std::string_view what) {
  if (what.starts_with("[json.exception.")) {
    const auto end = what.find("] ");
    if (end != std::string_view::npos) what.remove_prefix(end + 2);
  }
  return what;
}

struct TooDeep {};

}  // namespace

std::string echo(std::string_view text, std::size_t max) {
  return escape_cut(text, max, text.size());
}

std::string echo_json(const json& value, std::size_t max) {
  std::string out;
  render(value, out, max, 0);
  return escape_cut(out, max, std::nullopt);
}

std::string one_line(std::string_view message) {
  return escape_cut(message, kMessageMax, message.size());
}

json parse_json_input(std::string_view text) {
  // The parser itself keeps its nesting on the heap; what comes after it (printing a value,
  // copying it) recurses, so the value is refused as it is read.
  const json::parser_callback_t limit = [](int depth, json::parse_event_t event, json&) {
    if ((event == json::parse_event_t::object_start || event == json::parse_event_t::array_start) &&
        depth >= kMaxJsonDepth)
      throw TooDeep{};
    return true;
  };
  // nlohmann's lexer ends the input at a NUL byte: "{...}\0garbage" would parse as "{...}".
  if (const auto nul = text.find('\0'); nul != std::string_view::npos)
    fail(fmt::format("not JSON (a NUL byte at offset {})", nul));
  try {
    return json::parse(text, limit);
  } catch (const TooDeep&) {
    fail(fmt::format("not JSON memtrade reads: nested deeper than {} levels", kMaxJsonDepth));
  } catch (const json::out_of_range& e) {
    fail(fmt::format("not JSON memtrade reads: {}", echo(without_prefix(e.what()), 160)));
  } catch (const json::exception& e) {
    fail(fmt::format("not JSON ({})", echo(without_prefix(e.what()), 240)));
  }
}

}  // namespace memtrade
