// Issue 31, faults: what the outside world does to a run — kill -9 of the parent or of a point's
// process, a full disk, outputs that cannot be written, host memory that runs out — never loses a
// point already measured, never leaves litter (temporaries, lock files, scratch folders), and
// ends with one line and the documented exit code. (Two runs on one --out, and --resume with
// other settings: test_hardening.cpp.)
#include <gtest/gtest.h>

#include <chrono>
#include <csignal>
#include <map>
#include <set>
#include <thread>

#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>

#include "fixtures/gate_fixtures.h"

namespace memtrade {
namespace {

using testing::CliResult;
using testing::json;
using testing::read_file;
using testing::run_cli;
using testing::TempDir;
using testing::write_file;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// Eight mlp-tiny points of about 40 steps each: long enough to be killed in the middle of one.
constexpr const char* kGrid =
    "[run]\nbackend = \"cpu\"\nwarmup = 1\nsteps = 40\n"
    "[axes]\nmodel = [\"mlp-tiny\"]\nbatch_size = [2, 3, 4, 5, 6, 7, 8, 9]\n";

// The results file if it is there and whole, else null (it is replaced atomically: never half).
json points_of(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return nullptr;
  return json::parse(read_file(path))["points"];
}

// Files beside `dir`'s results that a finished run must not leave: temporaries, lock files.
std::vector<std::string> litter(const fs::path& dir) {
  std::vector<std::string> found;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name.ends_with(".tmp") || name.ends_with(".lock") || name.starts_with("memtrade-"))
      found.push_back(name);
  }
  return found;
}

pid_t start_run(const std::vector<std::string>& args, const fs::path& tmpdir) {
  const pid_t pid = fork();
  if (pid == 0) {
    setenv("TMPDIR", tmpdir.c_str(), 1);
    std::vector<char*> argv{const_cast<char*>(MEMTRADE_BINARY)};
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(MEMTRADE_BINARY, argv.data());
    _exit(127);
  }
  return pid;
}

// The pids whose parent is `parent` (from /proc): the run's point processes.
std::vector<pid_t> children_of(pid_t parent) {
  std::vector<pid_t> kids;
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::string stat;
    try {
      stat = read_file((e.path() / "stat").string());
    } catch (...) {
      continue;  // gone meanwhile
    }
    const auto close = stat.rfind(')');
    if (close == std::string::npos) continue;
    int ppid = 0;
    char state = 0;
    if (std::sscanf(stat.c_str() + close + 1, " %c %d", &state, &ppid) == 2 && ppid == parent)
      kids.push_back(static_cast<pid_t>(std::stol(name)));
  }
  return kids;
}

// Running or sleeping: not gone, and not a zombie (an orphan that died is one until an init that
// reaps reaps it; some containers' init never does).
bool alive(pid_t pid) {
  std::string stat;
  try {
    stat = read_file(fmt::format("/proc/{}/stat", pid));
  } catch (...) {
    return false;
  }
  const auto close = stat.rfind(')');
  if (stat.empty() || close == std::string::npos || close + 2 >= stat.size()) return false;
  const char state = stat[close + 2];
  return state != 'Z' && state != 'X';
}

