#include "harness/gate/change_points.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "harness/common/stats.h"

namespace memtrade {
namespace {

double mean_of(std::span<const double> v) {
  return std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
}

// Change `index` judged between the segments [lo, index) and [index, hi).
Change judge(std::span<const double> s, std::size_t lo, std::size_t index, std::size_t hi) {
  const auto left = s.subspan(lo, index - lo), right = s.subspan(index, hi - index);
  Change c;
  c.index = index;
  c.before = mean_of(left);
  c.after = mean_of(right);
  c.relative =
      c.before == 0 ? (c.after == 0 ? 0 : INFINITY) : (c.after - c.before) / std::abs(c.before);
  c.p = student_t_test(left, right);
  return c;
}

void split(std::span<const double> s, std::size_t lo, std::size_t hi, const ChangeOptions& o,
           double weak_p, std::vector<std::size_t>& found) {
  if (hi - lo < 2 * o.min_runs) return;
  const auto seg = s.subspan(lo, hi - lo);
  const std::vector<double> q = energy_statistic(seg, o.min_runs, seg.size() - o.min_runs + 1);
  const auto best = std::max_element(q.begin(), q.end());
  if (best == q.end() || !(*best > 0)) return;
  const std::size_t tau = lo + o.min_runs + static_cast<std::size_t>(best - q.begin());
  if (judge(s, lo, tau, hi).p >= weak_p) return;
  found.push_back(tau);
  split(s, lo, tau, o, weak_p, found);
  split(s, tau, hi, o, weak_p, found);
}

std::vector<Change> exact_changes(std::span<const double> s, const ChangeOptions& o) {
  std::vector<Change> out;
  double level = s[0];
  for (std::size_t i = 1; i + o.min_runs <= s.size(); ++i) {
    if (s[i] == level) continue;
    // A new level: it must hold for min_runs runs, else it is a blip.
    if (!std::all_of(s.begin() + static_cast<std::ptrdiff_t>(i),
                     s.begin() + static_cast<std::ptrdiff_t>(i + o.min_runs),
                     [&](double v) { return v == s[i]; }))
      continue;
    Change c;
    c.index = i;
    c.before = level;
    c.after = s[i];
    c.relative = level == 0 ? INFINITY : (s[i] - level) / std::abs(level);
    if (std::abs(c.relative) >= o.min_effect) out.push_back(c);
    level = s[i];
  }
  return out;
}

}  // namespace

std::vector<double> energy_statistic(std::span<const double> s, std::size_t lo, std::size_t hi) {
  const std::size_t n = s.size();
  // within[τ]: Σ_{i<i'<τ} |x_i − x_i'| (the prefix); within_suffix[τ]: the same over [τ, n).
  std::vector<double> within(n + 1, 0.0), within_suffix(n + 1, 0.0);
  for (std::size_t t = 1; t <= n; ++t) {
    double add = 0;
    for (std::size_t i = 0; i + 1 < t; ++i) add += std::abs(s[t - 1] - s[i]);
    within[t] = within[t - 1] + add;
  }
  for (std::size_t t = n; t-- > 0;) {
    double add = 0;
    for (std::size_t j = t + 1; j < n; ++j) add += std::abs(s[t] - s[j]);
    within_suffix[t] = within_suffix[t + 1] + add;
  }
  std::vector<double> q;
  for (std::size_t tau = lo; tau < hi; ++tau) {
    const double m = static_cast<double>(tau), k = static_cast<double>(n - tau);
    if (m < 2 || k < 2) {
      q.push_back(0);
      continue;
    }
    // All pairs = within the prefix + within the suffix + between them.
    const double between = within[n] - within[tau] - within_suffix[tau];
    const double e = 2 * between / (m * k) - within[tau] / (m * (m - 1) / 2) -
                     within_suffix[tau] / (k * (k - 1) / 2);
    q.push_back(m * k / (m + k) * e);
  }
  return q;
}

std::vector<Change> find_changes(std::span<const double> s, const ChangeOptions& o) {
  if (s.size() < 2 * std::max<std::size_t>(o.min_runs, 2)) return {};
  ChangeOptions opt = o;
  opt.min_runs = std::max<std::size_t>(o.min_runs, 2);  // a t-test needs two values a side
  if (o.exact) return exact_changes(s, opt);
  std::vector<std::size_t> at;
  split(s, 0, s.size(), opt, std::min(1.0, 10 * o.max_p), at);
  std::sort(at.begin(), at.end());
  // Merge: test each against its neighbours, drop the weakest while one fails.
  for (;;) {
    std::vector<Change> cs;
    for (std::size_t i = 0; i < at.size(); ++i)
      cs.push_back(
          judge(s, i == 0 ? 0 : at[i - 1], at[i], i + 1 == at.size() ? s.size() : at[i + 1]));
    if (cs.empty()) return cs;
    const auto weakest_p = std::max_element(
        cs.begin(), cs.end(), [](const Change& a, const Change& b) { return a.p < b.p; });
    auto drop = cs.end();
    if (weakest_p->p >= o.max_p) {
      drop = weakest_p;
    } else {
      const auto smallest =
          std::min_element(cs.begin(), cs.end(), [](const Change& a, const Change& b) {
            return std::abs(a.relative) < std::abs(b.relative);
          });
      if (std::abs(smallest->relative) < o.min_effect) drop = smallest;
    }
    if (drop == cs.end()) return cs;
    at.erase(at.begin() + (drop - cs.begin()));
  }
}

}  // namespace memtrade
