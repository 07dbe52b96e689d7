#include "harness/gate/compare.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>

#include "harness/common/bad_input.h"
#include "harness/common/point_row.h"
#include "harness/common/stats.h"

namespace memtrade {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

std::string unit_of(const std::string& metric) {
  if (metric.starts_with("peak_") || metric == "predicted_peak") return "bytes";
  if (metric.ends_with("_s") || metric == "real_time" || metric == "cpu_time") {
    return metric.ends_with("per_s") ? "1/s" : "s";
  }
  return "";
}

double relative_change(double base, double head) {
  if (base == head) return 0;
  if (base == 0)
    return head > 0 ? std::numeric_limits<double>::infinity()
                    : -std::numeric_limits<double>::infinity();
  return head / base - 1;
}

bool is_failure(const std::string& s) {
  return s == "oom" || s == "error" || s == "timeout";
}

CompareRow status_row(const PointData& b, const PointData& h) {
  CompareRow r;
  r.point = h.id;
  r.metric = "status";
  r.base = r.head = kNaN;
  r.base_status = b.status;
  r.head_status = h.status;
  if (b.status == h.status) {
    r.verdict = Verdict::unchanged;
    r.note = fmt::format("{} on both sides", b.status);
  } else if (b.status == "ok" && is_failure(h.status)) {
    r.verdict = Verdict::regression;
    r.note = fmt::format("status {} -> {}", b.status, h.status);
  } else if (b.status != "ok" && h.status == "ok") {
    r.verdict = Verdict::improvement;
    r.note = fmt::format("status {} -> {}", b.status, h.status);
  } else {
    r.verdict = Verdict::changed;
    r.note = fmt::format("status {} -> {}", b.status, h.status);
  }
  return r;
}

void judge_threshold(CompareRow& r) {
  const MetricRule& rule = r.rule;
  const double margin = std::abs(r.base) * rule.rel + rule.abs;
  const double worse = rule.higher_is_better ? r.base - r.head : r.head - r.base;
  if (worse > margin) {
    r.verdict = Verdict::regression;
  } else if (-worse > margin) {
    r.verdict = Verdict::improvement;
  } else {
    r.verdict = Verdict::unchanged;
  }
  if (r.verdict != Verdict::unchanged || r.head != r.base)
    r.note = fmt::format("tolerance rel {:g} + abs {:g}", rule.rel, rule.abs);
}

// Before correction: sample-size and all-tied checks, then the raw two-sided p-value.
void test_statistical(CompareRow& r, const MetricValue& b, const MetricValue& h) {
  r.n_base = b.samples.size();
  r.n_head = h.samples.size();
  const auto need = static_cast<std::size_t>(std::max(2, r.rule.min_samples));
  if (r.n_base < need || r.n_head < need) {
    r.verdict = Verdict::inconclusive;
    r.note = fmt::format("too few samples ({} vs {}, need {} per side)", r.n_base, r.n_head, need);
    return;
  }
  const MannWhitney mw = mann_whitney(b.samples, h.samples);
  if (mw.all_tied) {
    r.verdict = Verdict::inconclusive;
    r.note = "every sample identical on both sides: no rank information";
    return;
  }
  r.p = mw.p;
}

// After correction: significance and effect size must agree.
void judge_statistical(CompareRow& r) {
  if (!r.p_adj) return;
  const MetricRule& rule = r.rule;
  const double bad_change = rule.higher_is_better ? -r.change : r.change;
  const bool significant = *r.p_adj < rule.alpha;
  if (significant && bad_change > rule.min_effect) {
    r.verdict = Verdict::regression;
  } else if (significant && -bad_change > rule.min_effect) {
    r.verdict = Verdict::improvement;
  } else {
    r.verdict = Verdict::unchanged;
    if (significant)
      r.note = fmt::format("significant but below the {:g}% minimum effect", rule.min_effect * 100);
  }
}

}  // namespace

const char* verdict_name(Verdict v) {
  switch (v) {
    case Verdict::unchanged:
      return "unchanged";
    case Verdict::regression:
      return "regression";
    case Verdict::improvement:
      return "improvement";
    case Verdict::inconclusive:
      return "inconclusive";
    case Verdict::changed:
      return "changed";
  }
  return "?";
}

std::size_t Comparison::count(Verdict v) const {
  std::size_t n = 0;
  for (const auto& r : rows) n += r.verdict == v;
  return n;
}

