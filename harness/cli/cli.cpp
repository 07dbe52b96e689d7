#include "harness/cli/cli.h"
#include "harness/common/bad_input.h"

#include <unistd.h>

#include <toml++/toml.h>
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>

#include <fmt/format.h>

#include "harness/cli/command.h"
#include "harness/cli/gate_commands.h"
#include "harness/cli/knob_flags.h"
#include "harness/common/launch.h"
#include "harness/common/process.h"
#include "harness/run/point_runner.h"
#include "harness/run/step_dump.h"
#include "kernels/comm.h"
#include "kernels/device.h"
#include "kernels/gpu_specs.h"
#include "kernels/torch_workspace.h"
#include "models/config/input_text.h"
#include "models/model.h"

namespace memtrade {
namespace {

std::vector<std::string> g_args;  // this invocation's arguments, after the program name

// A data-parallel step started by hand: the same command again, as `ranks` ranks under the
// site's MPI launcher (harness/common/launch.h); its exit code is the ranks' (mpirun's: the
// first failing rank's).
// A rank that fails must not wait for the others in MPI_Finalize (they may be blocked in a
// collective for it): it ends the job (MPI_Abort), after its one line is out.
int rank_exit(int code) {
  if (code != 0 && launched_by_mpi()) {
    std::fflush(nullptr);
    abort_ranks(code);
  }
  return code;
}

int run_as_ranks(int ranks, int threads) {
  std::vector<std::string> args{self_executable().string()};
  args.insert(args.end(), g_args.begin(), g_args.end());
  const std::vector<std::string> argv = rank_launch_argv(ranks, args);
  SpawnOptions so;
  so.env = rank_env(ranks, threads);
  so.search_path = true;
  // The ranks' stderr, read after: a failed job says its one line once (each rank prints it, and
  // the launcher adds its banner); a job that succeeded passes on whatever the ranks wrote.
  struct TempFile {
    std::filesystem::path path;
    ~TempFile() {
      std::error_code ec;
      std::filesystem::remove(path, ec);
    }
  } err{std::filesystem::temp_directory_path() / fmt::format("memtrade-{}.ranks.err", getpid())};
  so.stderr_file = err.path;
  const ChildOutcome o = spawn(argv, so);
  std::ifstream in(err.path);
  std::vector<std::string> lines, ours;
  for (std::string line; std::getline(in, line);) {
    lines.push_back(line);
    if (line.starts_with("memtrade: ") && std::find(ours.begin(), ours.end(), line) == ours.end())
      ours.push_back(line);
  }
  const bool failed = o.kind != ChildOutcome::Kind::exited || o.exit_code != 0;
  for (const std::string& line : failed && !ours.empty() ? ours : lines)
    std::fprintf(stderr, "%s\n", line.c_str());
  if (o.kind == ChildOutcome::Kind::exited && o.exit_code == 127)
    throw BadInput(
        fmt::format("--dp {}: the launcher '{}' could not be started (Open MPI's mpirun "
                    "comes with openmpi-bin: ci/setup.sh; or set MEMTRADE_LAUNCHER)",
                    ranks, argv[0]));
  if (o.kind == ChildOutcome::Kind::exited) return o.exit_code;
  fmt::print(stderr, "memtrade: the ranks' launcher died: {}\n", describe_signal(o.signal));
  return 1;
}

std::string version_text() {
  std::string out;
  for (const auto& [lib, version] : library_versions())
    out += fmt::format("{:<14} {}\n", lib, version);
  out += fmt::format("{:<14} {}.{}.{}\n", "nlohmann-json", NLOHMANN_JSON_VERSION_MAJOR,
                     NLOHMANN_JSON_VERSION_MINOR, NLOHMANN_JSON_VERSION_PATCH);
  out += fmt::format("{:<14} {}\n", "CLI11", CLI11_VERSION);
  out += fmt::format("{:<14} {}.{}.{}\n", "toml++", TOML_LIB_MAJOR, TOML_LIB_MINOR, TOML_LIB_PATCH);
  return out;
}

// `devices --table`: the GPU table the time model prices ops on (kernels/gpu_specs.h), dense
// rates, one-way bandwidths, and each row's source.
int cmd_gpu_table(bool sources) {
  fmt::print(
      "{:<10} {:<30} {:>4} {:>6} {:>6} {:>7} {:>7} {:>5} {:>7} {:>5} {:>8} {:>4} {:>5} {:>9}\n",
      "gpu", "name", "SMs", "fp32", "tf32", "bf16", "fp8", "GiB", "mem", "PCIe", "NVLink", "dom",
      "arch", "cuBLAS ws");
  fmt::print(
      "{:<10} {:<30} {:>4} {:>6} {:>6} {:>7} {:>7} {:>5} {:>7} {:>5} {:>8} {:>4} {:>5} {:>9}\n", "",
      "", "", "TF/s", "TF/s", "TF/s", "TF/s", "", "GB/s", "GB/s", "GB/s", "", "", "bytes");
  for (const GpuSpec& g : gpu_specs()) {
    // PyTorch's cuBLAS workspace per handle and stream on this generation (torch_workspace.h).
    const ComputeCapability cc = compute_capability(g.arch);
    fmt::print(
        "{:<10} {:<30} {:>4} {:>6.1f} {:>6.1f} {:>7.1f} {:>7.1f} {:>5.0f} {:>7.0f} {:>5.0f} "
        "{:>8.0f} {:>4} {:>5} {:>9}\n",
        g.name, g.full_name, g.sms, g.fp32_flops / 1e12, g.tf32_flops / 1e12, g.bf16_flops / 1e12,
        g.fp8_flops / 1e12, g.memory_gib, g.memory_bw / 1e9, g.host_bw / 1e9, g.nvlink_bw / 1e9,
        g.nvlink_domain, fmt::format("sm{}{}", cc.major, cc.minor), cublas_workspace_bytes(cc));
    if (sources) fmt::print("    source: {}\n", g.source);
  }
  const Fabric fabric;
  fmt::print("between nodes: {:.0f} GB/s per GPU ({})\n", fabric.ib_bw / 1e9, fabric.source);
  fmt::print(
      "PCIe: what a pinned copy reaches, x16 one way (Gen4 25, Gen5 50 GB/s); rates dense\n");
  fmt::print(
      "cuBLAS ws: PyTorch's cuBLAS workspace per handle and stream (the memory model's CUDA "
      "target counts two in training, and 1 MiB of cuBLASLt's per thread with biases)\n");
  return 0;
}

int cmd_devices() {
  for (const auto& s : probe_backends())
    fmt::print("{:<5} {:<10} {}\n", backend_name(s.backend), s.usable ? "usable" : "unusable",
               s.detail);
  return 0;
}

// A device for one point's flags; tf32 is a tensor-core format, so the CPU cannot honour it.
std::unique_ptr<Device> device_for(const KnobFlags& flags, const TrainConfig& cfg) {
  DeviceOptions options;
  options.capacity = parse_capacity_flag(flags.capacity);
  options.threads = flags.threads;
  std::unique_ptr<Device> dev;
  try {
    dev = make_device(flags.backend, options);
  } catch (const std::runtime_error& e) {
    throw BadInput(fmt::format("--backend {}: {}", flags.backend, e.what()));
  }
  if (needs_cuda(cfg) && dev->backend() != Backend::cuda)
    throw BadInput("--precision tf32 needs the cuda backend (TF32 is a tensor-core format)");
  return dev;
}

}  // namespace

void register_point_commands(CLI::App& app, Commands& cmds) {
  auto& gpu_table = cmds.keep<bool>();
  auto& gpu_sources = cmds.keep<bool>();
  CLI::App* devices = app.add_subcommand("devices", "List the backends usable here");
  devices->add_flag("--table", gpu_table, "The GPU table of the time model (estimate --gpu)");
  devices->add_flag("--sources", gpu_sources, "With --table: each row's datasheet");
  cmds.add(devices, [&gpu_table, &gpu_sources] {
    return gpu_table ? cmd_gpu_table(gpu_sources) : cmd_devices();
  });

  auto& step_flags = cmds.keep<KnobFlags>();
  auto& dump_dir = cmds.keep<std::string>();
  auto& init_dir = cmds.keep<std::string>();
  CLI::App* step = app.add_subcommand("step", "Run one optimizer step of one point");
  add_knob_flags(*step, step_flags);
  step->add_option("--dump", dump_dir, "Write inputs, loss, params, grads (.npy) to this dir");
  step->add_option("--init", init_dir,
                   "With --dump: start from these parameters (DIR/<name>.npy, every one)");
  cmds.add(step, [&step_flags, &dump_dir, &init_dir] {
    TrainConfig cfg = to_train_config(step_flags);
    if (!init_dir.empty() && dump_dir.empty()) throw BadInput("--init goes with --dump");
    if (!dump_dir.empty() && cfg.tensor_parallel > 1)  // a dump is the whole model's
      throw BadInput("step --dump with --tp > 1 is not written yet (each rank holds a slice)");
    if (!dump_dir.empty() && cfg.expert_parallel > 1)
      throw BadInput("step --dump with --ep > 1 is not written yet (each rank holds its experts)");
    if (world_size(cfg) > 1 && !launched_by_mpi())
      return run_as_ranks(static_cast<int>(world_size(cfg)), step_flags.threads);
    auto dev = device_for(step_flags, cfg);
    auto model = make_model(cfg, tp_rank_of(launched_rank(), static_cast<int>(cfg.tensor_parallel)),
                            ep_rank_of(launched_rank(), static_cast<int>(cfg.tensor_parallel),
                                       static_cast<int>(cfg.expert_parallel)));
    if (!dump_dir.empty()) {
      if (write_step_dump(*dev, *model, cfg, dump_dir, init_dir))
        fmt::print("wrote step dump of {} to {}\n", cfg.model, dump_dir);
      return 0;
    }
    PointRunOptions one;
    one.warmup = 0;
    one.steps = 1;
    return run_point_and_print(*dev, *model, cfg, one);
  });
}

int cli_main(int argc, char** argv) {
  CLI::App app{"memtrade: memory/throughput trade-offs of deep-learning training"};
  app.name("memtrade");
  g_args.assign(argv + 1, argv + argc);
  app.require_subcommand(0, 1);
  bool show_version = false;
  app.add_flag("--version", show_version, "Print versions of memtrade and its libraries");

  Commands cmds;
  // ---- every module's subcommands (one line each) ----
  register_point_commands(app, cmds);
  register_gate_commands(app, cmds);
  register_changes_command(app, cmds);
  register_run_commands(app, cmds);
  register_report_commands(app, cmds);
  register_advise_commands(app, cmds);
  register_bisect_commands(app, cmds);
  register_trace_command(app, cmds);

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "memtrade: %s\n", one_line(e.what()).c_str());
    // Under `git bisect run` (bisect --check) exit 2 would mark the commit bad: stop it instead.
    const std::vector<std::string> args(argv + 1, argv + argc);
    if (!args.empty() && args[0] == "bisect" &&
        std::find(args.begin(), args.end(), "--check") != args.end())
      return kBisectCheckBadInput;
    return 2;
  }

  try {
    if (show_version) {
      std::fputs(version_text().c_str(), stdout);
      return 0;
    }
    for (const auto& c : cmds.list())
      if (c.app->parsed()) return c.action();
    std::fputs(app.help().c_str(), stdout);
    return 0;
  } catch (const BadInput& e) {
    std::fprintf(stderr, "memtrade: %s\n", one_line(e.what()).c_str());
    return rank_exit(2);
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "memtrade: %s\n", one_line(e.what()).c_str());
    return rank_exit(2);
  } catch (const OutOfMemory& e) {
    std::fprintf(stderr, "memtrade: %s\n", one_line(e.what()).c_str());
    return rank_exit(3);
  } catch (const std::bad_alloc&) {  // host memory, outside the allocator: an OOM all the same
    std::fprintf(stderr, "memtrade: out of memory: host memory exhausted (std::bad_alloc)\n");
    return rank_exit(3);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "memtrade: error: %s\n", one_line(e.what()).c_str());
    return rank_exit(1);
  }
}

}  // namespace memtrade
