// Change points of one point's nightly series (docs/design.md, "The gate over history"): where a
// metric's level moved and stayed moved, as MongoDB's and Apache Otava's E-divisive means finds
// it, for `memtrade history changes`.
//
// Method (Matteson & James 2014, with Otava's t-test significance, Fleming et al. 2023):
//   1. split: in a segment, the candidate is the index that maximises the energy statistic
//      q̂(τ) = m·k/(m+k) · (2/(m·k)·Σ|x_i − y_j| − Σ|x_i − x_i'|/C(m,2) − Σ|y_j − y_j'|/C(k,2))
//      (α = 1; x the m values before τ, y the k after). It is kept when Student's t-test (pooled)
//      between the two sides gives p below 10 × max_p (the first, weak pass), and both sides are
//      searched again.
//   2. merge: each kept candidate is tested again between its neighbours; the weakest (highest
//      p, then smallest effect) is dropped while it fails max_p or min_effect, and its neighbours
//      are tested anew, until every change passes both.
// Each side of a change holds at least min_runs values, so a change persists for ≥ min_runs runs
// and a one-night blip is none. Exact metrics (memory on the CPU: every run gives the same
// bytes) skip the statistics: any level that differs from the one before and holds for min_runs
// runs is a change.
#pragma once

#include <cstddef>
#include <span>
#include <vector>

namespace memtrade {

struct ChangeOptions {
  double max_p = 0.001;      // Otava's default significance
  double min_effect = 0.0;   // |after − before| / |before| a change must reach
  std::size_t min_runs = 2;  // values each side of a change (persistence)
  bool exact = false;        // a deterministic metric: level changes, no statistics
};

struct Change {
  std::size_t index = 0;         // the first run of the new level
  double before = 0, after = 0;  // means of the segments either side (exact: the levels)
  double relative = 0;           // (after − before) / |before|
  double p = 0;                  // Student's t-test (pooled) between the segments (exact: 0)
};

// The changes of `series` (in run order), in index order.
std::vector<Change> find_changes(std::span<const double> series, const ChangeOptions& options);

// The energy statistic q̂ of splitting [0, n) at every τ in [lo, hi): O(n²) with running sums.
std::vector<double> energy_statistic(std::span<const double> series, std::size_t lo,
                                     std::size_t hi);

}  // namespace memtrade
