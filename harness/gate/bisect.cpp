#include "harness/gate/bisect.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <optional>
#include <set>
#include <stdexcept>
#include <thread>

#include "harness/common/bad_input.h"
#include "harness/common/point_row.h"
#include "harness/common/process.h"
#include "harness/gate/compare.h"
#include "harness/gate/compare_ab.h"
#include "harness/gate/compare_report.h"
#include "models/config/input_text.h"

namespace memtrade {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

struct Commit {
  std::string sha, subject;
  std::string short_sha() const { return sha.substr(0, 10); }
};

struct GitOut {
  bool ok = false;
  std::string out, err;  // stdout without its last newline; stderr's last lines
};

// git without a shell; its stderr goes to a scratch file, so that only our one line reaches
// the user, and comes back in err for the message.
GitOut git(const fs::path& dir, const std::vector<std::string>& args) {
  const fs::path err = fs::temp_directory_path() / fmt::format("memtrade-git-{}.err", getpid());
  std::vector<std::string> argv = {"git", "-C", dir.string()};
  argv.insert(argv.end(), args.begin(), args.end());
  SpawnOptions o;
  o.search_path = true;
  o.stdout_mode = SpawnOptions::Stdout::capture;
  o.stderr_file = err;
  const ChildOutcome c = spawn(argv, o);
  std::error_code ec;
  fs::remove(err, ec);
  if (c.kind == ChildOutcome::Kind::exited && c.exit_code == 127)
    throw std::runtime_error("bisect needs git on PATH");
  GitOut g{c.kind == ChildOutcome::Kind::exited && c.exit_code == 0, c.stdout_text, c.stderr_tail};
  while (!g.out.empty() && (g.out.back() == '\n' || g.out.back() == '\r')) g.out.pop_back();
  return g;
}

struct Repo {
  fs::path top;  // the working tree's root

  static Repo open(const std::string& dir) {
    const GitOut g = git(dir, {"rev-parse", "--show-toplevel"});
    if (!g.ok || g.out.empty())
      throw BadInput(fmt::format("--repo {}: not a git repository", echo(dir, kEchoPathMax)));
    return {g.out};
  }
  // A full sha; BadInput naming the flag for anything that is not a commit here.
  std::string resolve(const std::string& flag, const std::string& rev) const {
    if (rev.empty() || rev.starts_with("-"))
      throw BadInput(fmt::format("{} '{}': expected a commit", flag, echo(rev)));
    const GitOut g =
        git(top, {"rev-parse", "--verify", "--quiet", "--end-of-options", rev + "^{commit}"});
    if (!g.ok)
      throw BadInput(fmt::format("{} '{}': no such commit in {}", flag, echo(rev),
                                 echo(top.string(), kEchoPathMax)));
    return g.out;
  }
  Commit commit(const std::string& sha) const {
    return {sha, git(top, {"log", "-1", "--format=%s", sha}).out};
  }
  bool is_ancestor(const std::string& a, const std::string& b) const {
    return git(top, {"merge-base", "--is-ancestor", a, b}).ok;
  }
  // GOOD..BAD on the first-parent line, oldest first; BAD is the last.
  std::vector<Commit> range(const std::string& good, const std::string& bad) const {
    const GitOut g = git(top, {"log", "--first-parent", "--ancestry-path", "--reverse",
                               "--format=%H%x09%s", good + ".." + bad});
    std::vector<Commit> out;
    std::size_t start = 0;
    while (start < g.out.size()) {
      std::size_t end = g.out.find('\n', start);
      if (end == std::string::npos) end = g.out.size();
      const std::string line = g.out.substr(start, end - start);
      const auto tab = line.find('\t');
      if (tab != std::string::npos) out.push_back({line.substr(0, tab), line.substr(tab + 1)});
      start = end + 1;
    }
    return out;
  }
};

// The work dir: a fresh temporary one (removed at the end) or the caller's (kept).
class WorkDir {
 public:
  explicit WorkDir(const std::string& given) : path_(given), temporary_(given.empty()) {
    if (!temporary_) {
      fs::create_directories(path_);
      path_ = fs::absolute(path_);
      return;
    }
    std::string tmpl = (fs::temp_directory_path() / "memtrade-bisect-XXXXXX").string();
    if (!mkdtemp(tmpl.data()))
      throw std::runtime_error(fmt::format("mkdtemp: {}", std::strerror(errno)));
    path_ = tmpl;
  }
  ~WorkDir() {
    std::error_code ec;
    if (temporary_) fs::remove_all(path_, ec);
  }
  WorkDir(const WorkDir&) = delete;
  WorkDir& operator=(const WorkDir&) = delete;
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
  bool temporary_;
};

// The one worktree every commit is built in: its build folder (untracked) stays between
// checkouts, so each build compiles only what the commit changed. Removed on destruction.
class Worktree {
 public:
  Worktree(const Repo& repo, fs::path path, const std::string& sha)
      : repo_(repo), path_(std::move(path)) {
    // A tree left by an interrupted bisect: start clean rather than trust its state.
    if (fs::exists(path_)) remove();
    const GitOut g =
        git(repo_.top, {"worktree", "add", "--detach", "--force", path_.string(), sha});
    if (!g.ok)
      throw std::runtime_error(
          fmt::format("git worktree add {}: {}", path_.string(), one_line(g.err)));
  }
  ~Worktree() { remove(); }
  Worktree(const Worktree&) = delete;
  Worktree& operator=(const Worktree&) = delete;

