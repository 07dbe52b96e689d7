#include "harness/run/fit.h"

#include <map>

#include "harness/run/estimate.h"
#include "harness/run/point_child.h"

namespace memtrade {

nlohmann::json FitRow::to_json(std::size_t capacity) const {
  nlohmann::json row = {{"id", id},
                        {"config", config_json(config)},
                        {"max_batch", max_batch},
                        {"capacity", capacity},
                        {"confirmed", nullptr}};
  if (predicted_peak >= 0) row["predicted_peak"] = predicted_peak;
  if (time) row["time_model"] = time_model_json(*time);
  if (!confirmed_at.empty()) {
    row["confirmed"] = {{"at", confirmed_at}, {"above", above}};
    row["confirmed_ok"] = confirmed_ok();
  }
  return row;
}

std::vector<FitRow> fit_points(const std::vector<GridPoint>& points, const FitOptions& o) {
  std::map<std::string, TrainConfig> combos;
  for (const auto& p : points) {
    TrainConfig c = p.config;
    c.batch_size = 1;
    combos.emplace(point_id(c), c);
  }
  std::vector<FitRow> rows;
  for (const auto& [id, cfg] : combos) {
    FitRow row;
    row.id = id;
    row.config = cfg;
    row.max_batch = largest_fitting_batch(cfg, o.backend, o.capacity, o.max_batch);
    if (row.max_batch > 0) {
      TrainConfig c = cfg;
      c.batch_size = row.max_batch;
      const MemoryEstimate e = estimate_memory(c, o.backend, o.capacity, 1, 0, o.gpu);
      row.predicted_peak = e.peak_allocated;
      row.time = e.time;
    }
    if (o.confirm && row.max_batch > 0) {
      PointJob job;
      job.backend = o.backend_name;
      job.capacity = o.capacity;
      job.warmup = 1;
      job.steps = 1;
      job.threads = o.threads;
      job.point.config = cfg;
      job.point.config.batch_size = row.max_batch;
      job.point.id = point_id(job.point.config);
      row.confirmed_at = run_point_row(job).status;
      if (row.max_batch < o.max_batch) {
        job.point.config.batch_size = row.max_batch + 1;
        job.point.id = point_id(job.point.config);
        row.above = run_point_row(job).status;
      } else {
        row.above = std::string(1, '-');  // nothing above the search's limit to run
      }
    }
    rows.push_back(std::move(row));
  }
  return rows;
}

}  // namespace memtrade
