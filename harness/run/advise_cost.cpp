#include "harness/run/advise_cost.h"

#include <algorithm>
#include <cmath>

#include "models/config/knobs.h"

namespace memtrade {

CostInputs cost_inputs(const TrainConfig& cfg, const Model& model, const MemoryEstimate& e,
                       std::int64_t estimated_accumulation) {
  CostInputs in;
  in.accumulation = cfg.accumulation;
  in.rows = static_cast<double>(cfg.batch_size * model.rows_per_sample());
  RunOptions ro = RunOptions::from(cfg);
  const FlopCount f = model.flops(cfg.batch_size, ro);
  ro.checkpoint = Checkpoint{};
  const double own = model.flops(cfg.batch_size, ro).recompute;  // the attention kind's own
  in.flops = f.forward + f.backward;
  (cfg.checkpoint.kind == Checkpoint::Kind::selective ? in.flops_selective : in.flops_blocks) =
      f.recompute - own;
  in.copied_per_micro = static_cast<double>(e.copied_passes) /
                        static_cast<double>(std::max<std::int64_t>(1, estimated_accumulation));
  in.copied_per_step = static_cast<double>(e.copied_optimizer);
  in.params = static_cast<double>(model.num_params());
  in.reserved = static_cast<double>(e.peak_reserved);
  for (const Knob& k : knobs()) in.values.emplace_back(k.name, k.get(cfg));
  return in;
}

double CostModel::rate_at(double rows) const {
  if (rate.empty()) return 0;
  if (rows <= rate.front().first) return rate.front().second;
  if (rows >= rate.back().first) return rate.back().second;
  auto hi = std::lower_bound(rate.begin(), rate.end(), rows,
                             [](const auto& p, double r) { return p.first < r; });
  auto lo = hi - 1;
  const double w = std::log(rows / lo->first) / std::log(hi->first / lo->first);
  return lo->second + w * (hi->second - lo->second);
}

void CostModel::rate_never_falls() {
  for (std::size_t i = 1; i < rate.size(); ++i)
    rate[i].second = std::max(rate[i].second, rate[i - 1].second);
}

double CostModel::predict(const CostInputs& in) const {
  double ratio = 1, per_byte = 0, per_param = step_per_param, per_reserved = 0;
  for (const Term& t : terms)
    for (const auto& [axis, value] : in.values)
      if (t.axis == axis && t.value == value) {
        ratio *= t.ratio;
        per_byte += t.per_byte;
        per_param += t.per_param;
        per_reserved += t.per_reserved;
      }
  const double r = rate_at(in.rows);
  const double compute =
      r > 0 ? (in.flops + kappa_blocks * in.flops_blocks + kappa_selective * in.flops_selective) / r
            : 0.0;
  const double micro = ratio * compute + per_byte * in.copied_per_micro;
  const double step = per_param * in.params + per_reserved * in.reserved;
  return static_cast<double>(in.accumulation) * micro + step;
}

double CostModel::overlap(const Term& t) const {
  return 1.0 - t.per_byte * bandwidth;
}

nlohmann::json CostModel::to_json() const {
  nlohmann::json r = nlohmann::json::array();
  for (const auto& [rows, flops] : rate) r.push_back({{"rows", rows}, {"flops_per_s", flops}});
  nlohmann::json ts = nlohmann::json::array();
  for (const Term& t : terms) {
    nlohmann::json j = {{"axis", t.axis}, {"value", t.value}};
    const CostDriver d = knob(t.axis).cost;
    if (d == CostDriver::compute) j["ratio"] = t.ratio;
    if (d == CostDriver::copies) {
      j["seconds_per_byte"] = t.per_byte;
      if (bandwidth > 0 && t.per_byte > 0) j["overlap"] = overlap(t);
    }
    if (d == CostDriver::copies || d == CostDriver::params) j["seconds_per_param"] = t.per_param;
    if (d == CostDriver::reserved) j["seconds_per_reserved_byte"] = t.per_reserved;
    ts.push_back(std::move(j));
  }
  return {{"device", device},
          {"model", model},
          {"transferred", transferred},
          {"rate", r},
          {"step_seconds_per_param", step_per_param},
          {"kappa_blocks", kappa_blocks},
          {"kappa_selective", kappa_selective},
          {"bandwidth_bytes_per_s", bandwidth},
          {"terms", ts}};
}

CostModel fit_cost_model(const CalibrationSet& s) {
  CostModel m;
  const double t1 = s.plain1.seconds, t2 = s.plain2.seconds;
  // The second micro-batch of plain2 costs t2 − t1; what t1 has beyond one micro-batch is the
  // step's own part. That difference of two timings is noisy where the step's part is small, so
  // it is bounded by what keeps the curve's time per row from growing with the micro-batch
  // (larger GEMMs are not slower per row): for rows r_i < r_j, step ≤ (r_j·t_i − r_i·t_j) /
  // (r_j − r_i); and by [0, t1 / 2].
  double step0 = std::clamp(2 * t1 - t2, 0.0, t1 / 2);
  for (std::size_t i = 0; i < s.curve.size(); ++i)
    for (std::size_t j = 0; j < s.curve.size(); ++j) {
      const double ri = s.curve[i].in.rows, rj = s.curve[j].in.rows;
      if (ri < rj)
        step0 = std::min(
            step0, std::max(0.0, (rj * s.curve[i].seconds - ri * s.curve[j].seconds) / (rj - ri)));
    }
  const double params = std::max(1.0, s.plain1.in.params);
  m.step_per_param = step0 / params;
  for (const Measured& p : s.curve) {
    const double micro = p.seconds - step0 * p.in.params / params;
    if (micro > 0 && p.in.rows > 0) m.rate.emplace_back(p.in.rows, p.in.flops / micro);
  }
  std::sort(m.rate.begin(), m.rate.end());
  const double r0 = m.rate_at(s.plain1.in.rows);
  const double micro0 = t1 - step0;
  for (const CalibrationSet::Value& v : s.values) {
    const double d1 = v.a1.seconds - t1;
    const Knob& row = knob(v.axis);
    if (row.cost == CostDriver::recompute) {
      const double f = v.a1.in.flops_blocks + v.a1.in.flops_selective;
      if (f <= 0 || r0 <= 0) continue;
      const double kappa = std::max(0.0, d1 / (f / r0));
      (v.a1.in.flops_selective > 0 ? m.kappa_selective : m.kappa_blocks) = kappa;
      continue;
    }
    CostModel::Term t{v.axis, v.value};
    switch (row.cost) {
      case CostDriver::compute:
        t.ratio = micro0 > 0 ? (micro0 + d1) / micro0 : 1.0;
        break;
      case CostDriver::reserved:
        if (v.a1.in.reserved > 0) t.per_reserved = d1 / v.a1.in.reserved;
        break;
      case CostDriver::params:
        t.per_param = d1 / params;
        break;
      case CostDriver::copies: {
        // The cost goes where the value copies: per micro-batch (passes), per step (optimizer
        // phase), or, copying in both, per micro-batch what a second one adds beyond plain's.
        const double bytes = v.a1.in.copied_per_micro - s.plain1.in.copied_per_micro;
        const double step_bytes = v.a1.in.copied_per_step - s.plain1.in.copied_per_step;
        double per_micro = 0;
        if (bytes > 0) per_micro = step_bytes <= 0 ? d1 : v.a2 ? (v.a2->seconds - t2) - d1 : 0.0;
        if (bytes > 0) t.per_byte = per_micro / bytes;
        t.per_param = (d1 - per_micro) / params;
        break;
      }
      case CostDriver::structure:
      case CostDriver::recompute:
        continue;
    }
    if (row.only_costs) {
      t.per_byte = std::max(0.0, t.per_byte);
      t.per_param = std::max(0.0, t.per_param);
      t.per_reserved = std::max(0.0, t.per_reserved);
    }
    m.terms.push_back(t);
  }
  return m;
}

}  // namespace memtrade
