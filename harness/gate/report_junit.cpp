// JUnit XML reporter: CI systems draw one test per point x metric from it.
#include <fmt/format.h>

#include "harness/gate/compare_report.h"

namespace memtrade {
namespace {

std::string xml_escape(const std::string& s) {
  std::string out;
  for (char ch : s) {
    switch (ch) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default:
        // XML 1.0 forbids most control characters even when escaped.
        if (static_cast<unsigned char>(ch) >= 0x20 || ch == '\n' || ch == '\t') out += ch;
    }
  }
  return out;
}

}  // namespace

std::string report_junit(const Comparison& c) {
  std::size_t failures = 0, skipped = 0;
  for (const auto& r : c.rows) {
    failures += r.verdict == Verdict::regression && r.gated();
    skipped += r.verdict == Verdict::inconclusive;
  }
  // A point missing from HEAD is a test case of its own: failed, or skipped when allowed.
  const std::size_t tests = c.rows.size() + c.removed.size();
  (c.removed_fails() ? failures : skipped) += c.removed.size();
  std::string out = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  out += fmt::format(
      "<testsuites name=\"memtrade compare\" tests=\"{0}\" failures=\"{1}\" skipped=\"{2}\">\n"
      "  <testsuite name=\"memtrade.compare\" tests=\"{0}\" failures=\"{1}\" errors=\"0\" "
      "skipped=\"{2}\">\n",
      tests, failures, skipped);
  out += fmt::format(
      "    <properties>\n      <property name=\"base\" value=\"{}\"/>\n"
      "      <property name=\"head\" value=\"{}\"/>\n"
      "      <property name=\"added\" value=\"{}\"/>\n"
      "      <property name=\"removed\" value=\"{}\"/>\n    </properties>\n",
      xml_escape(c.base_label), xml_escape(c.head_label), c.added.size(), c.removed.size());
  for (const auto& r : c.rows) {
    const std::string detail_text =
        fmt::format("{} -> {} ({}) p={} {}", detail::format_value(r.unit, r.base),
                    detail::format_value(r.unit, r.head), detail::format_change(r),
                    detail::format_p(r), r.note);
    out += fmt::format("    <testcase classname=\"{}\" name=\"{}\"", xml_escape(r.point),
                       xml_escape(r.metric));
    if (r.verdict == Verdict::regression && r.gated()) {
      out += fmt::format(
          ">\n      <failure message=\"regression\" type=\"regression\">{}</failure>\n"
          "    </testcase>\n",
          xml_escape(detail_text));
    } else if (r.verdict == Verdict::inconclusive) {
      out += fmt::format(">\n      <skipped message=\"inconclusive: {}\"/>\n    </testcase>\n",
                         xml_escape(r.note));
    } else {
      out += fmt::format(">\n      <system-out>{}: {}</system-out>\n    </testcase>\n",
                         verdict_name(r.verdict), xml_escape(detail_text));
    }
  }
  for (const auto& id : c.removed) {
    out += fmt::format("    <testcase classname=\"{}\" name=\"present\"", xml_escape(id));
    out += c.removed_fails()
               ? ">\n      <failure message=\"missing from head\" type=\"missing\">in base, not "
                 "in head</failure>\n    </testcase>\n"
               : ">\n      <skipped message=\"removed (allowed)\"/>\n    </testcase>\n";
  }
  out += "  </testsuite>\n</testsuites>\n";
  return out;
}

}  // namespace memtrade
