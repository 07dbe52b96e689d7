#include "harness/run/grid.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <toml++/toml.h>

#include "harness/common/bad_input.h"
#include "kernels/allocator.h"
#include "models/config/input_text.h"
#include "models/model.h"
#include "models/model_desc.h"

namespace memtrade {
namespace {

// One axis value as text in its contract spelling ("8", "bf16", "0.5", "sqrt").
using AxisValues = std::map<std::string, std::vector<std::string>>;

class GridError {
 public:
  explicit GridError(const std::string& source) : source_(echo(source, kEchoPathMax)) {}
  [[noreturn]] void fail(const toml::node* where, const std::string& what) const {
    if (where != nullptr && where->source().begin.line > 0)
      throw BadInput(fmt::format("{}:{}: {}", source_, where->source().begin.line, what));
    throw BadInput(fmt::format("{}: {}", source_, what));
  }

 private:
  std::string source_;
};

// The models the grid's model and model_config values resolve to, each resolved once: a value
// given again and every point of it start from its description (models/model_desc.h).
class ResolvedModels {
 public:
  // The model of these values (nullptr: not resolved yet).
  std::shared_ptr<const ModelDesc> find(const std::string& model,
                                        const std::string& model_config) const {
    for (const auto& d : descs_)
      if (model_config.empty() ? d->model_config.empty() && d->model == model
                               : d->model_config == model_config)
        return d;
    return nullptr;
  }
  void keep(std::shared_ptr<const ModelDesc> d) {
    if (d && !find(d->model, d->model_config)) descs_.push_back(std::move(d));
  }

