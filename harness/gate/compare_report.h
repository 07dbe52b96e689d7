// Reporters of a Comparison, one per format (each in its own report_<format>.cpp), plus the
// value formatting they share. Every reporter is a contract that tests parse back.
#pragma once

#include <string>

#include "harness/gate/compare.h"

namespace memtrade {

enum class ReportFormat { text, markdown, json, junit };
ReportFormat parse_report_format(const std::string& name);  // throws BadInput

// Human-readable: summary line, then regressions, improvements, inconclusive and status changes
// (all rows with verbose), then added/removed points. ANSI colors only when `color`.
std::string report_text(const Comparison& c, bool color, bool verbose = false);
// GitHub-flavoured Markdown for job summaries and PR comments.
std::string report_markdown(const Comparison& c);
// Schema "memtrade.compare/1": every point x metric with base, head, change, p, verdict.
std::string report_json(const Comparison& c);
// JUnit XML: one <testcase> per point x metric, <failure> for gated regressions, <skipped> for
// inconclusive rows.
std::string report_junit(const Comparison& c);

std::string render_report(const Comparison& c, ReportFormat f, bool color);

namespace detail {
std::string format_value(const std::string& unit, double v);  // "12.50 MiB", "3.20 ms", ...
std::string format_change(const CompareRow& r);               // "+2.00%" (+ delta for bytes)
std::string format_p(const CompareRow& r);                    // "0.0012 (adj 0.004)" or "-"
std::string summary_line(const Comparison& c);                // counts, one line, no markup
std::string commit_of(const nlohmann::json& meta);            // short commit or ""
}  // namespace detail

}  // namespace memtrade
