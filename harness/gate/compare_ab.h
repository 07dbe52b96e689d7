// A/B in one job: run two memtrade binaries on the same grid, interleaved point by point with
// the order alternating, so that machine drift (thermal, noisy neighbours) hits both sides alike.
#pragma once

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace memtrade {

struct AbOptions {
  std::string base_bin, head_bin, grid;
  int rounds = 1;                     // passes over the grid; samples of all rounds are pooled
  std::string work_dir;               // per-run files; empty: a fresh temporary dir, removed after
  std::vector<std::string> run_args;  // extra flags for every `run` (e.g. --backend cpu)
};

struct AbResults {
  nlohmann::json base, head;  // merged memtrade.results/1 documents
};

// Lists points with `BIN run --grid FILE --list` (one id per line), then for every round and
// point runs `BIN run --grid FILE --select ID --out FILE` for both binaries, base first on even
// (round + point index) and head first on odd ones. A run that leaves no readable file becomes
// an "error" point. Progress goes to `log`. Throws BadInput when a binary cannot list the grid.
AbResults run_ab(const AbOptions& options, std::FILE* log);

// Joins per-point results files of one side: points arrays concatenated, meta from the first;
// repeated ids (rounds) pool their time samples and keep the worst status and the largest peaks.
nlohmann::json merge_point_files(const std::vector<nlohmann::json>& docs);

}  // namespace memtrade
