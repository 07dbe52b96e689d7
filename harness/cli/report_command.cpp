// `memtrade report ...`: the charts are drawn by the Python package in reports/ (matplotlib),
// run with $MEMTRADE_PYTHON, else Debian's /usr/bin/python3 (what ci/setup.sh installs
// matplotlib for), else python3 on PATH; this forwards the arguments and the exit code.
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "harness/cli/command.h"
#include "harness/common/bad_input.h"
#include "harness/common/process.h"
#include "models/config/knobs.h"

namespace memtrade {
namespace {

std::filesystem::path reports_root() {
  if (const char* env = std::getenv("MEMTRADE_ROOT")) return env;
  return MEMTRADE_SOURCE_DIR;
}

int cmd_report(const std::vector<std::string>& args) {
  std::filesystem::path root = reports_root();
  if (!std::filesystem::exists(root / "reports" / "__main__.py"))
    throw BadInput(fmt::format("report: the reports package is not at {} (set MEMTRADE_ROOT)",
                               (root / "reports").string()));
  std::string python = std::filesystem::exists("/usr/bin/python3") ? "/usr/bin/python3" : "python3";
  if (const char* env = std::getenv("MEMTRADE_PYTHON"); env && *env) python = env;
  std::vector<std::string> argv = {python, "-m", "reports"};
  argv.insert(argv.end(), args.begin(), args.end());
  std::string pythonpath = root.string();
  if (const char* old = std::getenv("PYTHONPATH")) pythonpath += ":" + std::string(old);
  SpawnOptions o;
  o.search_path = true;
  // The knob table of this build: results files carry their own (meta.knobs); this serves the
  // ones written before they did.
  // MEMTRADE_BIN: this binary, for what the charts ask of it (the history's change points).
  o.env = {{"PYTHONPATH", pythonpath},
           {"MPLBACKEND", "Agg"},
           {"MEMTRADE_KNOBS_JSON", knobs_json().dump()},
           {"MEMTRADE_BIN", self_executable().string()}};
  const ChildOutcome c = spawn(argv, o);
  if (c.kind == ChildOutcome::Kind::signaled) return 1;
  if (c.exit_code == 127) throw std::runtime_error("report: cannot run " + python);
  return c.exit_code;
}

}  // namespace

void register_report_commands(CLI::App& app, Commands& cmds) {
  auto& args = cmds.keep<std::vector<std::string>>();
  CLI::App* report = app.add_subcommand(
      "report",
      "Draw the trade-off charts and the index page (RESULTS... -o DIR [--baseline F] "
      "[--history DB] [--trace F])");
  report->allow_extras();
  report->prefix_command();
  cmds.add(report, [report, &args] {
    args = report->remaining();
    return cmd_report(args);
  });
}

}  // namespace memtrade
