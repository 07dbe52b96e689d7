#include "harness/gate/trust.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include <fmt/format.h>

#include "harness/common/stats.h"
#include "models/config/input_text.h"

namespace memtrade {
namespace {

using nlohmann::json;

std::string text_of(const json& meta, const char* key) {
  return meta.is_object() && meta.contains(key) && meta[key].is_string()
             ? meta[key].get<std::string>()
             : std::string();
}

// "cpu (AMD EPYC, 2 threads, 23.5 GiB)" -> {"AMD EPYC", "2"}; anything else -> the whole text.
std::pair<std::string, std::string> cpu_of(const std::string& device) {
  const auto open = device.find('('), close = device.rfind(')');
  if (device.rfind("cpu", 0) != 0 || open == std::string::npos || close == std::string::npos ||
      close < open)
    return {device, ""};
  const std::string inner = device.substr(open + 1, close - open - 1);
  std::string model = inner, threads;
  if (const auto comma = inner.find(", "); comma != std::string::npos) {
    model = inner.substr(0, comma);
    const std::string rest = inner.substr(comma + 2);
    if (const auto sp = rest.find(" thread"); sp != std::string::npos) threads = rest.substr(0, sp);
  }
  return {model, threads};
}

// The run's step samples drift: its second half differs from its first (U test p < 0.01) by at
// least `min_shift` in the median. Needs 4 samples a half.
std::optional<double> drift(const std::vector<double>& s, double min_shift) {
  if (s.size() < 8) return std::nullopt;
  const std::size_t h = s.size() / 2;
  const std::vector<double> first(s.begin(), s.begin() + static_cast<std::ptrdiff_t>(h)),
      second(s.end() - static_cast<std::ptrdiff_t>(h), s.end());
  const double shift = median(second) / median(first) - 1;
  if (std::abs(shift) < min_shift || mann_whitney(first, second).p >= 0.01) return std::nullopt;
  return shift;
}

std::vector<std::string> words(const std::string& s) {
  std::vector<std::string> out;
  std::size_t i = 0;
  while (i < s.size()) {
    const std::size_t j = std::min(s.find(' ', i), s.size());
    if (j > i) out.push_back(s.substr(i, j - i));
    i = j + 1;
  }
  return out;
}

// "'Haswell' vs 'SkylakeX'" for two long version strings that differ in a word or two, else
// the two whole (bounded) values.
std::string what_differs(const std::string& a, const std::string& b) {
  const auto wa = words(a), wb = words(b);
  if (wa.size() == wb.size() && wa.size() > 2) {
    std::string da, db;
    std::size_t n = 0;
    for (std::size_t i = 0; i < wa.size(); ++i)
      if (wa[i] != wb[i]) {
        da += (n ? " " : "") + wa[i];
        db += (n ? " " : "") + wb[i];
        ++n;
      }
    if (n > 0 && n <= 2) return fmt::format("'{}' vs '{}'", echo(da), echo(db));
  }
  return fmt::format("'{}' vs '{}'", echo(a), echo(b));
}

const PointData* point_of(const ResultSet& r, const std::string& id) {
  for (const auto& p : r.points)
    if (p.id == id) return &p;
  return nullptr;
}

}  // namespace

std::map<std::string, std::string> environment_of(const json& meta) {
  std::map<std::string, std::string> env;
  const std::string backend = text_of(meta, "backend"), device = text_of(meta, "device");
  if (!backend.empty()) env["backend"] = backend;
  if (backend == "cpu") {
    const auto [model, threads] = cpu_of(device);
    if (!model.empty()) env["CPU"] = model;
    if (!threads.empty()) env["threads"] = threads;
  } else if (!device.empty()) {
    env["GPU"] = device;
  }
  if (meta.is_object() && meta.contains("versions") && meta["versions"].is_object())
    for (const auto& [lib, v] : meta["versions"].items())
      if (lib != "memtrade" && v.is_string()) env[lib] = v.get<std::string>();  // not the code
  return env;
}

std::vector<std::string> environment_differences(const json& base_meta, const json& head_meta) {
  const auto a = environment_of(base_meta), b = environment_of(head_meta);
  std::vector<std::string> out;
  for (const auto& [key, va] : a)
    if (const auto it = b.find(key); it != b.end() && it->second != va)
      out.push_back(fmt::format("{} {}", key, what_differs(va, it->second)));
  return out;
}

Instability machine_instability(const Comparison& c, const ResultSet& base, const ResultSet& head) {
  Instability out;
  std::vector<const CompareRow*> judged;  // step-time rows that were tested
  for (const auto& r : c.rows)
    if (r.statistical && r.metric == "median_s" && r.p) judged.push_back(&r);
  // 1. Drift within a run, in a point whose time verdict is not "unchanged": a shift between the
  //    halves of half the change claimed (or of half the minimum effect) says the machine moved
  //    under the run as much as the code would have.
  for (const CompareRow* r : judged) {
    if (r->verdict != Verdict::regression && r->verdict != Verdict::improvement) continue;
    const double min_shift = std::max(r->rule.min_effect, std::abs(r->change)) / 2;
    for (const auto& [side, set, id] :
         {std::tuple{"BASE", &base, r->point}, std::tuple{"HEAD", &head, r->point}}) {
      const PointData* p = point_of(*set, id);
      if (p == nullptr || !p->metrics.count("median_s")) continue;
      if (const auto d = drift(p->metrics.at("median_s").samples, min_shift))
        out.reasons.push_back(fmt::format("{}'s run of {} drifts {:+.0f}% between its halves", side,
                                          echo(id, kEchoPathMax), 100 * *d));
    }
  }
  // 2. Every judged point moved alike, the same way and beyond its minimum effect, between runs
  //    that did not overlap in time: what a slow stretch of the machine does to a run (so a
  //    one-point comparison never calls time on its own). A regression of some points, with
  //    others unchanged, is the code's signature and keeps its verdict.
  if (!judged.empty()) {
    const bool up = judged.front()->change > 0;
    const bool alike = std::all_of(judged.begin(), judged.end(), [&](const CompareRow* r) {
      return (r->change > 0) == up && std::abs(r->change) >= r->rule.min_effect;
    });
    if (alike) {
      double lo = INFINITY, hi = -INFINITY;
      for (const CompareRow* r : judged) lo = std::min(lo, r->change), hi = std::max(hi, r->change);
      // Two files are two runs, one after the other (even files an A/B run saved: their
      // interleaving is not in them), so the rule always applies here; the A/B judges in place.
      out.reasons.push_back(fmt::format(
          "all {} timed points moved alike ({:+.1f}% to {:+.1f}%) between two runs at different "
          "times",
          judged.size(), 100 * lo, 100 * hi));
    }
  }
  return out;
}

}  // namespace memtrade
