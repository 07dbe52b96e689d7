#include "harness/run/npy.h"

#include <cstring>
#include <fstream>
#include <stdexcept>

#include <fmt/format.h>

namespace memtrade {
namespace {

constexpr char kMagic[] = "\x93NUMPY";  // 6 bytes, then major, minor version
constexpr std::size_t kMagicLen = 6;

std::string shape_tuple(const Shape& shape) {
  if (shape.empty()) return "()";
  std::string s = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) s += fmt::format("{}, ", shape[i]);
  if (shape.size() == 1) return s.substr(0, s.size() - 1) + ")";  // "(5,)"
  return s.substr(0, s.size() - 2) + ")";                         // "(2, 3)"
}

void write_raw(const std::filesystem::path& path, const char* descr, const void* data,
               std::size_t count, std::size_t elem, const Shape& shape) {
  if (static_cast<std::int64_t>(count) != shape_numel(shape))
    throw std::invalid_argument(fmt::format("write_npy {}: {} values for shape {}", path.string(),
                                            count, shape_str(shape)));
  std::string header = fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': {}, }}",
                                   descr, shape_tuple(shape));
  // Pad with spaces and a final newline so that the data starts 64-byte aligned.
  const std::size_t preamble = kMagicLen + 2 + 2;
  std::size_t total = preamble + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header.push_back('\n');
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw std::runtime_error(fmt::format("cannot write {}", path.string()));
  out.write(kMagic, kMagicLen);
  const char version[2] = {1, 0};
  out.write(version, 2);
  const auto len = static_cast<std::uint16_t>(header.size());
  const char len_le[2] = {static_cast<char>(len & 0xff), static_cast<char>(len >> 8)};
  out.write(len_le, 2);
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  // .npy data is little-endian; so is every platform memtrade builds on.
  out.write(static_cast<const char*>(data), static_cast<std::streamsize>(count * elem));
  if (!out) throw std::runtime_error(fmt::format("error writing {}", path.string()));
}

// The value of 'key': ... in the header dict, up to the next top-level ',' or '}'.
std::string dict_value(const std::string& header, const std::string& key) {
  auto pos = header.find("'" + key + "'");
  if (pos == std::string::npos) throw std::runtime_error("npy header without '" + key + "'");
  pos = header.find(':', pos);
  if (pos == std::string::npos) throw std::runtime_error("malformed npy header");
  ++pos;
  while (pos < header.size() && header[pos] == ' ') ++pos;
  if (header[pos] == '(') return header.substr(pos, header.find(')', pos) - pos + 1);
  auto end = header.find_first_of(",}", pos);
  return header.substr(pos, end - pos);
}

}  // namespace

void write_npy(const std::filesystem::path& path, std::span<const float> values,
               const Shape& shape) {
  write_raw(path, "<f4", values.data(), values.size(), sizeof(float), shape);
}

void write_npy(const std::filesystem::path& path, std::span<const std::int32_t> values,
               const Shape& shape) {
  write_raw(path, "<i4", values.data(), values.size(), sizeof(std::int32_t), shape);
}

NpyArray read_npy(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(fmt::format("cannot read {}", path.string()));
  char magic[kMagicLen + 2];
  in.read(magic, sizeof magic);
  if (!in || std::memcmp(magic, kMagic, kMagicLen) != 0 || magic[6] != 1)
    throw std::runtime_error(fmt::format("{}: not a version 1 .npy file", path.string()));
  unsigned char len_le[2];
  in.read(reinterpret_cast<char*>(len_le), 2);
  std::string header(static_cast<std::size_t>(len_le[0] | (len_le[1] << 8)), '\0');
  in.read(header.data(), static_cast<std::streamsize>(header.size()));
  if (!in) throw std::runtime_error(fmt::format("{}: truncated header", path.string()));

  NpyArray a;
  std::string descr = dict_value(header, "descr");
  if (descr.size() >= 2) descr = descr.substr(1, descr.size() - 2);  // strip quotes
  a.descr = descr;
  if (dict_value(header, "fortran_order") != "False")
    throw std::runtime_error(fmt::format("{}: Fortran order not supported", path.string()));
  const std::string tuple = dict_value(header, "shape");
  for (std::size_t p = 1; p < tuple.size();) {
    while (p < tuple.size() && (tuple[p] == ' ' || tuple[p] == ',')) ++p;
    if (p >= tuple.size() || tuple[p] == ')') break;
    std::size_t used = 0;
    a.shape.push_back(std::stoll(tuple.substr(p), &used));
    p += used;
  }
  const auto n = static_cast<std::size_t>(a.numel());
  if (descr == "<f4") {
    a.f32.resize(n);
    in.read(reinterpret_cast<char*>(a.f32.data()), static_cast<std::streamsize>(n * 4));
  } else if (descr == "<i4") {
    a.i32.resize(n);
    in.read(reinterpret_cast<char*>(a.i32.data()), static_cast<std::streamsize>(n * 4));
  } else {
    throw std::runtime_error(fmt::format("{}: dtype {} not supported", path.string(), descr));
  }
  if (!in) throw std::runtime_error(fmt::format("{}: truncated data", path.string()));
  return a;
}

}  // namespace memtrade
