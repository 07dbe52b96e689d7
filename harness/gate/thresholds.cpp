#include "harness/gate/thresholds.h"

#include <fmt/format.h>
#include <fnmatch.h>

#include <fstream>
#include <sstream>

#include <toml++/toml.h>

#include "harness/common/bad_input.h"

namespace memtrade {
namespace {

bool is_rate_name(const std::string& m) {
  for (const char* s : {"per_second", "per_s", "_rate", "flops", "throughput", "bandwidth"})
    if (m.find(s) != std::string::npos) return true;
  return false;
}

std::string value_text(const toml::node& n) {
  if (auto s = n.value<std::string>()) return *s;
  if (auto i = n.value_exact<int64_t>()) return std::to_string(*i);
  if (auto b = n.value_exact<bool>()) return *b ? "true" : "false";
  if (auto d = n.value_exact<double>()) return fmt::format("{}", *d);
  return "";
}

}  // namespace

MetricRule builtin_rule(const std::string& metric) {
  MetricRule r;
  if (metric.starts_with("peak_") || metric == "predicted_peak") {
    r.kind = MetricRule::Kind::threshold;
  } else if (metric == "median_s" || metric == "real_time" || metric == "cpu_time") {
    r.kind = MetricRule::Kind::statistical;
  } else {
    r.kind = MetricRule::Kind::statistical;
    r.higher_is_better =
        metric == "samples_per_s" || metric == "tokens_per_s" || is_rate_name(metric);
  }
  return r;
}

void Thresholds::apply(MetricRule& rule, const Setting& s) {
  for (const auto& [k, v] : s.numbers) {
    if (k == "rel" || k == "abs") {
      rule.kind = MetricRule::Kind::threshold;
      (k == "rel" ? rule.rel : rule.abs) = v;
    } else if (k == "min_effect" || k == "alpha" || k == "min_samples") {
      rule.kind = MetricRule::Kind::statistical;
      if (k == "min_effect") rule.min_effect = v;
      if (k == "alpha") rule.alpha = v;
      if (k == "min_samples") rule.min_samples = static_cast<int>(v);
    }
  }
  for (const auto& [k, v] : s.flags)
    if (k == "gate") rule.gate = v;
  if (!s.better.empty()) rule.higher_is_better = s.better == "higher";
}

MetricRule Thresholds::rule(const std::string& metric, const ConfigMap& config) const {
  MetricRule r = builtin_rule(metric);
  if (auto it = defaults_.find(metric); it != defaults_.end()) apply(r, it->second);
  for (const auto& o : overrides_) {
    bool all = true;
    for (const auto& [key, pattern] : o.match) {
      auto c = config.find(key);
      if (c == config.end() || fnmatch(pattern.c_str(), c->second.c_str(), 0) != 0) {
        all = false;
        break;
      }
    }
    if (!all) continue;
    if (auto it = o.metrics.find(metric); it != o.metrics.end()) apply(r, it->second);
  }
  return r;
}

Thresholds Thresholds::parse(const std::string& text, const std::string& source) {
  toml::table root;
  try {
    root = toml::parse(text, source);
  } catch (const toml::parse_error& e) {
    throw BadInput(fmt::format("{}: bad thresholds TOML at line {}: {}", source,
                               e.source().begin.line, e.description()));
  }
  auto bad = [&](const std::string& what) { return BadInput(fmt::format("{}: {}", source, what)); };
  // One metric table; `where` names it in messages.
  auto setting = [&](const toml::node& node, const std::string& where) {
    const toml::table* t = node.as_table();
    if (!t) throw bad(fmt::format("{} must be a table like {{rel = 0.01}}", where));
    Setting s;
    for (const auto& [k, v] : *t) {
      const std::string key(k.str());
      if (key == "gate") {
        auto b = v.value_exact<bool>();
        if (!b) throw bad(fmt::format("{}.gate must be true or false", where));
        s.flags[key] = *b;
      } else if (key == "better") {
        auto b = v.value<std::string>();
        if (!b || (*b != "lower" && *b != "higher"))
          throw bad(fmt::format("{}.better must be \"lower\" or \"higher\"", where));
        s.better = *b;
      } else if (key == "rel" || key == "abs" || key == "min_effect" || key == "alpha" ||
                 key == "min_samples") {
        auto d = v.value<double>();
        if (!d || *d < 0) throw bad(fmt::format("{}.{} must be a number >= 0", where, key));
        if (key == "alpha" && *d >= 1) throw bad(fmt::format("{}.alpha must be < 1", where));
        s.numbers[key] = *d;
      } else {
        throw bad(
            fmt::format("{}: unknown field '{}' (rel, abs, min_effect, alpha, "
                        "min_samples, gate, better)",
                        where, key));
      }
    }
    const bool thr = s.numbers.contains("rel") || s.numbers.contains("abs");
    const bool stat = s.numbers.contains("min_effect") || s.numbers.contains("alpha") ||
                      s.numbers.contains("min_samples");
    if (thr && stat)
      throw bad(fmt::format("{} mixes rel/abs with min_effect/alpha: pick one kind", where));
    return s;
  };

  Thresholds out;
  for (const auto& [k, v] : root) {
    const std::string key(k.str());
    if (key == "defaults") {
      const toml::table* t = v.as_table();
      if (!t) throw bad("[defaults] must be a table");
      for (const auto& [mk, mv] : *t)
        out.defaults_[std::string(mk.str())] = setting(mv, fmt::format("defaults.{}", mk.str()));
    } else if (key == "override") {
      const toml::array* arr = v.as_array();
      if (!arr) throw bad("override must be an array of tables ([[override]])");
      for (std::size_t i = 0; i < arr->size(); ++i) {
        const toml::table* t = (*arr)[i].as_table();
        if (!t) throw bad(fmt::format("override #{} is not a table", i + 1));
        Override o;
        for (const auto& [ok, ov] : *t) {
          const std::string okey(ok.str());
          if (okey == "match") {
            const toml::table* m = ov.as_table();
            if (!m) throw bad(fmt::format("override #{}: match must be a table", i + 1));
            for (const auto& [mk, mv] : *m) {
              std::string text_value = value_text(mv);
              if (text_value.empty() && !mv.is_string())
                throw bad(fmt::format("override #{}: match.{} must be a string or number", i + 1,
                                      mk.str()));
              o.match[std::string(mk.str())] = text_value;
            }
          } else {
            o.metrics[okey] = setting(ov, fmt::format("override #{}.{}", i + 1, okey));
          }
        }
        if (o.match.empty())
          throw bad(fmt::format("override #{} has no match table (use [defaults] instead)", i + 1));
        out.overrides_.push_back(std::move(o));
      }
    } else {
      throw bad(fmt::format("unknown top-level key '{}' (expected [defaults], [[override]])", key));
    }
  }
  return out;
}

Thresholds Thresholds::load(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw BadInput(fmt::format("{}: cannot read thresholds file", path));
  std::stringstream ss;
  ss << in.rdbuf();
  return parse(ss.str(), path);
}

}  // namespace memtrade
