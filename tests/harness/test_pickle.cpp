// The pickle writer (harness/common/pickle.h), byte by byte against the opcodes of CPython's
// Lib/pickletools.py. That Python's pickle.loads reads what it writes is checked by
// tests/python/test_torch_snapshot.py (the snapshots, through torch's own tool).
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>

#include "harness/common/pickle.h"

namespace memtrade {
namespace {

using nlohmann::json;
using namespace std::string_literals;

// PROTO 2, the value, STOP.
std::string framed(const std::string& body) {
  return "\x80\x02"s + body + ".";
}

TEST(Pickle, Scalars) {
  EXPECT_EQ(to_pickle(json(nullptr)), framed("N"));
  EXPECT_EQ(to_pickle(json(true)), framed("\x88"));
  EXPECT_EQ(to_pickle(json(false)), framed("\x89"));
  // BINFLOAT: 8 bytes big-endian; 1.5 = 0x3FF8000000000000.
  EXPECT_EQ(to_pickle(json(1.5)), framed("G\x3f\xf8\x00\x00\x00\x00\x00\x00"s));
  // BINUNICODE: 4-byte little-endian length, then UTF-8.
  EXPECT_EQ(to_pickle(json("ab")), framed("X\x02\x00\x00\x00"
                                          "ab"s));
  EXPECT_EQ(to_pickle(json("é")), framed("X\x02\x00\x00\x00\xc3\xa9"s));
}

TEST(Pickle, IntegersTakeTheSmallestOpcode) {
  EXPECT_EQ(pickle_int(0), "K\x00"s);
  EXPECT_EQ(pickle_int(255), "K\xff"s);
  EXPECT_EQ(pickle_int(256), "M\x00\x01"s);
  EXPECT_EQ(pickle_int(65535), "M\xff\xff"s);
  EXPECT_EQ(pickle_int(65536), "J\x00\x00\x01\x00"s);
  EXPECT_EQ(pickle_int(-1), "J\xff\xff\xff\xff"s);
  EXPECT_EQ(pickle_int(std::numeric_limits<std::int32_t>::max()), "J\xff\xff\xff\x7f"s);
  EXPECT_EQ(pickle_int(std::numeric_limits<std::int32_t>::min()), "J\x00\x00\x00\x80"s);
  // LONG1: length byte, two's complement little-endian in the fewest bytes that keep the sign.
  EXPECT_EQ(pickle_int(std::int64_t{1} << 31), "\x8a\x05\x00\x00\x00\x80\x00"s);
  EXPECT_EQ(pickle_int(-(std::int64_t{1} << 31) - 1), "\x8a\x05\xff\xff\xff\x7f\xff"s);
  EXPECT_EQ(pickle_int(-(std::int64_t{1} << 40)), "\x8a\x06\x00\x00\x00\x00\x00\xff"s);
  // A host address (0x7f12_3456_7000): 6 bytes.
  EXPECT_EQ(pickle_int(0x7f1234567000), "\x8a\x06\x00\x70\x56\x34\x12\x7f"s);
  EXPECT_EQ(pickle_int(std::numeric_limits<std::int64_t>::max()),
            "\x8a\x08\xff\xff\xff\xff\xff\xff\xff\x7f"s);
  EXPECT_EQ(pickle_int(std::numeric_limits<std::int64_t>::min()),
            "\x8a\x08\x00\x00\x00\x00\x00\x00\x00\x80"s);
  // Above 2^63 - 1 the top bit is set: a ninth byte keeps it positive.
  EXPECT_EQ(pickle_uint(std::uint64_t{1} << 63), "\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x80\x00"s);
  EXPECT_EQ(pickle_uint(std::numeric_limits<std::uint64_t>::max()),
            "\x8a\x09\xff\xff\xff\xff\xff\xff\xff\xff\x00"s);
  EXPECT_EQ(pickle_uint(7), pickle_int(7));
  EXPECT_EQ(to_pickle(json(std::uint64_t{1} << 63)),
            framed("\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x80\x00"s));
}

TEST(Pickle, ContainersAreMarkedBatches) {
  EXPECT_EQ(to_pickle(json::array()), framed("]"));
  EXPECT_EQ(to_pickle(json::object()), framed("}"));
  // EMPTY_LIST MARK items APPENDS.
  EXPECT_EQ(to_pickle(json::array({1, nullptr})), framed("](K\x01"
                                                         "Ne"s));
  // EMPTY_DICT MARK key value ... SETITEMS, keys in nlohmann's (sorted) order.
  EXPECT_EQ(to_pickle(json{{"b", 2}, {"a", json::array()}}), framed("}(X\x01\x00\x00\x00"
                                                                    "a]X\x01\x00\x00\x00"
                                                                    "bK\x02u"s));
}

TEST(Pickle, RefusesBinaryValues) {
  EXPECT_THROW(to_pickle(json::binary({1, 2})), std::invalid_argument);
}

}  // namespace
}  // namespace memtrade
