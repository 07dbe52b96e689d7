// Text reporter: for a terminal or a log. Colors are the caller's decision (TTY and NO_COLOR).
#include <fmt/format.h>

#include "harness/gate/compare_report.h"

namespace memtrade {

std::string report_text(const Comparison& c, bool color, bool verbose) {
  auto paint = [color](const std::string& s, const char* code) {
    return color ? fmt::format("\033[{}m{}\033[0m", code, s) : s;
  };
  auto code_of = [](Verdict v) {
    switch (v) {
      case Verdict::regression:
        return "31";  // red
      case Verdict::improvement:
        return "32";  // green
      case Verdict::inconclusive:
        return "33";  // yellow
      default:
        return "0";
    }
  };
  std::string out = fmt::format("memtrade compare: {} -> {}\n", c.base_label, c.head_label);
  const std::string summary = detail::summary_line(c);
  out += paint(summary, c.exit_code() ? "1;31" : "1;32") + "\n";
  for (Verdict v : {Verdict::regression, Verdict::improvement, Verdict::inconclusive,
                    Verdict::changed, Verdict::unchanged}) {
    if (v == Verdict::unchanged && !verbose) continue;
    for (const auto& r : c.rows) {
      if (r.verdict != v) continue;
      std::string tag = verdict_name(v);
      if (v == Verdict::regression && !r.gated()) tag += " (not gated)";
      out += fmt::format("  {} {} {}: {} -> {}  {}", paint(fmt::format("{:<13}", tag), code_of(v)),
                         r.point, r.metric, detail::format_value(r.unit, r.base),
                         detail::format_value(r.unit, r.head), detail::format_change(r));
      if (r.p) out += fmt::format("  p={}", detail::format_p(r));
      if (!r.note.empty()) out += fmt::format("  [{}]", r.note);
      out += "\n";
    }
  }
  // A point BASE has and HEAD lost is a failure unless the change was declared.
  const std::string missing = c.removed_fails() ? paint("missing      ", "31") : "removed      ";
  for (const auto& id : c.removed) out += fmt::format("  {} {}\n", missing, id);
  for (const auto& [from, to] : c.renamed)
    out += fmt::format("  renamed       {} -> {}\n", from, to);
  for (const auto& id : c.added) out += fmt::format("  added         {} (not judged)\n", id);
  return out;
}

}  // namespace memtrade
