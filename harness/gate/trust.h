// Whether a two-file comparison may give a verdict at all (docs/design.md, "The gate"):
//
// - the environment guard: BASE and HEAD measured on different CPUs (model, thread count),
//   instruction-set paths, GPUs, drivers or library versions differ for reasons that are not the
//   code. A different machine is not a regression.
// - the machine's stability: on a shared machine a slow stretch lasts minutes and lifts every
//   step by 20–30%. Two runs made one after the other cannot tell that from a regression; the
//   samples show it: a run whose halves differ (drift within the run), or a time change that
//   every point shows alike between runs that did not overlap in time.
//
// Only the interleaved A/B (`compare --base-bin --head-bin`) can call a time regression on a
// shared machine: it alternates the builds point by point, so a slow stretch hits both.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "harness/gate/compare.h"

namespace memtrade {

// The facts of a results file's meta that decide its figures besides the code: "CPU",
// "threads" (from meta.device), "backend", "GPU" (the CUDA device), and the library versions
// that are not memtrade itself ("CPU kernels", "OpenBLAS", "CUDA driver", "cuBLAS", ...).
std::map<std::string, std::string> environment_of(const nlohmann::json& meta);

// "CPU 'AMD EPYC' vs 'Intel(R) Xeon(R) Processor'", one per fact known on both sides that
// differs (a fact one side does not record is not a difference: older files lack some).
std::vector<std::string> environment_differences(const nlohmann::json& base_meta,
                                                 const nlohmann::json& head_meta);

// Rows of a comparison whose time verdict the machine's stability cannot carry, and why: the
// time regressions (and improvements) of points whose base or head samples drift between their
// halves, or all of them when every judged point moved alike between runs that did not overlap.
struct Instability {
  std::vector<std::string> reasons;  // for the report: what was seen
  bool unstable() const { return !reasons.empty(); }
};
Instability machine_instability(const Comparison& c, const ResultSet& base, const ResultSet& head);

}  // namespace memtrade
