#include "harness/run/grid.h"

#include <algorithm>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <toml++/toml.h>

#include "harness/common/bad_input.h"
#include "kernels/allocator.h"
#include "models/model.h"

namespace memtrade {
namespace {

// One axis value as text in its contract spelling ("8", "bf16", "0.5", "sqrt").
using AxisValues = std::map<std::string, std::vector<std::string>>;

class GridError {
 public:
  explicit GridError(std::string source) : source_(std::move(source)) {}
  [[noreturn]] void fail(const toml::node* where, const std::string& what) const {
    if (where != nullptr && where->source().begin.line > 0)
      throw BadInput(fmt::format("{}:{}: {}", source_, where->source().begin.line, what));
    throw BadInput(fmt::format("{}: {}", source_, what));
  }

 private:
  std::string source_;
};

std::string checkpoint_text(double d) {
  return Checkpoint{Checkpoint::Kind::density, d}.str();
}

// Validates one value of `axis` and returns its canonical text.
std::string axis_value(const GridError& err, const std::string& axis, const toml::node& v) {
  auto bad = [&](const std::string& why) { err.fail(&v, fmt::format("axes.{}: {}", axis, why)); };
  if (axis == "batch_size" || axis == "accumulation") {
    auto i = v.value<std::int64_t>();
    if (!v.is_integer() || !i) bad("expected a positive integer");
    if (*i < 1) bad(fmt::format("must be a positive integer, got {}", *i));
    return std::to_string(*i);
  }
  if (axis == "checkpoint") {
    if (v.is_integer() || v.is_floating_point()) {
      double d = *v.value<double>();
      if (!(d >= 0.0 && d <= 1.0)) bad(fmt::format("density {} is outside [0, 1]", d));
      return checkpoint_text(d);
    }
    auto s = v.value<std::string>();
    if (!s || !Checkpoint::parse(*s))
      bad("expected a density in [0, 1], \"sqrt\" or \"selective\"");
    return Checkpoint::parse(*s)->str();
  }
  auto s = v.value<std::string>();
  if (!v.is_string() || !s) bad("expected a string");
  auto check = [&](bool ok, const std::vector<std::string>& accepted) {
    if (!ok)
      bad(fmt::format("unknown value '{}' (expected one of: {})", *s, fmt::join(accepted, ", ")));
  };
  if (axis == "model") {
    auto names = model_names();
    check(std::find(names.begin(), names.end(), *s) != names.end(), names);
  } else if (axis == "precision") {
    check(parse_precision(*s).has_value(), precision_names());
  } else if (axis == "optimizer") {
    check(parse_optimizer(*s).has_value(), optimizer_names());
  } else if (axis == "offload") {
    check(parse_offload(*s).has_value(), offload_names());
  } else if (axis == "zero_grad") {
    check(parse_zero_grad(*s).has_value(), {"set_to_none", "zero"});
  } else if (axis == "mode") {
    check(parse_mode(*s).has_value(), {"train", "eval"});
  } else if (axis == "empty_cache") {
    check(parse_empty_cache(*s).has_value(), {"never", "per_step"});
  } else if (axis == "input") {
    check(parse_input(*s).has_value(), {"pinned", "pageable"});
  }
  return *s;
}

std::vector<std::string> axis_values(const GridError& err, const std::string& axis,
                                     const toml::node& node) {
  std::vector<std::string> out;
  if (const auto* arr = node.as_array()) {
    if (arr->empty()) err.fail(&node, fmt::format("axes.{}: empty list", axis));
    for (const auto& v : *arr) {
      std::string s = axis_value(err, axis, v);
      if (std::find(out.begin(), out.end(), s) == out.end()) out.push_back(s);
    }
  } else {
    out.push_back(axis_value(err, axis, node));
  }
  return out;
}

std::string default_value(const std::string& axis) {
  TrainConfig d;
  auto j = config_json(d);
  const auto& v = j.at(axis);
  return v.is_string() ? v.get<std::string>() : v.dump();
}

TrainConfig config_from_values(const std::map<std::string, std::string>& values,
                               std::uint64_t seed) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [axis, value] : values) {
    if (axis == "batch_size" || axis == "accumulation")
      j[axis] = std::stoll(value);
    else
      j[axis] = value;
  }
  j["seed"] = seed;
  return config_from_json(j);
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

std::vector<Filter> parse_filters(const GridError& err, const toml::table& root, const char* key) {
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
            err.fail(
                &v, fmt::format("{}.backend: unknown backend '{}' (expected cpu or cuda)", key, b));
        continue;
      }
      const auto& names = axis_names();
      if (std::find(names.begin(), names.end(), name) == names.end())
        err.fail(&v, fmt::format("{}: unknown axis '{}' (expected one of: {}, backend)", key, name,
                                 fmt::join(names, ", ")));
      f.axes[name] = axis_values(err, name, v);
    }
    out.push_back(std::move(f));
  }
  return out;
}