 private:
  std::vector<std::shared_ptr<const ModelDesc>> descs_;
};

// One TOML value of `axis` as canonical text, validated by the axis's row of the knob table.
std::string axis_value(const GridError& err, const std::string& axis, const toml::node& v,
                       ResolvedModels& models) {
  const Knob& k = knob(axis);
  std::string text;
  if (v.is_integer() && k.type != KnobType::text) {
    text = std::to_string(*v.value<std::int64_t>());
  } else if (v.is_floating_point() && k.type == KnobType::density) {
    text = fmt::format("{}", *v.value<double>());
  } else if (v.is_string() && k.type != KnobType::integer) {
    text = *v.value<std::string>();
  } else {
    err.fail(&v, fmt::format("axes.{}: expected {}", axis,
                             k.type == KnobType::integer ? "a positive integer"
                             : k.type == KnobType::density
                                 ? "a density in [0, 1], \"sqrt\" or \"selective\""
                                 : "a string"));
  }
  TrainConfig scratch;
  if (axis == "model") scratch.model_desc = models.find(text, "");
  if (axis == "model_config" && !text.empty()) scratch.model_desc = models.find("", text);
  if (auto problem = k.set(scratch, text)) err.fail(&v, fmt::format("axes.{}: {}", axis, *problem));
  models.keep(scratch.model_desc);
  return k.get(scratch);
}

std::vector<std::string> axis_values(const GridError& err, const std::string& axis,
                                     const toml::node& node, ResolvedModels& models) {
  std::vector<std::string> out;
  if (const auto* arr = node.as_array()) {
    if (arr->empty()) err.fail(&node, fmt::format("axes.{}: empty list", axis));
    for (const auto& v : *arr) {
      std::string s = axis_value(err, axis, v, models);
      if (std::find(out.begin(), out.end(), s) == out.end()) out.push_back(s);
    }
  } else {
    out.push_back(axis_value(err, axis, node, models));
  }
  return out;
}

// A grid point. An axis that does not apply to the point's model (seq_len of an MLP) takes its
// default, so `model = [gpt, mlp] x seq_len = [...]` varies seq_len of the GPT only (the MLP's
// duplicates collapse into one point by id).
TrainConfig config_from_values(const GridError& err,
                               const std::map<std::string, std::string>& values, std::uint64_t seed,
                               const ResolvedModels& models) {
  TrainConfig c;
  auto value_of = [&](const char* axis) {
    const auto it = values.find(axis);
    return it == values.end() ? knob(axis).default_text() : it->second;
  };
  c.model_desc = models.find(value_of("model"), value_of("model_config"));
  for (const auto& [axis, value] : values) set_knob(c, knob(axis), value);
  for (const Knob& k : knobs())
    if (!k.applies(c)) set_knob(c, k, k.default_text());
  c.seed = seed;
  try {
    resolve_config(c);
  } catch (const KnobError& e) {
    err.fail(nullptr, e.what());
  }
  return c;
}

// A filter table ([[exclude]] / [[where]]): axis -> accepted values, plus an optional backend.
struct Filter {
  AxisValues axes;
  std::vector<std::string> backends;
  bool matches(const std::map<std::string, std::string>& point, const std::string& backend) const {
    for (const auto& [axis, values] : axes) {
      auto it = point.find(axis);
      if (it == point.end() || std::find(values.begin(), values.end(), it->second) == values.end())
        return false;
    }
    if (!backends.empty() && std::find(backends.begin(), backends.end(), backend) == backends.end())
      return false;
    return true;
  }
};

std::vector<Filter> parse_filters(const GridError& err, const toml::table& root, const char* key,
                                  ResolvedModels& models) {
  std::vector<Filter> out;
  const toml::node* node = root.get(key);
  if (node == nullptr) return out;
  const auto* arr = node->as_array();
  if (arr == nullptr) err.fail(node, fmt::format("{}: expected [[{}]] tables", key, key));
  for (const auto& item : *arr) {
    const auto* tbl = item.as_table();
    if (tbl == nullptr) err.fail(&item, fmt::format("{}: expected a table", key));
    Filter f;
    for (const auto& [k, v] : *tbl) {
      std::string name(k.str());
      if (name == "backend") {
        if (const auto* a = v.as_array()) {
          for (const auto& b : *a) f.backends.push_back(b.value<std::string>().value_or(""));
        } else {
          f.backends.push_back(v.value<std::string>().value_or(""));
        }
        for (const auto& b : f.backends)
          if (b != "cpu" && b != "cuda")
            err.fail(&v, fmt::format("{}.backend: unknown backend '{}' (expected cpu or cuda)", key,
                                     echo(b)));
        continue;
      }
      if (find_knob(name) == nullptr)
        err.fail(&v, fmt::format("{}: unknown axis '{}' (expected one of: {}, backend)", key,
                                 echo(name), fmt::join(knob_names(), ", ")));
      f.axes[name] = axis_values(err, name, v, models);
    }
    out.push_back(std::move(f));
  }
  return out;
}

double parse_duration(const GridError& err, const toml::node& v) {
  if (v.is_integer() || v.is_floating_point()) {
    double d = *v.value<double>();
    if (d > 0 && d <= kMaxTimeoutS) return d;
  } else if (auto s = v.value<std::string>()) {
    if (auto d = parse_duration_text(*s)) return *d;
  }
  err.fail(&v, fmt::format("run.timeout: expected a duration like \"120s\", \"5m\" or a number of "
                           "seconds, up to {:.0f} s",
                           kMaxTimeoutS));
}

std::uint64_t fnv1a(const std::string& s, std::uint64_t h = 1469598103934665603ull) {
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

}  // namespace

std::optional<double> parse_duration_text(std::string_view text) {
  const auto trim = [](std::string_view t) {
    while (!t.empty() && t.front() == ' ') t.remove_prefix(1);
    while (!t.empty() && t.back() == ' ') t.remove_suffix(1);
    return t;
  };
  text = trim(text);
  double number = 0;
  const char* end = text.data() + text.size();
  auto [p, ec] = std::from_chars(text.data(), end, number);
  if (ec != std::errc()) return std::nullopt;
  const std::string_view unit = trim(std::string_view(p, static_cast<std::size_t>(end - p)));
  const double scale = unit == "s" || unit.empty() ? 1
                       : unit == "ms"              ? 1e-3
                       : unit == "m"               ? 60
                       : unit == "h"               ? 3600
                                                   : -1;
  const double seconds = number * scale;
  if (scale < 0 || !std::isfinite(seconds) || !(seconds > 0) || seconds > kMaxTimeoutS)
    return std::nullopt;
  return seconds;
}

std::optional<int> parse_steps_text(std::string_view text, int min) {
  std::int64_t v = 0;
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || p != text.data() + text.size() || v < min || v > kMaxSteps)
    return std::nullopt;
  return static_cast<int>(v);
}

bool valid_grid_name(std::string_view name) {
  if (name.empty() || name.size() > 128 || name.front() == '.') return false;
  return std::none_of(name.begin(), name.end(), [](char c) {
    const auto u = static_cast<unsigned char>(c);
    return c == '/' || c == '\\' || u < 0x20 || u == 0x7f;
  });
}

Grid parse_grid(const std::string& text, const std::string& source_name,
                const std::string& backend) {
  GridError err(source_name);
  toml::table root;
  try {
    root = toml::parse(text, source_name);
  } catch (const toml::parse_error& e) {
    throw BadInput(fmt::format("{}:{}: malformed TOML: {}", echo(source_name, kEchoPathMax),
                               e.source().begin.line, echo(e.description(), 240)));
  }
  static const std::set<std::string> top_keys = {"name",     "mode",    "run",  "axes",
                                                 "baseline", "exclude", "where"};
  for (const auto& [k, v] : root)
    if (!top_keys.count(std::string(k.str())))
      err.fail(&v, fmt::format("unknown key '{}' (expected one of: name, mode, run, axes, "
                               "baseline, exclude, where)",
                               echo(k.str())));

  Grid g;
  g.name = "unnamed";
  if (const auto* n = root.get("name")) {
    // The name names the results file, out/<name>.json: a path would write elsewhere.
    auto s = n->value<std::string>();
    if (!n->is_string() || !valid_grid_name(*s))
      err.fail(n, fmt::format("name: expected a string usable as a file name (no '/', not "
                              "starting with '.', at most 128 characters), got {}",
                              n->is_string() ? fmt::format("'{}'", echo(*s)) : "a non-string"));
    g.name = *s;
  }
  if (const auto* m = root.get("mode")) {
    auto s = m->value<std::string>();
    if (!s || (*s != "cartesian" && *s != "sweep"))
      err.fail(m, "mode: expected \"cartesian\" or \"sweep\"");
    g.mode = *s;
  }

  if (const auto* run_node = root.get("run")) {
    const auto* run = run_node->as_table();
    if (run == nullptr) err.fail(run_node, "run: expected a table");
    for (const auto& [k, v] : *run) {
      std::string key(k.str());
      if (key == "backend") {
        auto s = v.value<std::string>();
        if (!s || (*s != "auto" && *s != "cpu" && *s != "cuda"))
          err.fail(&v, "run.backend: expected \"auto\", \"cpu\" or \"cuda\"");
        g.run.backend = *s;
      } else if (key == "warmup" || key == "steps" || key == "seed") {
        auto i = v.value<std::int64_t>();
        const std::int64_t min = key == "steps" ? 1 : 0;
        // Range-checked before narrowing: 2^32 + 1 steps must not become 1.
        const std::int64_t max = key == "seed" ? INT64_MAX : kMaxSteps;
        if (!v.is_integer() || !i || *i < min || *i > max)
          err.fail(&v, key == "seed" ? std::string("run.seed: expected an integer >= 0")
                                     : fmt::format("run.{}: expected an integer in [{}, {}]", key,
                                                   min, kMaxSteps));
        if (key == "warmup") g.run.warmup = static_cast<int>(*i);
        if (key == "steps") g.run.steps = static_cast<int>(*i);
        if (key == "seed") g.run.seed = static_cast<std::uint64_t>(*i);
      } else if (key == "capacity") {
        auto s = v.value<std::string>();
        auto bytes = s ? parse_capacity(*s) : std::nullopt;
        if (!bytes || *bytes == 0)
          err.fail(&v, "run.capacity: expected a size like \"24GiB\" or a card name like \"a10g\"");
        g.run.capacity = *bytes;
        g.run.capacity_text = *s;
      } else if (key == "timeout") {
        g.run.timeout_s = parse_duration(err, v);
      } else {
        err.fail(&v, fmt::format("run: unknown key '{}' (expected backend, warmup, steps, seed, "
                                 "capacity, timeout)",
                                 echo(key)));
      }
    }
  }

  // Axis values; a missing axis takes its default.
  AxisValues axes;
  ResolvedModels models;
  const auto names = knob_names();
  if (const auto* axes_node = root.get("axes")) {
    const auto* tbl = axes_node->as_table();
    if (tbl == nullptr) err.fail(axes_node, "axes: expected a table");
    for (const auto& [k, v] : *tbl) {
      std::string axis(k.str());
      if (std::find(names.begin(), names.end(), axis) == names.end())
        err.fail(&v, fmt::format("axes: unknown axis '{}' (expected one of: {})", echo(axis),
                                 fmt::join(names, ", ")));
      axes[axis] = axis_values(err, axis, v, models);
    }
  }
  for (const auto& axis : names)
    if (!axes.count(axis)) axes[axis] = {knob(axis).default_text()};

  // The number of combinations, counted before any is built.
  std::int64_t count = 1;
  for (const auto& axis : names) {
    const auto n = static_cast<std::int64_t>(axes[axis].size());
    count = g.mode == "cartesian" ? count * n : count + n - 1;  // kept below the bound
    if (count > kMaxGridPoints)
      err.fail(nullptr, fmt::format("axes: more than {} points (memtrade's bound on a grid)",
                                    kMaxGridPoints));
  }
  std::vector<std::map<std::string, std::string>> combos;
  if (g.mode == "cartesian") {
    combos.emplace_back();
    for (const auto& axis : names) {
      std::vector<std::map<std::string, std::string>> next;
      for (const auto& c : combos)
        for (const auto& v : axes[axis]) {
          auto n = c;
          n[axis] = v;
          next.push_back(std::move(n));
        }
      combos = std::move(next);
    }
  } else {
    std::map<std::string, std::string> base;
    for (const auto& axis : names) base[axis] = axes[axis].front();
    if (const auto* bnode = root.get("baseline")) {
      const auto* tbl = bnode->as_table();
      if (tbl == nullptr) err.fail(bnode, "baseline: expected a table");
      for (const auto& [k, v] : *tbl) {
        std::string axis(k.str());
        if (std::find(names.begin(), names.end(), axis) == names.end())
          err.fail(&v, fmt::format("baseline: unknown axis '{}'", echo(axis)));
        if (v.is_array()) err.fail(&v, fmt::format("baseline.{}: expected one value", axis));
        base[axis] = axis_value(err, axis, v, models);
      }
    }
    combos.push_back(base);
    for (const auto& axis : names)
      for (const auto& v : axes[axis]) {
        if (v == base[axis]) continue;
        auto n = base;
        n[axis] = v;
        combos.push_back(std::move(n));
      }
  }
  if (root.get("baseline") != nullptr && g.mode != "sweep")
    err.fail(root.get("baseline"), "baseline: only meaningful with mode = \"sweep\"");

  auto excludes = parse_filters(err, root, "exclude", models);
  auto wheres = parse_filters(err, root, "where", models);
  std::set<std::string> seen;
  std::string hash_text = fmt::format("{}|{}|{}|{}|{}|{}", g.name, g.mode, g.run.warmup,
                                      g.run.steps, g.run.seed, g.run.capacity);
  for (const auto& combo : combos) {
    bool excluded = std::any_of(excludes.begin(), excludes.end(),
                                [&](const Filter& f) { return f.matches(combo, backend); });
    bool kept = wheres.empty() || std::any_of(wheres.begin(), wheres.end(), [&](const Filter& f) {
                  return f.matches(combo, backend);
                });
    if (excluded || !kept) continue;
    TrainConfig cfg = config_from_values(err, combo, g.run.seed, models);
    GridPoint p{point_id(cfg), cfg};
    if (!seen.insert(p.id).second) continue;
    hash_text += "|" + p.id;
    g.points.push_back(std::move(p));
  }
  g.hash = fmt::format("{:016x}", fnv1a(hash_text));
  return g;
}

Grid load_grid(const std::filesystem::path& path, const std::string& backend) {
  const std::string shown = echo(path.string(), kEchoPathMax);
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw BadInput(fmt::format("{}: is a directory, not a grid file", shown));
  std::ifstream in(path);
  if (!in) throw BadInput(fmt::format("{}: cannot read grid file", shown));
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_grid(ss.str(), path.string(), backend);
}

std::vector<GridPoint> shard_points(const std::vector<GridPoint>& points, int index, int count) {
  std::vector<GridPoint> out;
  for (std::size_t i = static_cast<std::size_t>(index); i < points.size();
       i += static_cast<std::size_t>(count))
    out.push_back(points[i]);
  return out;
}

std::pair<int, int> parse_shard(const std::string& text) {
  int i = -1, n = -1;
  char slash = 0;
  std::istringstream in(text);
  if (!(in >> i >> slash >> n) || slash != '/' || !in.eof() || n < 1 || i < 0 || i >= n)
    throw BadInput(fmt::format("--shard: expected i/N with 0 <= i < N, got '{}'", echo(text)));
  return {i, n};
}

}  // namespace memtrade
