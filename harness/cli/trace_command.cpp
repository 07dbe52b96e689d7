// `memtrade trace FILE --format torch-snapshot -o snap.pickle [--at end|peak]`: a trace of
// `run --trace` as a PyTorch memory snapshot (harness/run/torch_snapshot.h).
#include <filesystem>
#include <string>

#include <fmt/format.h>

#include "harness/cli/command.h"
#include "harness/common/bad_input.h"
#include "harness/common/output_file.h"
#include "harness/common/pickle.h"
#include "harness/common/point_row.h"
#include "harness/run/torch_snapshot.h"
#include "models/config/input_text.h"

namespace memtrade {
namespace {

struct TraceFlags {
  std::string input, format, out, at = "end";
};

int cmd_trace(const TraceFlags& f) {
  const auto format = snapshot_format_from_name(f.format);
  if (!format)
    throw BadInput(fmt::format(
        "trace --format: unknown value '{}' (expected torch-snapshot or torch-snapshot-1.13)",
        echo(f.format)));
  const auto at = snapshot_at_from_name(f.at);
  if (!at)
    throw BadInput(
        fmt::format("trace --at: unknown value '{}' (expected end or peak)", echo(f.at)));
  std::error_code ec;
  if (std::filesystem::exists(f.out, ec) && std::filesystem::exists(f.input, ec) &&
      std::filesystem::equivalent(f.out, f.input, ec))
    throw BadInput(fmt::format("trace: -o {} is the trace file: refusing to overwrite it",
                               echo(f.out, kEchoPathMax)));
  check_output_file("-o", f.out);
  const nlohmann::json trace = read_json_file(f.input);
  write_file_atomic(f.out, to_pickle(torch_snapshot(trace, *format, *at, f.input)));
  return 0;
}

}  // namespace

void register_trace_command(CLI::App& app, Commands& cmds) {
  auto& f = cmds.keep<TraceFlags>();
  CLI::App* cmd = app.add_subcommand(
      "trace", "Convert a trace of `run --trace` (a PyTorch memory snapshot, for its viewers)");
  cmd->add_option("trace", f.input, "Trace file (memtrade.trace/1)")->required();
  cmd->add_option("--format", f.format,
                  "torch-snapshot (the dict pytorch.org/memory_viz and current torch read) or "
                  "torch-snapshot-1.13 (the list torch 1.13's torch.cuda._memory_viz reads)")
      ->required();
  cmd->add_option("-o,--out", f.out, "Snapshot file (pickle)")->required();
  cmd->add_option("--at", f.at, "The state at the step's end (default) or at its peak");
  cmds.add(cmd, [&f] { return cmd_trace(f); });
}

}  // namespace memtrade