double parse_duration(const GridError& err, const toml::node& v) {
  if (v.is_integer() || v.is_floating_point()) {
    double d = *v.value<double>();
    if (d > 0) return d;
  } else if (auto s = v.value<std::string>()) {
    double number = 0;
    std::string unit;
    std::istringstream in(*s);
    if (in >> number) {
      in >> unit;
      double scale = unit == "s" || unit.empty() ? 1
                     : unit == "ms"              ? 1e-3
                     : unit == "m"               ? 60
                     : unit == "h"               ? 3600
                                                 : -1;
      if (scale > 0 && number > 0 && in.eof()) return number * scale;
    }
  }
  err.fail(&v, "run.timeout: expected a duration like \"120s\", \"5m\" or a number of seconds");
}

std::uint64_t fnv1a(const std::string& s, std::uint64_t h = 1469598103934665603ull) {
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

}  // namespace

const std::vector<std::string>& axis_names() {
  static const std::vector<std::string> names = {
      "model",   "batch_size", "accumulation", "precision",   "checkpoint", "optimizer",
      "offload", "zero_grad",  "mode",         "empty_cache", "input"};
  return names;
}

std::string point_id(const TrainConfig& c) {
  return fmt::format("{}/b{}/a{}/{}/ck{}/{}/off-{}/zg-{}/{}/ec-{}/in-{}", c.model, c.batch_size,
                     c.accumulation, precision_name(c.precision), c.checkpoint.str(),
                     optimizer_name(c.optimizer), offload_name(c.offload),
                     zero_grad_name(c.zero_grad), mode_name(c.mode),
                     empty_cache_name(c.empty_cache), input_name(c.input));
}

nlohmann::json config_json(const TrainConfig& c) {
  return {{"model", c.model},
          {"batch_size", c.batch_size},
          {"accumulation", c.accumulation},
          {"precision", precision_name(c.precision)},
          {"checkpoint", c.checkpoint.str()},
          {"optimizer", optimizer_name(c.optimizer)},
          {"offload", offload_name(c.offload)},
          {"zero_grad", zero_grad_name(c.zero_grad)},
          {"mode", mode_name(c.mode)},
          {"empty_cache", empty_cache_name(c.empty_cache)},
          {"input", input_name(c.input)},
          {"seed", c.seed}};
}

