// splitmix64's finaliser: the counter-based hash behind memtrade's deterministic, portable
// random streams (parameter init, synthetic data). Value k of a stream is splitmix64(base + k),
// so any element can be computed on its own, in parallel, on any platform.
#pragma once

#include <cstdint>

namespace memtrade {

inline std::uint64_t splitmix64(std::uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace memtrade