// kill -9 of `memtrade run` at three moments (before its first point ends, after one, in the
// middle of a later one): the file is absent or whole each time, the point process dies with
// its parent, and --resume ends with every point exactly once and no litter anywhere.
TEST(Faults, KillNineOfTheParentAtAnyMomentThenResume) {
  TempDir dir;
  write_file(dir.file("g.toml"), kGrid);
  const std::string out = dir.file("r.json");
  const std::vector<std::string> args = {"run",     "--grid", dir.file("g.toml"),
                                         "--quiet", "--out",  out};
  std::map<std::string, json> seen;  // every point some run finished, as it was then
  for (const std::size_t wait_for : {0u, 1u, 3u}) {
    SCOPED_TRACE(fmt::format("killed after {} points", wait_for));
    std::vector<std::string> resume = args;
    resume.push_back("--resume");
    const pid_t pid = start_run(resume, dir.path());
    const auto deadline = Clock::now() + std::chrono::seconds(60);
    std::vector<pid_t> kids;
    for (;;) {
      const json p = points_of(out);
      kids = children_of(pid);
      const std::size_t done = p.is_null() ? 0 : p.size();
      if (done >= std::min<std::size_t>(seen.size() + wait_for, 8) && !kids.empty()) break;
      if (done == 8 || Clock::now() > deadline) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    const json p = points_of(out);  // parses: never half a file
    if (!p.is_null())
      for (const auto& row : p) {
        const std::string id = row["id"];
        if (seen.count(id)) {
          EXPECT_EQ(row, seen[id]) << "a saved point changed";
        }
        seen[id] = row;
      }
    // The point process dies with its parent (PR_SET_PDEATHSIG), instead of running on.
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    for (pid_t kid : kids) EXPECT_FALSE(alive(kid)) << "point process " << kid << " lives";
  }
  setenv("TMPDIR", dir.path().c_str(), 1);
  const CliResult r =
      run_cli("run --grid " + dir.file("g.toml") + " --quiet --resume --out " + out);
  unsetenv("TMPDIR");
  ASSERT_EQ(r.rc, 0) << r.err;
  std::set<std::string> ids;
  for (const auto& row : points_of(out)) {
    EXPECT_TRUE(ids.insert(row["id"]).second) << "repeated " << row["id"];
    EXPECT_EQ(row["status"], "ok");
    if (seen.count(row["id"])) {
      EXPECT_EQ(row, seen[row["id"]]) << "a finished point was rerun";
    }
  }
  EXPECT_EQ(ids.size(), 8u);
  // The scratch folders of the killed runs (TMPDIR was the test's folder) and their lock and
  // temporary files are gone after the resume.
  EXPECT_EQ(litter(dir.path()), std::vector<std::string>{});
}

// kill -9 of a point's own process (the OOM killer does this): that point is an error row naming
// the signal, the run goes on with the next, and exits 1.
TEST(Faults, KillNineOfAPointProcessIsARow) {
  TempDir dir;
  write_file(dir.file("g.toml"),
             "[run]\nbackend = \"cpu\"\nwarmup = 0\nsteps = 1\n"
             "[axes]\nmodel = [\"mlp-tiny\"]\nbatch_size = [2, 4, 8]\n");
  const std::string out = dir.file("r.json");
  setenv("MEMTRADE_FAULT", "hang:/b4/", 1);  // the second point waits to be killed
  const pid_t pid =
      start_run({"run", "--grid", dir.file("g.toml"), "--quiet", "--timeout", "60s", "--out", out},
                dir.path());
  unsetenv("MEMTRADE_FAULT");
  const auto deadline = Clock::now() + std::chrono::seconds(60);
  std::vector<pid_t> kids;
  while (Clock::now() < deadline) {
    const json p = points_of(out);
    kids = children_of(pid);
    if (!p.is_null() && p.size() == 1 && !kids.empty()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(kids.size(), 1u);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // in its hang, past exec
  kill(kids[0], SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 1);
  const json p = points_of(out);
  ASSERT_EQ(p.size(), 3u);
  EXPECT_EQ(p[0]["status"], "ok");
  EXPECT_EQ(p[1]["status"], "error");
  EXPECT_NE(p[1]["error"].get<std::string>().find("crashed: Killed (signal 9)"), std::string::npos)
      << p[1]["error"];
  EXPECT_EQ(p[2]["status"], "ok");
  EXPECT_EQ(litter(dir.path()), std::vector<std::string>{});
}

// A disk that fills up: results on a 64 KiB tmpfs, a grid whose file outgrows it. The file keeps
// every point saved before, the point just measured is printed on stdout, the run says so in
// one line and exits 1, no temporary is left, and --resume on a larger disk finishes the grid
// without rerunning a saved point. Skipped, with the reason, where no tmpfs can be mounted
// (neither root nor user namespaces).
TEST(Faults, AFullDiskLosesNoPoint) {
  TempDir dir;
  std::string grid =
      "[run]\nbackend = \"cpu\"\nwarmup = 0\nsteps = 1\n[axes]\nmodel = "
      "[\"mlp-tiny\"]\nbatch_size = [";
  for (int b = 1; b <= 24; ++b) grid += fmt::format("{}{}", b > 1 ? ", " : "", b);
  write_file(dir.file("g.toml"), grid + "]\n");
  fs::create_directories(dir.path() / "disk");
  // One shell in its own mount namespace: mount, fill, copy what is there out, grow, resume.
  const std::string script = fmt::format(
      "set -u; cd {dir}; mount -t tmpfs -o size=64k tmpfs disk || exit 77; "
      "{bin} run --grid g.toml --out disk/r.json --quiet >row.txt 2>err.txt; echo $? >rc.txt; "
      "ls -a disk >after.txt; cp disk/r.json first.json; "
      "mount -o remount,size=4m disk && {bin} run --grid g.toml --out disk/r.json --quiet "
      "--resume >/dev/null 2>resume_err.txt; echo $? >resume_rc.txt; cp disk/r.json final.json; "
      "ls -a disk >final_ls.txt; umount disk",
      fmt::arg("dir", dir.path().string()), fmt::arg("bin", MEMTRADE_BINARY));
  write_file(dir.file("s.sh"), script);
  const std::string sh =
      geteuid() == 0 ? "unshare -m sh " + dir.file("s.sh") : "unshare -rm sh " + dir.file("s.sh");
  const int status = std::system((sh + " >/dev/null 2>" + dir.file("sh_err.txt")).c_str());
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || !fs::exists(dir.file("rc.txt")))
    GTEST_SKIP() << "cannot mount a tmpfs here (needs root or user namespaces): "
                 << read_file(dir.file("sh_err.txt"));
  EXPECT_EQ(read_file(dir.file("rc.txt")), "1\n");
  const std::string err = read_file(dir.file("err.txt"));
  EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
  EXPECT_NE(err.find("No space left on device"), std::string::npos) << err;
  EXPECT_NE(err.find("is on stdout"), std::string::npos) << err;
  const json first = json::parse(read_file(dir.file("first.json")))["points"];
  ASSERT_GE(first.size(), 1u);
  ASSERT_LT(first.size(), 24u);  // the disk did fill up
  // The point measured when the disk was full: on stdout, one JSON row, the next in grid order.
  const json row = json::parse(read_file(dir.file("row.txt")));
  EXPECT_EQ(row["id"], fmt::format("mlp-tiny/b{}/a1/fp32/ck0/adam/off-none/zg-set_to_none/train/"
                                   "ec-never/in-pinned",
                                   first.size() + 1));
  EXPECT_EQ(row["status"], "ok");
  EXPECT_EQ(read_file(dir.file("after.txt")), ".\n..\nr.json\n");  // no temporary, no lock
  EXPECT_EQ(read_file(dir.file("resume_rc.txt")), "0\n") << read_file(dir.file("resume_err.txt"));
  const json final_points = json::parse(read_file(dir.file("final.json")))["points"];
  ASSERT_EQ(final_points.size(), 24u);
  for (std::size_t i = 0; i < first.size(); ++i) EXPECT_EQ(final_points[i], first[i]);
  EXPECT_EQ(read_file(dir.file("final_ls.txt")), ".\n..\nr.json\n");
}

// Every output a run would write is checked before its first point: exit 2 and one line naming
// the flag and the reason, nothing run, nothing left (before: --csv into a missing folder was
// exit 0 with no CSV; --trace under a file turned a measured point into an error row; an --out
// that is a folder was exit 1 naming a hidden temporary, which stayed).
TEST(Faults, OutputsThatCannotBeWrittenAreRefusedBeforeTheFirstPoint) {
  TempDir dir;
  write_file(dir.file("file"), "x");
  fs::create_directories(dir.path() / "folder");
  const std::string point = "run --backend cpu --model mlp-tiny --steps 1 --warmup 0 --quiet ";
  for (const auto& [flags, what] : std::vector<std::pair<std::string, std::string>>{
           {"--out " + dir.file("folder"),
            "--out " + dir.file("folder") + ": cannot write there: it is a folder"},
           {"--out " + dir.file("file/r.json"),
            "cannot write there: " + dir.file("file") + " is a file"},
           {"--out " + dir.file("r.json") + " --csv " + dir.file("file/x.csv"), "--csv"},
           {"--out " + dir.file("r.json") + " --trace " + dir.file("file/t.json"), "--trace"},
           {"--out " + dir.file("r.json") + " --trace-snapshot " + dir.file("file/t.pickle"),
            "--trace-snapshot"},
           {"--out /proc/r.json", "--out /proc/r.json: cannot write there"}}) {
    SCOPED_TRACE(flags);
    const CliResult r = run_cli(point + flags);
    EXPECT_EQ(r.rc, 2);
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_NE(r.err.find(what), std::string::npos) << r.err;
    EXPECT_FALSE(fs::exists(dir.file("r.json")));
  }
  EXPECT_EQ(litter(dir.path()), std::vector<std::string>{});
  // The other commands' outputs, the same way.
  ASSERT_EQ(run_cli(point + "--out " + dir.file("r.json")).rc, 0);
  for (const std::string& cmd :
       {"export " + dir.file("r.json") + " -o " + dir.file("folder"),
        "merge " + dir.file("r.json") + " -o " + dir.file("file/m.json"),
        "trace " + dir.file("r.json") + " --format torch-snapshot -o " + dir.file("folder"),
        "compare " + dir.file("r.json") + " " + dir.file("r.json") + " -o " + dir.file("folder"),
        "compare " + dir.file("r.json") + " " + dir.file("r.json") + " --write-junit " +
            dir.file("file/j.xml")}) {
    SCOPED_TRACE(cmd);
    const CliResult r = run_cli(cmd);
    EXPECT_EQ(r.rc, 2);
    EXPECT_NE(r.err.find("cannot write there"), std::string::npos) << r.err;
  }
  // A CSV into a folder that is not there yet: made, as --out's is.
  ASSERT_EQ(run_cli(point + "--out " + dir.file("s.json") + " --csv " + dir.file("new/s.csv")).rc,
            0);
  EXPECT_TRUE(fs::exists(dir.file("new/s.csv")));
  EXPECT_EQ(litter(dir.path()), std::vector<std::string>{});
}

// Host memory that runs out outside the allocator (std::bad_alloc from a library's buffer) is an
// oom row with the allocator's figures, like the allocator's own OOM; and where the address
// space is capped (ulimit -v), the allocator's failed request is one too, and `step` exits 3.
TEST(Faults, HostMemoryExhaustedIsAnOomRow) {
  TempDir dir;
  setenv("MEMTRADE_FAULT", "bad_alloc:mlp-tiny", 1);
  const CliResult r = run_cli(
      "run --backend cpu --model mlp-tiny --steps 1 --warmup 0 --quiet "
      "--out " +
      dir.file("r.json"));
  unsetenv("MEMTRADE_FAULT");
  EXPECT_EQ(r.rc, 0) << r.err;  // an oom is a measured outcome, not a failure of the run
  const json p = json::parse(read_file(dir.file("r.json")))["points"][0];
  EXPECT_EQ(p["status"], "oom");
  EXPECT_NE(p["error"].get<std::string>().find("std::bad_alloc"), std::string::npos);
  EXPECT_TRUE(p["memory"].is_object());
  // 3 GB of address space; gpt-tiny at batch 8192 asks for more (host memory, no --capacity).
  const std::string capped = fmt::format("ulimit -v 3000000; {} ", MEMTRADE_BINARY);
  TempDir io;
  const int st = std::system((capped + "step --backend cpu --model gpt-tiny --batch-size 8192 >" +
                              io.file("o") + " 2>" + io.file("e"))
                                 .c_str());
  EXPECT_EQ(WEXITSTATUS(st), 3) << read_file(io.file("e"));
  EXPECT_NE(read_file(io.file("e")).find("out of memory: tried to allocate"), std::string::npos);
  const int rs = std::system((capped +
                              "run --backend cpu --model gpt-tiny --batch-size 8192 "
                              "--steps 1 --warmup 0 --quiet --out " +
                              dir.file("u.json") + " 2>" + io.file("e2"))
                                 .c_str());
  EXPECT_EQ(WEXITSTATUS(rs), 0) << read_file(io.file("e2"));
  const json u = json::parse(read_file(dir.file("u.json")))["points"][0];
  EXPECT_EQ(u["status"], "oom");
  EXPECT_NE(u["error"].get<std::string>().find("(host memory)"), std::string::npos);
  EXPECT_GT(u["memory"]["peak_allocated"].get<std::int64_t>(), 0);
}

// A results file nested 100,000 levels deep is bad input for every reader, never a crash.
TEST(Faults, ADeeplyNestedResultsFileIsBadInput) {
  TempDir dir;
  write_file(dir.file("deep.json"),
             "{\"schema\":\"memtrade.results/1\",\"meta\":{},\"points\":[{\"id\":" +
                 std::string(100000, '[') + std::string(100000, ']') + "}]}");
  for (const std::string& cmd : {"export " + dir.file("deep.json"),
                                 "compare " + dir.file("deep.json") + " " + dir.file("deep.json"),
                                 "merge " + dir.file("deep.json") + " -o " + dir.file("m.json")}) {
    SCOPED_TRACE(cmd);
    const CliResult r = run_cli(cmd);
    EXPECT_EQ(r.rc, 2);
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err.substr(0, 300);
    EXPECT_NE(r.err.find("nested deeper than 64 levels"), std::string::npos)
        << r.err.substr(0, 300);
  }
}

// A loss that becomes NaN (rope_theta 1e-300 passes "> 0" and is 0 as a float) keeps the row's
// memory and time, and the file reads back (before: the loss was null, the parent refused the
// row, the measurements were gone).
TEST(Faults, ANonFiniteLossKeepsTheRowsMeasurements) {
  TempDir dir;
  const json cfg = {{"architectures", {"LlamaForCausalLM"}},
                    {"hidden_size", 64},
                    {"num_hidden_layers", 2},
                    {"num_attention_heads", 4},
                    {"num_key_value_heads", 2},
                    {"intermediate_size", 128},
                    {"vocab_size", 256},
                    {"max_position_embeddings", 32},
                    {"rope_theta", 1e-300}};
  write_file(dir.file("c.json"), cfg.dump());
  const CliResult r = run_cli("run --backend cpu --model-config " + dir.file("c.json") +
                              " --seq-len 16 --batch-size 2 --steps 2 --warmup 0 --quiet --out " +
                              dir.file("r.json"));
  ASSERT_TRUE(r.rc == 0 || r.rc == 1) << r.err;
  const json p = json::parse(read_file(dir.file("r.json")))["points"][0];
  // 1e-300 is 0 as a float on every CPU (IEEE): the inverse frequencies are inf, the loss NaN.
  EXPECT_EQ(p["status"], "error");
  EXPECT_EQ(p["error"].get<std::string>().rfind("non-finite loss", 0), 0u) << p["error"];
  EXPECT_GT(p["memory"]["peak_allocated"].get<std::int64_t>(), 0);
  EXPECT_GT(p["time"]["median_s"].get<double>(), 0);
  EXPECT_EQ(run_cli("export " + dir.file("r.json")).rc, 0);
  // `step` prints its figures, exits 1 and says why on stderr (before: exit 1, nothing said).
  const CliResult step = run_cli("step --backend cpu --model-config " + dir.file("c.json") +
                                 " --seq-len 16 --batch-size 2");
  EXPECT_EQ(step.rc, 1);
  EXPECT_NE(step.out.find("peak memory"), std::string::npos);
  EXPECT_EQ(step.err.rfind("memtrade: non-finite loss (", 0), 0u) << step.err;
  EXPECT_EQ(std::count(step.err.begin(), step.err.end(), '\n'), 1) << step.err;
}

}  // namespace
}  // namespace memtrade
