// What memtrade reads from the user and says back: the one formatter for a value echoed in an
// error message, and the one reader of JSON the user gives (a model config file).
//
// Every error about bad input is one line on stderr (docs/design.md, "Command line"), so a value
// echoed in it is escaped (a newline in a file name or a string is shown as \n, never ends the
// line) and bounded (a 1 MB string is cut to its first characters, with its length), whatever
// the value is. The JSON reader refuses what would crash or mislead later instead of reading
// it: values nested deeper than kMaxJsonDepth, numbers that overflow a double (1e400), text
// that is not JSON; each as one line (std::invalid_argument).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace memtrade {

// The longest text echo() shows of a value, and of a path (paths are longer, and meaningful).
inline constexpr std::size_t kEchoMax = 80;
inline constexpr std::size_t kEchoPathMax = 256;
// Config files nest a few levels (rope_scaling is the deepest, 2); 64 is any real file's
// depth with room to spare, and keeps every later walk of the value (printing, copying) shallow.
inline constexpr int kMaxJsonDepth = 64;

// `text` on one line, at most `max` characters of it: control characters escaped (\n, \t, \r,
// \xNN), a longer text cut with "..." and its length in bytes.
std::string echo(std::string_view text, std::size_t max = kEchoMax);
// A JSON value as JSON text, bounded the same way (and never walked deeper than a few levels).
std::string echo_json(const nlohmann::json& value, std::size_t max = kEchoMax);
// A whole message on one line: echo() of it with a bound that no message of memtrade's reaches.
std::string one_line(std::string_view message);

// Parses JSON the user gave; throws std::invalid_argument naming the problem (not JSON, and
// where; a number out of range; nested deeper than kMaxJsonDepth).
nlohmann::json parse_json_input(std::string_view text);

}  // namespace memtrade
