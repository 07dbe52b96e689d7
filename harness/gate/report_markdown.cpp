// Markdown reporter: a GitHub job summary or PR comment. Regressions first, because that is what
// a reader of a red build looks for.
#include <fmt/format.h>

#include "harness/gate/compare_report.h"

namespace memtrade {
namespace {

// Table cells: a '|' would end the cell, a newline the row.
std::string cell(const std::string& s) {
  std::string out;
  for (char ch : s) {
    if (ch == '|')
      out += "\\|";
    else if (ch == '\n')
      out += ' ';
    else
      out += ch;
  }
  return out;
}

void table(std::string& out, const Comparison& c, Verdict v, const char* title) {
  std::size_t n = 0;
  for (const auto& r : c.rows) n += r.verdict == v;
  if (n == 0) return;
  out += fmt::format("\n### {} ({})\n\n", title, n);
  out += "| point | metric | base | head | change | p (BH-adjusted) | note |\n";
  out += "|---|---|---:|---:|---:|---:|---|\n";
  for (const auto& r : c.rows) {
    if (r.verdict != v) continue;
    std::string note = r.note;
    if (v == Verdict::regression && !r.gated()) note = "not gated; " + note;
    out += fmt::format("| `{}` | {} | {} | {} | {} | {} | {} |\n", cell(r.point), r.metric,
                       detail::format_value(r.unit, r.base), detail::format_value(r.unit, r.head),
                       cell(detail::format_change(r)), detail::format_p(r), cell(note));
  }
}

}  // namespace

std::string report_markdown(const Comparison& c) {
  const bool fail = c.exit_code() != 0;
  std::string out = fmt::format("## memtrade compare {}\n\n", fail ? ":x:" : ":white_check_mark:");
  out += fmt::format("**{}**\n\n", detail::summary_line(c));
  const std::string bc = detail::commit_of(c.base_meta), hc = detail::commit_of(c.head_meta);
  out += fmt::format("base `{}`{} → head `{}`{}\n", cell(c.base_label),
                     bc.empty() ? "" : fmt::format(" ({})", bc), cell(c.head_label),
                     hc.empty() ? "" : fmt::format(" ({})", hc));
  table(out, c, Verdict::regression, "Regressions");
  table(out, c, Verdict::improvement, "Improvements");
  table(out, c, Verdict::inconclusive, "Inconclusive");
  table(out, c, Verdict::changed, "Status changes");
  if (c.removed_fails()) {
    out += "\n### Missing from head (failure)\n\n";
    for (const auto& id : c.removed) out += fmt::format("- `{}`\n", cell(id));
    out +=
        "\nA run that lost points, or a change that renamed them, fails the gate; declare a "
        "deliberate grid change with `--allow-removed` or `--rename OLD=NEW`.\n";
  }
  if (!c.added.empty() || (!c.removed.empty() && !c.removed_fails()) || !c.renamed.empty()) {
    out += "\n### Added, removed and renamed points\n\n";
    for (const auto& id : c.added) out += fmt::format("- added (not judged): `{}`\n", cell(id));
    if (!c.removed_fails())
      for (const auto& id : c.removed) out += fmt::format("- removed (allowed): `{}`\n", cell(id));
    for (const auto& [from, to] : c.renamed)
      out += fmt::format("- renamed: `{}` → `{}`\n", cell(from), cell(to));
  }
  return out;
}

}  // namespace memtrade