std::size_t Comparison::gated_regressions() const {
  std::size_t n = 0;
  for (const auto& r : rows) n += r.verdict == Verdict::regression && r.gated();
  return n;
}

int Comparison::exit_code() const {
  if (gated_regressions() > 0 || removed_fails()) return 1;
  if (rules.fail_on_inconclusive)
    for (const auto& r : rows)
      if (r.verdict == Verdict::inconclusive && r.gated()) return 1;
  return 0;
}

Comparison compare_results(const ResultSet& base, const ResultSet& head,
                           const Thresholds& thresholds, const GateRules& rules) {
  Comparison c;
  c.base_label = base.label;
  c.head_label = head.label;
  c.base_meta = base.meta;
  c.head_meta = head.meta;
  c.rules = rules;
  // Base points under the id HEAD should have them as: renamed where a rename says so.
  std::map<std::string, const PointData*> base_by_id;
  std::map<std::string, std::string> original;  // head-side id -> base id
  for (const auto& p : base.points) {
    auto r = rules.renames.find(p.id);
    const std::string id = r == rules.renames.end() ? p.id : r->second;
    if (!base_by_id.emplace(id, &p).second)
      throw BadInput(fmt::format("{}: two base points map to the head id {} (check the renames)",
                                 base.label, id));
    original[id] = p.id;
  }
  for (const auto& [from, to] : rules.renames)
    if (std::none_of(base.points.begin(), base.points.end(),
                     [&](const PointData& p) { return p.id == from; }))
      throw BadInput(
          fmt::format("rename {} -> {}: {} has no point {}", from, to, base.label, from));
  std::set<std::string> head_ids;
  std::vector<std::size_t> tested;  // rows with a raw p-value, for the correction

  for (const auto& h : head.points) {
    head_ids.insert(h.id);
    auto it = base_by_id.find(h.id);
    if (it == base_by_id.end()) {
      c.added.push_back(h.id);
      continue;
    }
    const PointData& b = *it->second;
    ++c.matched;
    if (original[h.id] != h.id) c.renamed.emplace_back(original[h.id], h.id);
    if (b.status != h.status || b.status != "ok") {
      c.rows.push_back(status_row(b, h));
      continue;
    }
    for (const auto& [name, hv] : h.metrics) {
      auto bm = b.metrics.find(name);
      if (bm == b.metrics.end()) continue;  // not measured on the base side: nothing to judge
      CompareRow r;
      r.point = h.id;
      r.metric = name;
      r.unit = unit_of(name);
      r.base_status = r.head_status = "ok";
      r.base = bm->second.value;
      r.head = hv.value;
      r.change = relative_change(r.base, r.head);
      r.rule = thresholds.rule(name, h.config);
      if (r.rule.kind == MetricRule::Kind::threshold) {
        judge_threshold(r);
      } else {
        r.statistical = true;
        test_statistical(r, bm->second, hv);
        if (r.p) tested.push_back(c.rows.size());
      }
      c.rows.push_back(std::move(r));
    }
  }
  for (const auto& [id, b] : base_by_id)
    if (!head_ids.contains(id)) c.removed.push_back(b->id);
  if (c.matched == 0)
    throw BadInput(
        fmt::format("nothing to judge: no point of {} ({} points) is in {} ({} points){}",
                    head.label, head.points.size(), base.label, base.points.size(),
                    head.points.empty() ? "" : " (different grids? renamed ids? see --rename)"));

  // One Benjamini-Hochberg family: every tested time/throughput metric of every point.
  std::vector<double> raw;
  for (std::size_t i : tested) raw.push_back(*c.rows[i].p);
  const std::vector<double> adj = benjamini_hochberg(raw);
  for (std::size_t k = 0; k < tested.size(); ++k) {
    CompareRow& r = c.rows[tested[k]];
    r.p_adj = adj[k];
    judge_statistical(r);
  }
  return c;
}

std::map<std::string, std::string> load_rename_map(const std::string& path) {
  const nlohmann::json doc = read_json_file(path);
  if (!doc.is_object())
    throw BadInput(
        fmt::format("{}: a rename map is a JSON object {{\"old id\": \"new id\"}}", path));
  std::map<std::string, std::string> out;
  for (const auto& [from, to] : doc.items()) {
    if (!to.is_string())
      throw BadInput(fmt::format("{}: the new id of {} must be a string", path, from));
    out[from] = to.get<std::string>();
  }
  return out;
}

}  // namespace memtrade