  void checkout(const std::string& sha) const {
    const GitOut g = git(path_, {"checkout", "--detach", "--force", "--quiet", sha});
    if (!g.ok)
      throw std::runtime_error(
          fmt::format("git checkout {} in {}: {}", sha, path_.string(), one_line(g.err)));
  }
  const fs::path& path() const { return path_; }

 private:
  void remove() const {
    git(repo_.top, {"worktree", "remove", "--force", path_.string()});
    std::error_code ec;
    fs::remove_all(path_, ec);
    git(repo_.top, {"worktree", "prune"});
  }
  const Repo& repo_;
  fs::path path_;
};

bool on_path(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "";
  std::size_t start = 0;
  while (start <= dirs.size()) {
    std::size_t end = dirs.find(':', start);
    if (end == std::string::npos) end = dirs.size();
    const std::string dir = dirs.substr(start, end - start);
    if (!dir.empty() && access((fs::path(dir) / name).c_str(), X_OK) == 0) return true;
    start = end + 1;
  }
  return false;
}

struct Built {
  bool ok = false;
  std::string why;  // when not: the exit status and the log's last lines
};

// The build command in `tree`, its output (stdout and stderr) into `log`.
Built build(const BisectOptions& o, const fs::path& tree, const fs::path& log) {
  const std::string cmd = o.build_cmd.empty() ? default_build_command() : o.build_cmd;
  SpawnOptions so;
  so.cwd = tree;
  so.stderr_file = log;
  // ccache keys on absolute paths unless told the tree's root: with it, every worktree and
  // checkout of the project shares one cache.
  so.env = {{"CCACHE_BASEDIR", tree.string()}};
  const ChildOutcome c = spawn({"/bin/sh", "-c", "exec 1>&2\n" + cmd}, so);
  const bool exited_ok = c.kind == ChildOutcome::Kind::exited && c.exit_code == 0;
  if (exited_ok && access((tree / o.binary).c_str(), X_OK) == 0) return {true, ""};
  std::string why = exited_ok ? fmt::format("no executable {} after the build", o.binary)
                    : c.kind == ChildOutcome::Kind::signaled
                        ? fmt::format("killed by {}", describe_signal(c.signal))
                        : fmt::format("exit {}", c.exit_code);
  if (!c.stderr_tail.empty()) why += ": " + c.stderr_tail;
  return {false, why};
}

enum class Step { good, bad, skip };
const char* step_name(Step s) {
  return s == Step::good ? "good" : s == Step::bad ? "bad" : "skip";
}

struct Judged {
  Step step = Step::skip;
  std::string value;  // what was measured, for the transcript
};

// Everything a step compares against: the good build and its measurement of the point.
struct Reference {
  AbOptions ab;  // base_bin: the good binary (a copy, outside the tree)
  std::string id;
  PointRow point;  // the good commit's run of the point
  fs::path runs;   // per-step results
};

std::optional<PointRow> point_of(const json& doc, const std::string& id) {
  try {
    for (PointRow& p : ResultsFile::from_json(doc, "results").points)
      if (p.id == id) return p;
  } catch (const BadInput&) {
  }
  return std::nullopt;
}

std::string failure_text(const PointRow& p) {
  return fmt::format("status {}{}", p.status, p.error ? ": " + one_line(*p.error) : "");
}

std::string signed_bytes(std::int64_t d) {
  return fmt::format("{}{}", d < 0 ? "-" : "+", detail::format_value("bytes", std::abs(double(d))));
}

Judged judge_memory(const Reference& ref, const std::string& bin, const fs::path& out) {
  const auto p = point_of(run_point(ref.ab, bin, ref.id, out, {}, nullptr), ref.id);
  if (!p) return {Step::skip, "no readable results"};
  if (!p->ok() || !p->memory) return {Step::bad, failure_text(*p)};
  const std::int64_t peak = p->memory->peak_allocated;
  const std::int64_t delta = peak - ref.point.memory->peak_allocated;
  return {delta == 0 ? Step::good : Step::bad,
          fmt::format("peak_allocated {} ({})", detail::format_value("bytes", double(peak)),
                      signed_bytes(delta))};
}

Judged judge_time(const BisectOptions& o, const Reference& ref, const std::string& bin,
                  const fs::path& dir) {
  AbOptions ab = ref.ab;
  ab.head_bin = bin;
  ab.work_dir = dir.string();
  Comparison c;
  try {
    AbResults r = run_ab(ab, nullptr);
    resample_inconclusive(ab, o.thresholds, r, nullptr);
    c = compare_results(results_from_json(r.base, "good"), results_from_json(r.head, "step"),
                        o.thresholds);
  } catch (const BadInput& e) {  // this commit's binary cannot list or run the point
    return {Step::skip, one_line(e.what())};
  }
  for (const CompareRow& row : c.rows) {
    if (row.point != ref.id) continue;
    if (row.metric == "status") {  // the good build failing this time says nothing of HEAD
      if (row.base_status != "ok")
        return {Step::skip, "the good build failed this time: status " + row.base_status};
      return {Step::bad, "status " + row.head_status};
    }
    if (row.metric != "median_s") continue;
    std::string value =
        fmt::format("median_s {} -> {} ({})", detail::format_value("s", row.base),
                    detail::format_value("s", row.head), detail::format_change(row));
    if (row.p) value += fmt::format(" p={:.2g}", row.p_adj.value_or(*row.p));
    if (row.verdict == Verdict::regression) return {Step::bad, value};
    if (row.verdict == Verdict::inconclusive) return {Step::skip, value + " inconclusive"};
    return {Step::good, value};
  }
  return {Step::skip, "no time measured"};
}

Judged judge(const BisectOptions& o, const Reference& ref, const std::string& bin,
             const std::string& label) {
  const fs::path out = ref.runs / label;
  if (o.metric == "time") return judge_time(o, ref, bin, out);
  return judge_memory(ref, bin, fs::path(out.string() + ".json"));
}

void check_options(const BisectOptions& o) {
  if (o.metric != "memory" && o.metric != "time")
    throw BadInput(fmt::format("--metric '{}': expected memory or time", echo(o.metric)));
  if (o.good.empty()) throw BadInput("bisect needs --good");
  if (!o.grid.empty() && o.select.empty())
    throw BadInput("bisect needs --select ID with --grid (the point to measure)");
  if (!o.grid.empty() && !fs::is_regular_file(o.grid))
    throw BadInput(fmt::format("--grid {}: no such file", echo(o.grid, kEchoPathMax)));
  if (o.rounds < 1) throw BadInput(fmt::format("--rounds must be >= 1 (got {})", o.rounds));
  if (o.max_extra_rounds < 0)
    throw BadInput(fmt::format("--max-extra-rounds must be >= 0 (got {})", o.max_extra_rounds));
  if (o.binary.empty() || fs::path(o.binary).is_absolute())
    throw BadInput(fmt::format("--binary '{}': expected a path relative to the tree",
                               echo(o.binary, kEchoPathMax)));
}

AbOptions ab_options(const BisectOptions& o) {
  AbOptions ab;
  if (!o.grid.empty()) ab.grid = fs::absolute(o.grid).string();
  ab.rounds = o.rounds;
  if (!o.backend.empty()) ab.run_args = {"--backend", o.backend};
  ab.run_args.insert(ab.run_args.end(), o.run_args.begin(), o.run_args.end());
  ab.max_extra_rounds = o.max_extra_rounds;
  ab.child_stderr_to_files = true;
  return ab;
}

// The good build's side of every step: its point id checked, its run of the point made.
Reference make_reference(const BisectOptions& o, const Commit& good, const fs::path& good_bin,
                         const fs::path& runs) {
  Reference ref;
  ref.ab = ab_options(o);
  ref.ab.base_bin = good_bin.string();
  ref.runs = runs;
  fs::create_directories(runs);
  const std::vector<std::string> ids = list_points(ref.ab, ref.ab.base_bin);
  const std::string where =
      o.grid.empty() ? "the point of the run flags" : "grid " + echo(o.grid, kEchoPathMax);
  if (o.select.empty()) {
    if (ids.size() != 1)
      throw BadInput(
          fmt::format("{} has {} points at the good commit: give --select", where, ids.size()));
    ref.id = ids.front();
  } else if (std::find(ids.begin(), ids.end(), o.select) == ids.end()) {
    throw BadInput(fmt::format("--select '{}': no such point in {} at the good commit {}",
                               echo(o.select), where, good.short_sha()));
  } else {
    ref.id = o.select;
  }
  ref.ab.select = {ref.id};
  const auto p =
      point_of(run_point(ref.ab, ref.ab.base_bin, ref.id, runs / "good.json", {}, nullptr), ref.id);
  if (!p || !p->ok() || !p->memory)
    throw BadInput(fmt::format("point {} does not run at the good commit {}: {}", ref.id,
                               good.short_sha(), p ? failure_text(*p) : "no readable results"));
  ref.point = *p;
  return ref;
}

std::string reference_value(const BisectOptions& o, const PointRow& p) {
  if (o.metric == "time" && p.time)
    return fmt::format("median_s {}", detail::format_value("s", p.time->median_s));
  return fmt::format("peak_allocated {}",
                     detail::format_value("bytes", double(p.memory->peak_allocated)));
}

void line(std::FILE* out, const std::string& tag, const Commit& c, const std::string& value,
          const std::string& verdict) {
  std::string subject = c.subject.size() > 36 ? c.subject.substr(0, 35) + "~" : c.subject;
  std::fprintf(out, "%-8s %s  %-36s  %-44s %s\n", tag.c_str(), c.short_sha().c_str(),
               subject.c_str(), value.c_str(), verdict.c_str());
  std::fflush(out);
}

// Copies the good binary out of the tree, which the next checkout rebuilds over.
fs::path keep_binary(const BisectOptions& o, const fs::path& tree, const fs::path& dir) {
  fs::create_directories(dir);
  const fs::path from = tree / o.binary, to = dir / fs::path(o.binary).filename();
  fs::copy_file(from, to, fs::copy_options::overwrite_existing);
  fs::permissions(to, fs::status(from).permissions());
  return to;
}

// The next commit to test in (lo, hi): the untested one nearest the middle, lower on a tie.
std::optional<int> next_candidate(int lo, int hi, const std::set<int>& skipped) {
  std::optional<int> best;
  for (int i = lo + 1; i < hi; ++i) {
    if (skipped.contains(i)) continue;
    if (!best || std::abs(2 * i - (lo + hi)) < std::abs(2 * *best - (lo + hi))) best = i;
  }
  return best;
}

}  // namespace

