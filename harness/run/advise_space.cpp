#include "harness/run/advise_space.h"

#include <algorithm>
#include <functional>
#include <map>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "harness/common/bad_input.h"
#include "kernels/dtype.h"
#include "models/config/input_text.h"
#include "models/model.h"

namespace memtrade {
namespace {

std::vector<std::string> names_with(AdviseRole role) {
  std::vector<std::string> out;
  for (const Knob& k : knobs())
    if (k.advise == role) out.push_back(k.name);
  return out;
}

bool contains(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

std::vector<std::string> divisors(int n, int at_most) {
  std::vector<std::string> out;
  for (int d = 1; d <= std::min(n, at_most); ++d)
    if (n % d == 0) out.push_back(std::to_string(d));
  return out;
}

// The values ParallelSearch tries for one of its rows (empty: not one of them).
std::vector<std::string> parallel_values(const Knob& k, const ParallelSearch& p) {
  if (p.gpus <= 1 || !contains(parallel_axes(), k.name)) return {};
  if (k.name == "tensor_parallel") return divisors(p.gpus, p.max_tp);
  if (k.name == "data_parallel") {  // dp = N / tp for the tp values above
    std::vector<std::string> out;
    for (const std::string& tp : divisors(p.gpus, p.max_tp))
      out.push_back(std::to_string(p.gpus / std::stoi(tp)));
    return out;
  }
  return k.choices();  // every sharding stage; sequence parallelism off and on
}

}  // namespace

const std::vector<std::string>& parallel_axes() {
  static const std::vector<std::string> axes = {"data_parallel", "sharding", "tensor_parallel",
                                                "sequence_parallel"};
  return axes;
}

AdviseSpace advise_space(const TrainConfig& start, const std::vector<std::string>& allow,
                         const std::vector<std::string>& hold, Backend backend,
                         const ParallelSearch& parallel) {
  if (start.mode != Mode::train)
    throw BadInput(fmt::format("advise: mode {} is not training; advise keeps a training step",
                               mode_name(start.mode)));
  for (const std::string& name : allow) {
    const Knob* k = find_knob(name);
    if (k == nullptr || k->advise != AdviseRole::allow)
      throw BadInput(fmt::format(
          "--allow: '{}' {} (--allow opens the axes that change the training: {})", echo(name),
          k == nullptr                    ? "is not an axis"
          : k->advise == AdviseRole::turn ? "is turned without --allow"
                                          : "is never changed by advise",
          fmt::join(names_with(AdviseRole::allow), ", ")));
  }
  std::vector<std::string> holdable = names_with(AdviseRole::turn);
  if (parallel.gpus > 1)
    holdable.insert(holdable.end(), parallel_axes().begin(), parallel_axes().end());
  for (const std::string& name : hold) {
    const Knob* k = find_knob(name);
    if (k == nullptr || (k->advise == AdviseRole::keep && !contains(holdable, k->name)))
      throw BadInput(fmt::format("--hold: '{}' is not an axis advise turns ({})", echo(name),
                                 fmt::join(holdable, ", ")));
  }

  AdviseSpace space;
  space.start = start;
  space.global_batch = samples_per_step(start);
  space.allowed = allow;
  std::vector<const Knob*> rows;
  for (const Knob& k : knobs()) {
    const bool open = k.advise == AdviseRole::turn ||
                      (k.advise == AdviseRole::allow && contains(allow, k.name)) ||
                      !parallel_values(k, parallel).empty();
    if (open && !contains(hold, k.name)) rows.push_back(&k);
  }
  for (const Knob* k : rows) space.axes.push_back(k->name);

  // Depth-first over the rows in table order, so that a row's `applies` sees the rows before it.
  std::set<std::string> seen;
  TrainConfig c = start;
  std::function<void(std::size_t)> walk = [&](std::size_t i) {
    if (i == rows.size()) {
      if (samples_per_step(c) != space.global_batch) return;
      if (parallel.gpus > 1 && c.data_parallel * c.tensor_parallel != parallel.gpus) return;
      if (backend != Backend::cuda && needs_cuda(c)) return;
      TrainConfig r = c;
      try {
        resolve_config(r);
      } catch (const KnobError&) {
        return;  // a combination the rows refuse
      }
      if (seen.insert(point_id(r)).second) space.configs.push_back(r);
      return;
    }
    const Knob& k = *rows[i];
    const std::string keep = k.get(c);
    if (!k.applies(c)) {
      walk(i + 1);
      return;
    }
    std::vector<std::string> values = parallel_values(k, parallel);
    if (values.empty()) values = k.advise_values(start);
    for (const std::string& v : values) {
      if (k.set(c, v)) continue;  // a value the row refuses for this config
      walk(i + 1);
    }
    set_knob(c, k, keep);
  };
  walk(0);
  return space;
}

std::int64_t least_param_bytes(const AdviseSpace& space) {
  const auto model = make_model(space.start);
  std::map<int, std::int64_t> by_block;  // block -> elements; -1: outside the blocks
  for (const ParamSpec& p : model->params()) by_block[p.block] += shape_numel(p.shape);
  std::int64_t largest = 0;
  for (const auto& [block, n] : by_block)
    if (block >= 0) largest = std::max(largest, n);
  std::size_t narrowest = dtype_size(compute_dtype(space.start.precision));
  std::int64_t split = 1;
  for (const TrainConfig& c : space.configs) {
    narrowest = std::min(narrowest, dtype_size(compute_dtype(c.precision)));
    split =
        std::max(split, c.tensor_parallel * (c.sharding == Sharding::zero3 ? c.data_parallel : 1));
  }
  return (by_block[-1] + largest) * static_cast<std::int64_t>(narrowest) / split;
}

TrainConfig plain_config(const TrainConfig& start) {
  TrainConfig p = start;
  const TrainConfig defaults;
  for (const Knob& k : knobs())
    if (k.advise == AdviseRole::turn && k.cost != CostDriver::structure)
      set_knob(p, k, k.get(defaults));
  resolve_config(p);
  return p;
}

std::vector<std::pair<std::string, std::string>> priced_values(const AdviseSpace& space) {
  const TrainConfig plain = plain_config(space.start);
  std::vector<std::pair<std::string, std::string>> out;
  for (const std::string& axis : space.axes) {
    const Knob& k = knob(axis);
    if (k.cost == CostDriver::structure) continue;  // priced by the step's shape
    std::set<std::string> values;
    for (const TrainConfig& c : space.configs)
      if (k.applies(c)) values.insert(k.get(c));
    values.erase(k.get(plain));
    for (const std::string& v : values) out.emplace_back(axis, v);
  }
  return out;
}

std::vector<std::vector<std::string>> turned_groups(const TrainConfig& from, const TrainConfig& to,
                                                    bool keep_gpus) {
  std::vector<std::vector<std::string>> out;
  std::vector<std::string> coupled;  // reverting one alone would change the samples per step
  const auto gpus = [](const TrainConfig& c) { return c.data_parallel * c.tensor_parallel; };
  for (const Knob& k : knobs()) {
    if (k.get(from) == k.get(to)) continue;
    TrainConfig alone = to;
    set_knob(alone, k, k.get(from));
    if (samples_per_step(alone) != samples_per_step(to) || (keep_gpus && gpus(alone) != gpus(to)))
      coupled.push_back(k.name);
    else
      out.push_back({k.name});
  }
  if (!coupled.empty()) out.insert(out.begin(), coupled);
  return out;
}

}  // namespace memtrade