TrainConfig config_from_json(const nlohmann::json& j) {
  if (!j.is_object()) throw BadInput("config: expected an object");
  TrainConfig c;
  auto str = [&](const char* key, const std::string& fallback) {
    if (!j.contains(key)) return fallback;
    if (!j.at(key).is_string()) throw BadInput(fmt::format("config.{}: expected a string", key));
    return j.at(key).get<std::string>();
  };
  auto integer = [&](const char* key, std::int64_t fallback) {
    if (!j.contains(key)) return fallback;
    if (!j.at(key).is_number_integer())
      throw BadInput(fmt::format("config.{}: expected an integer", key));
    return j.at(key).get<std::int64_t>();
  };
  auto need = [](auto opt, const char* key, const std::string& value) {
    if (!opt) throw BadInput(fmt::format("config.{}: unknown value '{}'", key, value));
    return *opt;
  };
  c.model = str("model", c.model);
  c.batch_size = integer("batch_size", c.batch_size);
  c.accumulation = integer("accumulation", c.accumulation);
  if (c.batch_size < 1 || c.accumulation < 1)
    throw BadInput("config: batch_size and accumulation must be positive");
  std::string v;
  v = str("precision", "fp32");
  c.precision = need(parse_precision(v), "precision", v);
  v = j.contains("checkpoint") && j.at("checkpoint").is_number() ? j.at("checkpoint").dump()
                                                                 : str("checkpoint", "0");
  c.checkpoint = need(Checkpoint::parse(v), "checkpoint", v);
  v = str("optimizer", "adam");
  c.optimizer = need(parse_optimizer(v), "optimizer", v);
  v = str("offload", "none");
  c.offload = need(parse_offload(v), "offload", v);
  v = str("zero_grad", "set_to_none");
  c.zero_grad = need(parse_zero_grad(v), "zero_grad", v);
  v = str("mode", "train");
  c.mode = need(parse_mode(v), "mode", v);
  v = str("empty_cache", "never");
  c.empty_cache = need(parse_empty_cache(v), "empty_cache", v);
  v = str("input", "pinned");
  c.input = need(parse_input(v), "input", v);
  c.seed = static_cast<std::uint64_t>(integer("seed", 0));
  return c;
}

Grid parse_grid(const std::string& text, const std::string& source_name,
                const std::string& backend) {
  GridError err(source_name);
  toml::table root;
  try {
    root = toml::parse(text, source_name);
  } catch (const toml::parse_error& e) {
    throw BadInput(fmt::format("{}:{}: malformed TOML: {}", source_name, e.source().begin.line,
                               e.description()));
  }
  static const std::set<std::string> top_keys = {"name",     "mode",    "run",  "axes",
                                                 "baseline", "exclude", "where"};
  for (const auto& [k, v] : root)
    if (!top_keys.count(std::string(k.str())))
      err.fail(&v, fmt::format("unknown key '{}' (expected one of: name, mode, run, axes, "
                               "baseline, exclude, where)",
                               k.str()));

  Grid g;
  g.name = root["name"].value_or(std::string("unnamed"));
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
        if (!v.is_integer() || !i || *i < (key == "steps" ? 1 : 0))
          err.fail(&v,
                   fmt::format("run.{}: expected an integer >= {}", key, key == "steps" ? 1 : 0));
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
                                 key));
      }
    }
  }

  // Axis values; a missing axis takes its default.
  AxisValues axes;
  const auto& names = axis_names();
  if (const auto* axes_node = root.get("axes")) {
    const auto* tbl = axes_node->as_table();
    if (tbl == nullptr) err.fail(axes_node, "axes: expected a table");
    for (const auto& [k, v] : *tbl) {
      std::string axis(k.str());
      if (std::find(names.begin(), names.end(), axis) == names.end())
        err.fail(&v, fmt::format("axes: unknown axis '{}' (expected one of: {})", axis,
                                 fmt::join(names, ", ")));
      axes[axis] = axis_values(err, axis, v);
    }
  }
  for (const auto& axis : names)
    if (!axes.count(axis)) axes[axis] = {default_value(axis)};

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
          err.fail(&v, fmt::format("baseline: unknown axis '{}'", axis));
        if (v.is_array()) err.fail(&v, fmt::format("baseline.{}: expected one value", axis));
        base[axis] = axis_value(err, axis, v);
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

  auto excludes = parse_filters(err, root, "exclude");
  auto wheres = parse_filters(err, root, "where");
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
    TrainConfig cfg = config_from_values(combo, g.run.seed);
    GridPoint p{point_id(cfg), cfg};
    if (!seen.insert(p.id).second) continue;
    hash_text += "|" + p.id;
    g.points.push_back(std::move(p));
  }
  g.hash = fmt::format("{:016x}", fnv1a(hash_text));
  return g;
}

Grid load_grid(const std::filesystem::path& path, const std::string& backend) {
  std::ifstream in(path);
  if (!in) throw BadInput(fmt::format("{}: cannot read grid file", path.string()));
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
    throw BadInput(fmt::format("--shard: expected i/N with 0 <= i < N, got '{}'", text));
  return {i, n};
}

}  // namespace memtrade