std::string default_build_command() {
  const unsigned jobs = std::max(1u, std::thread::hardware_concurrency());
  return fmt::format(
      "(test -f build/CMakeCache.txt || cmake -S . -B build -DCMAKE_BUILD_TYPE=Release "
      "-DMEMTRADE_CUDA=OFF{}) && cmake --build build -j{} --target memtrade",
      on_path("ccache") ? " -DCMAKE_CXX_COMPILER_LAUNCHER=ccache" : "", jobs);
}

BisectOutcome bisect(const BisectOptions& o, std::FILE* out) {
  check_options(o);
  if (o.bad.empty()) throw BadInput("bisect needs --bad (or --check, for git bisect run)");
  const Repo repo = Repo::open(o.repo);
  const std::string good_sha = repo.resolve("--good", o.good);
  const std::string bad_sha = repo.resolve("--bad", o.bad);
  if (good_sha == bad_sha) throw BadInput("--good and --bad name the same commit");
  if (!repo.is_ancestor(good_sha, bad_sha))
    throw BadInput(
        fmt::format("--good {} is not an ancestor of --bad {}", echo(o.good), echo(o.bad)));
  const std::vector<Commit> commits = repo.range(good_sha, bad_sha);
  if (commits.empty() || commits.back().sha != bad_sha)
    throw BadInput(fmt::format("--bad {} is not on the first-parent line after --good {}",
                               echo(o.bad), echo(o.good)));
  const Commit good = repo.commit(good_sha);

  const WorkDir work(o.work_dir);
  const Worktree tree(repo, work.path() / "tree", good_sha);
  BisectOutcome result;
  std::fprintf(out, "bisect %s: %zu commit%s after good %s, up to bad %s (work dir %s)\n",
               o.metric.c_str(), commits.size(), commits.size() == 1 ? "" : "s",
               good.short_sha().c_str(), commits.back().short_sha().c_str(), work.path().c_str());
  std::fflush(out);
  const Built good_built = build(o, tree.path(), work.path() / "build-good.log");
  if (!good_built.ok)
    throw BadInput(
        fmt::format("the good commit {} does not build ({})", good.short_sha(), good_built.why));
  const fs::path good_bin = keep_binary(o, tree.path(), work.path() / "good");
  const Reference ref = make_reference(o, good, good_bin, work.path() / "runs");
  line(out, "good", good, reference_value(o, ref.point), "reference (" + ref.id + ")");

  // commits[hi] is bad (BAD is trusted until the search ends on it), commits[lo] good (-1:
  // the good commit).
  const int n = static_cast<int>(commits.size());
  int lo = -1, hi = n - 1, step = 0;
  bool bad_measured = false;
  std::set<int> skipped;
  auto test = [&](int i) {
    const Commit& c = commits[static_cast<std::size_t>(i)];
    tree.checkout(c.sha);
    const Built b = build(o, tree.path(), work.path() / fmt::format("build-{}.log", c.short_sha()));
    const Judged j = b.ok ? judge(o, ref, (tree.path() / o.binary).string(), c.short_sha())
                          : Judged{Step::skip, "build failed: " + one_line(b.why)};
    line(out, fmt::format("step {}", ++step), c, j.value, step_name(j.step));
    return j.step;
  };
  for (;;) {
    const std::optional<int> i = next_candidate(lo, hi, skipped);
    if (!i) {
      // Every commit before BAD is good: measure BAD rather than name it untested.
      if (hi == n - 1 && !bad_measured && skipped.empty()) {
        bad_measured = true;
        const Step s = test(hi);
        if (s == Step::good) {
          std::fprintf(out, "no change: every commit up to bad %s measures as good\n",
                       commits.back().short_sha().c_str());
          result.kind = BisectOutcome::Kind::no_change;
          return result;
        }
      }
      break;
    }
    const Step s = test(*i);
    if (s == Step::good) lo = *i;
    if (s == Step::bad) hi = *i;
    if (s == Step::skip) skipped.insert(*i);
  }
  std::vector<std::string> suspects;
  for (int i = lo + 1; i < hi; ++i) suspects.push_back(commits[static_cast<std::size_t>(i)].sha);
  const Commit& first = commits[static_cast<std::size_t>(hi)];
  if (!suspects.empty()) {
    suspects.push_back(first.sha);
    std::fprintf(out, "only skipped commits are left: the first bad commit is one of\n");
    for (const auto& sha : suspects) std::fprintf(out, "  %s\n", sha.c_str());
    result.kind = BisectOutcome::Kind::ambiguous;
    result.suspects = suspects;
    return result;
  }
  std::fprintf(out, "first bad commit: %s %s\n", first.sha.c_str(), first.subject.c_str());
  result.sha = first.sha;
  result.subject = first.subject;
  return result;
}

