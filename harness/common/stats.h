// Statistics for the regression gate: order statistics of per-step samples, the Mann-Whitney U
// rank test (exact for small tie-free samples, normal approximation otherwise) and the
// Benjamini-Hochberg correction across the many tests of one comparison.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <vector>

namespace memtrade {

// Linear-interpolated quantile (q in [0,1]) of unsorted samples; NaN when empty.
double quantile(std::span<const double> xs, double q);
inline double median(std::span<const double> xs) {
  return quantile(xs, 0.5);
}
// Coefficient of variation (sample stddev / mean); 0 for fewer than two samples.
double coefficient_of_variation(std::span<const double> xs);

struct MannWhitney {
  double u = 0;           // U statistic of the first sample (count of pairs x > y, ties 1/2)
  double p = 1;           // two-sided p-value
  bool exact = false;     // exact null distribution (no ties, small n) vs normal approximation
  bool all_tied = false;  // every value equal: no rank information at all
};

enum class MwMethod { automatic, exact, normal };

// Two-sided Mann-Whitney U test of x vs y. automatic: exact when there are no ties and both
// samples have at most kExactMax values, else the normal approximation with tie-corrected
// variance and a continuity correction of 1/2. Requesting exact with ties throws.
inline constexpr std::size_t kExactMax = 25;
MannWhitney mann_whitney(std::span<const double> x, std::span<const double> y,
                         MwMethod method = MwMethod::automatic);

// Student's two-sided t-test of the means of x and y with the pooled variance (df = m + n - 2):
// the p-value. Pooled, not Welch: a short segment (2 runs after a change) estimates its own
// variance badly, and Welch's test then finds changes in noise; the pooled estimate leans on
// the longer side (as Otava's test does). Both need two values; with no spread at all the
// means decide alone (p 0 when they differ, 1 when equal).
double student_t_test(std::span<const double> x, std::span<const double> y);
// P(|T| >= |t|) for Student's t with df degrees of freedom (df > 0, fractional allowed).
double student_t_two_sided(double t, double df);

// Benjamini-Hochberg step-up adjusted p-values (same order as the input): p_adj[i] <= alpha
// rejects hypothesis i while keeping the false discovery rate at alpha.
std::vector<double> benjamini_hochberg(std::span<const double> p);

}  // namespace memtrade
