// Shared formatting of comparison rows for the reporters.
#include <fmt/format.h>

#include <cmath>

#include "harness/common/bad_input.h"
#include "harness/gate/compare_report.h"

namespace memtrade {

ReportFormat parse_report_format(const std::string& name) {
  if (name == "text") return ReportFormat::text;
  if (name == "markdown" || name == "md") return ReportFormat::markdown;
  if (name == "json") return ReportFormat::json;
  if (name == "junit" || name == "xml") return ReportFormat::junit;
  throw BadInput(fmt::format("--format {}: expected text, markdown, json or junit", name));
}

std::string render_report(const Comparison& c, ReportFormat f, bool color) {
  switch (f) {
    case ReportFormat::text:
      return report_text(c, color);
    case ReportFormat::markdown:
      return report_markdown(c);
    case ReportFormat::json:
      return report_json(c);
    case ReportFormat::junit:
      return report_junit(c);
  }
  return {};
}

namespace detail {

std::string format_bytes(double v) {
  const double a = std::abs(v);
  if (a >= 1024.0 * 1024 * 1024) return fmt::format("{:.2f} GiB", v / (1024.0 * 1024 * 1024));
  if (a >= 1024.0 * 1024) return fmt::format("{:.2f} MiB", v / (1024.0 * 1024));
  if (a >= 1024.0) return fmt::format("{:.2f} KiB", v / 1024.0);
  return fmt::format("{:.0f} B", v);
}

std::string format_value(const std::string& unit, double v) {
  if (std::isnan(v)) return "-";
  if (unit == "bytes") return format_bytes(v);
  if (unit == "s") {
    const double a = std::abs(v);
    if (a >= 1) return fmt::format("{:.3f} s", v);
    if (a >= 1e-3) return fmt::format("{:.3f} ms", v * 1e3);
    if (a >= 1e-6) return fmt::format("{:.3f} us", v * 1e6);
    return fmt::format("{:.1f} ns", v * 1e9);
  }
  if (unit == "1/s") return fmt::format("{:.1f}/s", v);
  return fmt::format("{:.4g}", v);
}

std::string format_change(const CompareRow& r) {
  if (r.metric == "status") return fmt::format("{} -> {}", r.base_status, r.head_status);
  if (std::isinf(r.change)) return r.change > 0 ? "new (base 0)" : "-inf";
  std::string out = fmt::format("{:+.2f}%", r.change * 100);
  if (r.unit == "bytes" && r.head != r.base) {
    const double d = r.head - r.base;
    out += fmt::format(" ({}{})", d > 0 ? "+" : "-", format_bytes(std::abs(d)));
  }
  return out;
}

std::string format_p(const CompareRow& r) {
  if (!r.p) return "-";
  return fmt::format("{:.3g} (adj {:.3g})", *r.p, r.p_adj.value_or(*r.p));
}

std::string commit_of(const nlohmann::json& meta) {
  if (meta.is_object() && meta.contains("commit") && meta["commit"].is_string())
    return meta["commit"].get<std::string>().substr(0, 12);
  return "";
}

std::string summary_line(const Comparison& c) {
  const std::size_t gated = c.gated_regressions();
  const std::size_t reg = c.count(Verdict::regression);
  std::string head =
      gated > 0 || c.removed_fails() ? "FAIL" : (c.exit_code() ? "FAIL (inconclusive)" : "PASS");
  std::string out = fmt::format(
      "{}: {} regression{}{}, {} improvement{}, {} inconclusive, {} unchanged", head, reg,
      reg == 1 ? "" : "s", reg > gated ? fmt::format(" ({} not gated)", reg - gated) : "",
      c.count(Verdict::improvement), c.count(Verdict::improvement) == 1 ? "" : "s",
      c.count(Verdict::inconclusive), c.count(Verdict::unchanged));
  if (c.count(Verdict::changed)) out += fmt::format(", {} changed", c.count(Verdict::changed));
  out += fmt::format(", {} matched, {} added, {} {}", c.matched, c.added.size(), c.removed.size(),
                     c.removed_fails() ? "MISSING from head" : "removed");
  if (!c.renamed.empty()) out += fmt::format(", {} renamed", c.renamed.size());
  return out;
}

}  // namespace detail
}  // namespace memtrade