int bisect_check(const BisectOptions& o, std::FILE* out) {
  check_options(o);
  if (!o.bad.empty())
    throw BadInput("--check judges the current checkout against --good: it takes no --bad");
  const Repo repo = Repo::open(o.repo);
  const std::string good_sha = repo.resolve("--good", o.good);
  const Commit good = repo.commit(good_sha);
  const Commit head = repo.commit(repo.resolve("HEAD", "HEAD"));
  fs::path work_dir = o.work_dir;
  if (work_dir.empty()) {
    const GitOut g = git(repo.top, {"rev-parse", "--path-format=absolute", "--git-common-dir"});
    if (!g.ok) throw std::runtime_error("git rev-parse --git-common-dir: " + g.err);
    work_dir = fs::path(g.out) / "memtrade-bisect";
  }
  const WorkDir work(work_dir.string());

  // The good build is made once for all of git bisect run's steps: kept, keyed by what it is.
  const std::string key =
      fmt::format("{}-{:08x}", good.short_sha(),
                  std::hash<std::string>{}(o.build_cmd + '\n' + o.binary) & 0xffffffffu);
  const fs::path good_dir = work.path() / ("good-" + key);
  const fs::path good_bin = good_dir / fs::path(o.binary).filename();
  if (access(good_bin.c_str(), X_OK) != 0) {
    const Worktree tree(repo, work.path() / "tree", good_sha);
    const Built b = build(o, tree.path(), work.path() / "build-good.log");
    if (!b.ok)
      throw BadInput(
          fmt::format("the good commit {} does not build ({})", good.short_sha(), b.why));
    keep_binary(o, tree.path(), good_dir);
  }

  // The reference first: a point the good build does not have is bad input, whatever HEAD is.
  const Reference ref = make_reference(o, good, good_bin, work.path() / "runs");
  line(out, "good", good, reference_value(o, ref.point), "reference (" + ref.id + ")");
  const Built b = build(o, repo.top, work.path() / "build-head.log");
  if (!b.ok) {
    line(out, "check", head, "build failed: " + one_line(b.why), "skip");
    return 125;
  }
  const Judged j = judge(o, ref, (repo.top / o.binary).string(), head.short_sha());
  line(out, "check", head, j.value, step_name(j.step));
  return j.step == Step::good ? 0 : j.step == Step::bad ? 1 : 125;
}

}  // namespace memtrade
