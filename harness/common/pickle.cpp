#include "harness/common/pickle.h"

#include <bit>
#include <cstring>
#include <stdexcept>

namespace memtrade {
namespace {

// Opcodes (CPython Lib/pickletools.py).
constexpr char kProto = '\x80';
constexpr char kStop = '.';
constexpr char kMark = '(';
constexpr char kEmptyDict = '}';
constexpr char kSetItems = 'u';
constexpr char kEmptyList = ']';
constexpr char kAppends = 'e';
constexpr char kBinUnicode = 'X';
constexpr char kBinInt = 'J';   // 4-byte signed little-endian
constexpr char kBinInt1 = 'K';  // 1-byte unsigned
constexpr char kBinInt2 = 'M';  // 2-byte unsigned little-endian
constexpr char kLong1 = '\x8a';
constexpr char kBinFloat = 'G';
constexpr char kNewTrue = '\x88';
constexpr char kNewFalse = '\x89';
constexpr char kNone = 'N';

void put_le(std::string& out, std::uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

// LONG1: a length byte, then the value in two's complement, little-endian, in the fewest bytes
// that keep its sign (so 2^63 needs 9 bytes: its top bit would read as negative).
void put_long1(std::string& out, std::uint64_t magnitude_bits, bool negative) {
  // magnitude_bits is the 64-bit two's complement pattern; a 65th byte carries the sign when
  // the pattern's top bit disagrees with it.
  std::string bytes;
  put_le(bytes, magnitude_bits, 8);
  const char fill = negative ? '\xff' : '\0';
  bytes.push_back(fill);
  while (bytes.size() > 1 && bytes.back() == fill &&
         ((bytes[bytes.size() - 2] & 0x80) != 0) == negative)
    bytes.pop_back();
  out.push_back(kLong1);
  out.push_back(static_cast<char>(bytes.size()));
  out += bytes;
}

void put_str(std::string& out, const std::string& s) {
  if (s.size() > 0xffffffffu) throw std::length_error("pickle: string over 4 GiB");
  out.push_back(kBinUnicode);
  put_le(out, s.size(), 4);
  out += s;
}

void put(std::string& out, const nlohmann::json& v) {
  switch (v.type()) {
    case nlohmann::json::value_t::null:
      out.push_back(kNone);
      return;
    case nlohmann::json::value_t::boolean:
      out.push_back(v.get<bool>() ? kNewTrue : kNewFalse);
      return;
    case nlohmann::json::value_t::number_integer:
      out += pickle_int(v.get<std::int64_t>());
      return;
    case nlohmann::json::value_t::number_unsigned:
      out += pickle_uint(v.get<std::uint64_t>());
      return;
    case nlohmann::json::value_t::number_float: {
      out.push_back(kBinFloat);
      const auto bits = std::bit_cast<std::uint64_t>(v.get<double>());
      for (int i = 7; i >= 0; --i) out.push_back(static_cast<char>((bits >> (8 * i)) & 0xff));
      return;
    }
    case nlohmann::json::value_t::string:
      put_str(out, v.get_ref<const std::string&>());
      return;
    case nlohmann::json::value_t::array:
      out.push_back(kEmptyList);
      if (v.empty()) return;
      out.push_back(kMark);
      for (const auto& item : v) put(out, item);
      out.push_back(kAppends);
      return;
    case nlohmann::json::value_t::object:
      out.push_back(kEmptyDict);
      if (v.empty()) return;
      out.push_back(kMark);
      for (const auto& [key, item] : v.items()) {
        put_str(out, key);
        put(out, item);
      }
      out.push_back(kSetItems);
      return;
    default:
      throw std::invalid_argument("pickle: a JSON value of no pickled type (binary, discarded)");
  }
}

}  // namespace

std::string pickle_int(std::int64_t v) {
  std::string out;
  if (v >= 0 && v <= 0xff) {
    out.push_back(kBinInt1);
    put_le(out, static_cast<std::uint64_t>(v), 1);
  } else if (v >= 0 && v <= 0xffff) {
    out.push_back(kBinInt2);
    put_le(out, static_cast<std::uint64_t>(v), 2);
  } else if (v >= INT32_MIN && v <= INT32_MAX) {
    out.push_back(kBinInt);
    put_le(out, static_cast<std::uint32_t>(static_cast<std::int32_t>(v)), 4);
  } else {
    put_long1(out, static_cast<std::uint64_t>(v), v < 0);
  }
  return out;
}

std::string pickle_uint(std::uint64_t v) {
  if (v <= static_cast<std::uint64_t>(INT64_MAX)) return pickle_int(static_cast<std::int64_t>(v));
  std::string out;
  put_long1(out, v, false);
  return out;
}

std::string to_pickle(const nlohmann::json& value) {
  std::string out;
  out.push_back(kProto);
  out.push_back('\x02');
  put(out, value);
  out.push_back(kStop);
  return out;
}

}  // namespace memtrade
