#include "harness/common/stats.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>

namespace memtrade {

double quantile(std::span<const double> xs, double q) {
  if (xs.empty()) return std::nan("");
  std::vector<double> s(xs.begin(), xs.end());
  std::sort(s.begin(), s.end());
  const double pos = q * static_cast<double>(s.size() - 1);
  const auto lo = static_cast<std::size_t>(std::floor(pos));
  const std::size_t hi = std::min(lo + 1, s.size() - 1);
  return s[lo] + (pos - static_cast<double>(lo)) * (s[hi] - s[lo]);
}

double coefficient_of_variation(std::span<const double> xs) {
  if (xs.size() < 2) return 0;
  const double n = static_cast<double>(xs.size());
  const double mean = std::accumulate(xs.begin(), xs.end(), 0.0) / n;
  double ss = 0;
  for (double x : xs) ss += (x - mean) * (x - mean);
  return mean == 0 ? 0 : std::sqrt(ss / (n - 1)) / mean;
}

namespace {

// P(U <= u) under H0 for sample sizes m, n without ties: count the arrangements with a given U by
// the recurrence f(m, n, u) = f(m-1, n, u-n) + f(m, n-1, u) (the largest value belongs to x or
// to y). Doubles hold the counts exactly up to C(50, 25) ~ 1.3e14 < 2^53.
double exact_cdf(std::size_t m, std::size_t n, double u) {
  const std::size_t umax = m * n;
  // f[j][k]: arrangements of (i, j) values with U = k, rolled over i.
  std::vector<std::vector<double>> f(n + 1, std::vector<double>(umax + 1, 0.0));
  for (std::size_t j = 0; j <= n; ++j) f[j][0] = 1;  // i = 0: U is always 0
  for (std::size_t i = 1; i <= m; ++i) {
    std::vector<std::vector<double>> g(n + 1, std::vector<double>(umax + 1, 0.0));
    g[0][0] = 1;  // j = 0: U is always 0
    for (std::size_t j = 1; j <= n; ++j)
      for (std::size_t k = 0; k <= i * j; ++k) g[j][k] = (k >= j ? f[j][k - j] : 0.0) + g[j - 1][k];
    f = std::move(g);
  }
  double total = 0, below = 0;
  for (std::size_t k = 0; k <= umax; ++k) {
    total += f[n][k];
    if (static_cast<double>(k) <= u + 1e-9) below += f[n][k];
  }
  return below / total;
}

}  // namespace

MannWhitney mann_whitney(std::span<const double> x, std::span<const double> y, MwMethod method) {
  const std::size_t m = x.size(), n = y.size();
  if (m == 0 || n == 0) throw std::invalid_argument("mann_whitney: both samples need values");
  // Midranks of the pooled sample; tie groups also feed the variance correction.
  std::vector<std::pair<double, bool>> pooled;  // (value, from x)
  pooled.reserve(m + n);
  for (double v : x) pooled.emplace_back(v, true);
  for (double v : y) pooled.emplace_back(v, false);
  std::sort(pooled.begin(), pooled.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  double rank_sum_x = 0, tie_term = 0;
  bool ties = false;
  for (std::size_t i = 0; i < pooled.size();) {
    std::size_t j = i;
    while (j < pooled.size() && pooled[j].first == pooled[i].first) ++j;
    const double t = static_cast<double>(j - i);
    const double midrank = (static_cast<double>(i + 1) + static_cast<double>(j)) / 2;
    for (std::size_t k = i; k < j; ++k)
      if (pooled[k].second) rank_sum_x += midrank;
    if (t > 1) {
      ties = true;
      tie_term += t * t * t - t;
    }
    i = j;
  }
  const double dm = static_cast<double>(m), dn = static_cast<double>(n);
  MannWhitney r;
  r.u = rank_sum_x - dm * (dm + 1) / 2;
  r.all_tied = pooled.front().first == pooled.back().first;

  const bool small = m <= kExactMax && n <= kExactMax;
  if (method == MwMethod::exact && ties)
    throw std::invalid_argument("mann_whitney: the exact distribution assumes no ties");
  if (method == MwMethod::exact || (method == MwMethod::automatic && small && !ties)) {
    // Symmetric null distribution: the two-sided p doubles the smaller tail.
    const double lower = exact_cdf(m, n, r.u);
    const double upper = 1 - exact_cdf(m, n, r.u - 1);
    r.p = std::min(1.0, 2 * std::min(lower, upper));
    r.exact = true;
    return r;
  }
  const double big_n = dm + dn;
  const double var = dm * dn / 12 * ((big_n + 1) - tie_term / (big_n * (big_n - 1)));
  if (var <= 0) {  // everything tied: no evidence either way
    r.p = 1;
    return r;
  }
  const double z = std::max(0.0, std::abs(r.u - dm * dn / 2) - 0.5) / std::sqrt(var);
  r.p = std::min(1.0, std::erfc(z / std::sqrt(2.0)));
  return r;
}

namespace {

// The continued fraction of the regularized incomplete beta function I_x(a, b), by the modified
// Lentz method (converges fast for x < (a + 1) / (a + b + 2); the caller flips otherwise).
double beta_continued_fraction(double a, double b, double x) {
  constexpr double kTiny = 1e-300, kEps = 1e-15;
  double c = 1, d = 1 - (a + b) * x / (a + 1);
  d = 1 / (std::abs(d) < kTiny ? kTiny : d);
  double h = d;
  for (int m = 1; m <= 500; ++m) {
    const double md = m;
    for (int half = 0; half < 2; ++half) {
      const double num = half == 0
                             ? md * (b - md) * x / ((a + 2 * md - 1) * (a + 2 * md))
                             : -(a + md) * (a + b + md) * x / ((a + 2 * md) * (a + 2 * md + 1));
      d = 1 + num * d;
      d = 1 / (std::abs(d) < kTiny ? kTiny : d);
      c = 1 + num / c;
      if (std::abs(c) < kTiny) c = kTiny;
      h *= c * d;
      if (half == 1 && std::abs(c * d - 1) < kEps) return h;
    }
  }
  return h;
}

double regularized_beta(double a, double b, double x) {
  if (x <= 0) return 0;
  if (x >= 1) return 1;
  const double front = std::exp(std::lgamma(a + b) - std::lgamma(a) - std::lgamma(b) +
                                a * std::log(x) + b * std::log1p(-x));
  if (x < (a + 1) / (a + b + 2)) return front * beta_continued_fraction(a, b, x) / a;
  return 1 - front * beta_continued_fraction(b, a, 1 - x) / b;
}

}  // namespace

double student_t_two_sided(double t, double df) {
  if (!std::isfinite(t)) return 0;
  // P(|T| >= |t|) = I_{df / (df + t^2)}(df / 2, 1 / 2).
  return regularized_beta(df / 2, 0.5, df / (df + t * t));
}

double student_t_test(std::span<const double> x, std::span<const double> y) {
  if (x.size() < 2 || y.size() < 2)
    throw std::invalid_argument("student_t_test: two values a side");
  auto moments = [](std::span<const double> v) {
    const double n = static_cast<double>(v.size());
    const double mean = std::accumulate(v.begin(), v.end(), 0.0) / n;
    double ss = 0;
    for (double e : v) ss += (e - mean) * (e - mean);
    return std::pair{mean, ss};
  };
  const auto [mx, ssx] = moments(x);
  const auto [my, ssy] = moments(y);
  const double m = static_cast<double>(x.size()), n = static_cast<double>(y.size());
  const double df = m + n - 2;
  const double pooled = (ssx + ssy) / df;
  if (pooled == 0) return mx == my ? 1.0 : 0.0;
  const double t = (mx - my) / std::sqrt(pooled * (1 / m + 1 / n));
  return student_t_two_sided(t, df);
}

std::vector<double> benjamini_hochberg(std::span<const double> p) {
  const std::size_t m = p.size();
  std::vector<std::size_t> order(m);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return p[a] < p[b]; });
  std::vector<double> adj(m);
  double running = 1;
  // Step-up: walk from the largest p down, keeping the adjusted values monotone.
  for (std::size_t k = m; k-- > 0;) {
    const double scaled = p[order[k]] * static_cast<double>(m) / static_cast<double>(k + 1);
    running = std::min(running, scaled);
    adj[order[k]] = std::min(1.0, running);
  }
  return adj;
}

}  // namespace memtrade
