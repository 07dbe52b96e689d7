// A Python pickle writer for the JSON values memtrade builds (dicts, lists, str, int of any
// size, float, bool, None), so that tools which read pickles (torch.cuda._memory_viz,
// pytorch.org/memory_viz) read memtrade's files without Python at runtime.
//
// Protocol 2 (readable by every Python 3; the snapshot tools ask for a protocol <= 4), no memo:
// every value is written where it appears. The opcodes are those of CPython's
// Lib/pickletools.py: PROTO, EMPTY_DICT + MARK ... SETITEMS, EMPTY_LIST + MARK ... APPENDS,
// BINUNICODE (UTF-8, 4-byte length), BININT1/BININT2/BININT (the ints that fit), LONG1 (two's
// complement little-endian, for the rest: addresses above 2^31), BINFLOAT (8-byte big-endian
// IEEE 754), NEWTRUE/NEWFALSE, NONE and STOP.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace memtrade {

// The pickle of `value`; pickle.loads(result) == the value as Python's json.loads reads it
// (object keys in nlohmann's order, which is sorted).
std::string to_pickle(const nlohmann::json& value);

// One integer's opcode and argument (exposed for the tests of the boundaries).
std::string pickle_int(std::int64_t v);
std::string pickle_uint(std::uint64_t v);

}  // namespace memtrade
