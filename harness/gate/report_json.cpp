// JSON reporter, schema "memtrade.compare/1": everything a script needs, nothing to re-derive.
#include <cmath>
#include <nlohmann/json.hpp>

#include "harness/gate/compare_report.h"

namespace memtrade {

std::string report_json(const Comparison& c) {
  using nlohmann::json;
  auto number = [](double v) { return std::isfinite(v) ? json(v) : json(nullptr); };
  json rows = json::array();
  for (const auto& r : c.rows) {
    json j = {{"point", r.point},
              {"metric", r.metric},
              {"unit", r.unit},
              {"verdict", verdict_name(r.verdict)},
              {"gated", r.gated()},
              {"base", number(r.base)},
              {"head", number(r.head)},
              {"change", r.metric == "status" ? json(nullptr) : number(r.change)},
              {"base_status", r.base_status},
              {"head_status", r.head_status},
              {"p", r.p ? json(*r.p) : json(nullptr)},
              {"p_adj", r.p_adj ? json(*r.p_adj) : json(nullptr)},
              {"note", r.note}};
    if (r.metric != "status") {
      if (r.statistical) {
        j["test"] = {{"kind", "mann-whitney-u"},
                     {"n_base", r.n_base},
                     {"n_head", r.n_head},
                     {"alpha", r.rule.alpha},
                     {"min_effect", r.rule.min_effect}};
      } else {
        j["test"] = {{"kind", "threshold"}, {"rel", r.rule.rel}, {"abs", r.rule.abs}};
      }
      j["better"] = r.rule.higher_is_better ? "higher" : "lower";
    }
    rows.push_back(std::move(j));
  }
  json doc = {{"schema", "memtrade.compare/1"},
              {"base", {{"label", c.base_label}, {"commit", detail::commit_of(c.base_meta)}}},
              {"head", {{"label", c.head_label}, {"commit", detail::commit_of(c.head_meta)}}},
              {"summary",
               {{"exit_code", c.exit_code()},
                {"regressions", c.count(Verdict::regression)},
                {"gated_regressions", c.gated_regressions()},
                {"improvements", c.count(Verdict::improvement)},
                {"inconclusive", c.count(Verdict::inconclusive)},
                {"unchanged", c.count(Verdict::unchanged)},
                {"changed", c.count(Verdict::changed)},
                {"matched", c.matched},
                {"added", c.added.size()},
                {"removed", c.removed.size()},
                {"removed_fails", c.removed_fails()}}},
              {"results", std::move(rows)},
              {"added", c.added},
              {"removed", c.removed},
              {"renamed", c.renamed}};
  return doc.dump(2) + "\n";
}

}  // namespace memtrade
