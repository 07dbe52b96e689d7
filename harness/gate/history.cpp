#include "harness/gate/history.h"

#include <fmt/format.h>
#include <fnmatch.h>

#include <cstdio>
#include <ctime>
#include <filesystem>

#include "harness/common/bad_input.h"
#include "harness/common/stats.h"
#include "harness/gate/compare.h"
#include "models/config/input_text.h"

#ifdef MEMTRADE_HAVE_SQLITE
#include <sqlite3.h>
#endif

namespace memtrade {

using nlohmann::json;

std::string machine_fingerprint(const json& meta) {
  auto field = [&](const char* k) {
    return meta.is_object() && meta.contains(k) && meta[k].is_string() ? meta[k].get<std::string>()
                                                                       : std::string();
  };
  const std::string key = field("host") + "|" + field("device") + "|" + field("backend");
  uint64_t h = 14695981039346656037ull;  // FNV-1a offset basis
  for (unsigned char ch : key) {
    h ^= ch;
    h *= 1099511628211ull;  // FNV prime
  }
  return fmt::format("{:016x}", h);
}

#ifndef MEMTRADE_HAVE_SQLITE

namespace {
[[noreturn]] void no_sqlite() {
  throw BadInput("history: built without SQLite");
}
}  // namespace
int64_t history_add(const std::string&, const json&, const HistoryAddOptions&) {
  no_sqlite();
}
std::vector<HistoryRun> history_list(const std::string&) {
  no_sqlite();
}
std::vector<TrendRow> history_trend(const std::string&, const TrendQuery&) {
  no_sqlite();
}
std::vector<HistorySeries> history_series(const std::string&, const std::string&,
                                          const std::string&, const std::string&) {
  no_sqlite();
}
std::optional<json> history_baseline(const std::string&, const BaselineQuery&) {
  no_sqlite();
}

#else

namespace {

constexpr const char* kSchema = R"sql(
CREATE TABLE IF NOT EXISTS runs(id INTEGER PRIMARY KEY, commit_hash TEXT, branch TEXT, time TEXT,
                                machine TEXT, backend TEXT, device TEXT, grid TEXT, meta_json TEXT);
CREATE TABLE IF NOT EXISTS points(run_id INTEGER REFERENCES runs(id), point_id TEXT,
                                  config_json TEXT, status TEXT, peak_allocated INTEGER,
                                  peak_reserved INTEGER, predicted_peak INTEGER, median_s REAL,
                                  samples_per_s REAL, tokens_per_s REAL, samples_json TEXT,
                                  PRIMARY KEY(run_id, point_id));
)sql";

class Db {
 public:
  Db(const std::string& path, bool create) : path_(path) {
    if (!create && !std::filesystem::exists(path))
      throw BadInput(fmt::format("{}: no such history database", path));
    const int flags = SQLITE_OPEN_READWRITE | (create ? SQLITE_OPEN_CREATE : 0);
    if (sqlite3_open_v2(path.c_str(), &db_, flags, nullptr) != SQLITE_OK) {
      std::string msg = db_ ? sqlite3_errmsg(db_) : "out of memory";
      sqlite3_close(db_);
      throw BadInput(fmt::format("{}: cannot open history database: {}", path, msg));
    }
    sqlite3_busy_timeout(db_, 10000);
    exec(kSchema);
  }
  ~Db() { sqlite3_close(db_); }
  Db(const Db&) = delete;
  Db& operator=(const Db&) = delete;

  void exec(const char* sql) {
    char* err = nullptr;
    if (sqlite3_exec(db_, sql, nullptr, nullptr, &err) != SQLITE_OK) {
      std::string msg = err ? err : "unknown error";
      sqlite3_free(err);
      throw BadInput(fmt::format("{}: {}", path_, msg));
    }
  }
  sqlite3* get() const { return db_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  sqlite3* db_ = nullptr;
};

class Stmt {
 public:
  Stmt(Db& db, const std::string& sql) : db_(db) {
    if (sqlite3_prepare_v2(db.get(), sql.c_str(), -1, &s_, nullptr) != SQLITE_OK)
      throw BadInput(fmt::format("{}: {}", db.path(), sqlite3_errmsg(db.get())));
  }
  ~Stmt() { sqlite3_finalize(s_); }
  Stmt(const Stmt&) = delete;
  Stmt& operator=(const Stmt&) = delete;

  void text(int i, const std::string& v) {
    sqlite3_bind_text(s_, i, v.c_str(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
  }
  void integer(int i, int64_t v) { sqlite3_bind_int64(s_, i, v); }
  // A JSON number (or null/missing) into an INTEGER or REAL column.
  void number(int i, const json& v, bool as_int) {
    if (!v.is_number())
      sqlite3_bind_null(s_, i);
    else if (as_int)
      sqlite3_bind_int64(s_, i, v.get<int64_t>());
    else
      sqlite3_bind_double(s_, i, v.get<double>());
  }
  bool step() {
    const int rc = sqlite3_step(s_);
    if (rc == SQLITE_ROW) return true;
    if (rc == SQLITE_DONE) return false;
    throw BadInput(fmt::format("{}: {}", db_.path(), sqlite3_errmsg(db_.get())));
  }
  void reset() {
    sqlite3_reset(s_);
    sqlite3_clear_bindings(s_);
  }
  std::string col_text(int i) const {
    const unsigned char* t = sqlite3_column_text(s_, i);
    return t ? reinterpret_cast<const char*>(t) : "";
  }
  bool is_null(int i) const { return sqlite3_column_type(s_, i) == SQLITE_NULL; }
  int64_t col_int(int i) const { return sqlite3_column_int64(s_, i); }
  double col_double(int i) const { return sqlite3_column_double(s_, i); }
  json col_number(int i, bool as_int) const {
    if (is_null(i)) return nullptr;
    return as_int ? json(col_int(i)) : json(col_double(i));
  }

 private:
  Db& db_;
  sqlite3_stmt* s_ = nullptr;
};

std::string utc_now() {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

void check_metric_column(const std::string& metric) {
  static const char* const kColumns[] = {"peak_allocated", "peak_reserved", "predicted_peak",
                                         "median_s",       "samples_per_s", "tokens_per_s"};
  for (const char* c : kColumns)
    if (metric == c) return;
  throw BadInput(
      fmt::format("--metric {}: expected peak_allocated, peak_reserved, "
                  "predicted_peak, median_s, samples_per_s or tokens_per_s",
                  echo(metric)));
}

std::string meta_text(const json& meta, const char* key) {
  return meta.contains(key) && meta[key].is_string() ? meta[key].get<std::string>() : "";
}

}  // namespace

int64_t history_add(const std::string& path, const json& doc, const HistoryAddOptions& o) {
  const ResultsFile results = ResultsFile::from_json(doc, "history add");
  Db db(path, true);
  json meta = results.meta;
  meta["gate"] = o.gate;
  const std::string branch = o.branch.empty() ? "local" : o.branch;
  db.exec("BEGIN IMMEDIATE");
  try {
    Stmt run(db,
             "INSERT INTO runs(commit_hash, branch, time, machine, backend, device, grid, "
             "meta_json) VALUES(?,?,?,?,?,?,?,?)");
    run.text(1, meta_text(meta, "commit"));
    run.text(2, branch);
    const std::string time = meta_text(meta, "time");
    run.text(3, time.empty() ? utc_now() : time);
    run.text(4, machine_fingerprint(meta));
    run.text(5, meta_text(meta, "backend"));
    run.text(6, meta_text(meta, "device"));
    run.text(7, meta_text(meta, "grid"));
    run.text(8, meta.dump());
    run.step();
    const int64_t run_id = sqlite3_last_insert_rowid(db.get());
    // INSERT OR REPLACE: a resumed results file may repeat a point; the last record wins.
    Stmt pt(db,
            "INSERT OR REPLACE INTO points(run_id, point_id, config_json, status, "
            "peak_allocated, peak_reserved, predicted_peak, median_s, samples_per_s, "
            "tokens_per_s, samples_json) VALUES(?,?,?,?,?,?,?,?,?,?,?)");
    for (const PointRow& p : results.points) {
      auto num = [](auto v) { return v ? json(*v) : json(nullptr); };
      pt.integer(1, run_id);
      pt.text(2, p.id);
      pt.text(3, p.config.dump());
      pt.text(4, p.status);
      pt.number(5, p.memory ? json(p.memory->peak_allocated) : json(), true);
      pt.number(6, p.memory ? json(p.memory->peak_reserved) : json(), true);
      pt.number(7, p.memory ? num(p.memory->predicted_peak) : json(), true);
      pt.number(8, p.time ? json(p.time->median_s) : json(), false);
      pt.number(9, p.throughput ? json(p.throughput->samples_per_s) : json(), false);
      pt.number(10, p.throughput ? json(p.throughput->tokens_per_s) : json(), false);
      if (p.time) pt.text(11, json(p.time->samples_s).dump());
      pt.step();
      pt.reset();
    }
    db.exec("COMMIT");
    return run_id;
  } catch (...) {
    db.exec("ROLLBACK");
    throw;
  }
}

std::vector<HistoryRun> history_list(const std::string& path) {
  Db db(path, false);
  Stmt s(db,
         "SELECT r.id, r.commit_hash, r.branch, r.time, r.machine, r.backend, r.device, r.grid, "
         "r.meta_json, (SELECT count(*) FROM points p WHERE p.run_id = r.id) FROM runs r "
         "ORDER BY r.time, r.id");
  std::vector<HistoryRun> out;
  while (s.step()) {
    HistoryRun r{s.col_int(0),  s.col_text(1), s.col_text(2), s.col_text(3), s.col_text(4),
                 s.col_text(5), s.col_text(6), s.col_text(7), "none",        s.col_int(9)};
    const json meta = json::parse(s.col_text(8), nullptr, false);
    if (meta.is_object() && meta.contains("gate") && meta["gate"].is_string())
      r.gate = meta["gate"].get<std::string>();
    out.push_back(std::move(r));
  }
  return out;
}

std::vector<TrendRow> history_trend(const std::string& path, const TrendQuery& q) {
  check_metric_column(q.metric);
  Db db(path, false);
  // The column name comes from the whitelist above, never from raw input.
  std::string sql = fmt::format(
      "SELECT r.commit_hash, r.time, p.point_id, p.{0}, p.config_json FROM points p "
      "JOIN runs r ON p.run_id = r.id WHERE p.{0} IS NOT NULL",
      q.metric);
  if (!q.branch.empty()) sql += " AND r.branch = ?1";
  if (!q.machine.empty()) sql += " AND r.machine = ?2";
  sql += " ORDER BY r.time, r.id, p.point_id";
  Stmt s(db, sql);
  if (!q.branch.empty()) s.text(1, q.branch);
  if (!q.machine.empty()) s.text(2, q.machine);
  std::vector<TrendRow> out;
  while (s.step()) {
    const json cfg = json::parse(s.col_text(4), nullptr, false);
    ConfigMap flat = flatten_config(cfg.is_object() ? cfg : json::object());
    flat["id"] = s.col_text(2);
    bool match = true;
    for (const auto& [k, pattern] : q.where) {
      auto it = flat.find(k);
      match = match && it != flat.end() && fnmatch(pattern.c_str(), it->second.c_str(), 0) == 0;
    }
    if (match) out.push_back({s.col_text(0), s.col_text(1), s.col_text(2), s.col_double(3)});
  }
  return out;
}

std::vector<HistorySeries> history_series(const std::string& path, const std::string& column,
                                          const std::string& branch, const std::string& machine) {
  check_metric_column(column);
  Db db(path, false);
  // The column name comes from the whitelist, never from raw input.
  std::string sql = fmt::format(
      "SELECT r.machine, r.backend, p.point_id, r.commit_hash, r.time, p.{} FROM points p "
      "JOIN runs r ON p.run_id = r.id WHERE p.status = 'ok' AND p.{} IS NOT NULL",
      column, column);
  if (!branch.empty()) sql += " AND r.branch = ?1";
  if (!machine.empty()) sql += " AND r.machine = ?2";
  sql += " ORDER BY r.machine, p.point_id, r.time, r.id";
  Stmt s(db, sql);
  if (!branch.empty()) s.text(1, branch);
  if (!machine.empty()) s.text(2, machine);
  std::vector<HistorySeries> out;
  while (s.step()) {
    if (out.empty() || out.back().machine != s.col_text(0) || out.back().point_id != s.col_text(2))
      out.push_back({s.col_text(2), column, s.col_text(0), s.col_text(1), {}, {}, {}});
    out.back().commits.push_back(s.col_text(3));
    out.back().times.push_back(s.col_text(4));
    out.back().values.push_back(s.col_double(5));
  }
  return out;
}

std::optional<json> history_baseline(const std::string& path, const BaselineQuery& q) {
  if (!std::filesystem::exists(path)) return std::nullopt;  // first nightly: no history yet
  Db db(path, false);
  std::string sql = "SELECT id, meta_json FROM runs WHERE branch = ?1";
  if (!q.machine.empty()) sql += " AND machine = ?2";
  sql += " ORDER BY time DESC, id DESC";
  Stmt runs(db, sql);
  runs.text(1, q.branch);
  if (!q.machine.empty()) runs.text(2, q.machine);
  int64_t run_id = -1;
  json meta;
  while (runs.step()) {
    meta = json::parse(runs.col_text(1), nullptr, false);
    if (!meta.is_object()) meta = json::object();
    if (!q.include_regressed && meta.value("gate", "") == "regression") continue;
    run_id = runs.col_int(0);
    break;
  }
  if (run_id < 0) return std::nullopt;
  meta.erase("gate");
  Stmt pts(db,
           "SELECT point_id, config_json, status, peak_allocated, peak_reserved, predicted_peak, "
           "median_s, samples_per_s, tokens_per_s, samples_json FROM points WHERE run_id = ?1 "
           "ORDER BY rowid");
  pts.integer(1, run_id);
  json points = json::array();
  while (pts.step()) {
    json p = {{"id", pts.col_text(0)},
              {"config", json::parse(pts.col_text(1), nullptr, false)},
              {"status", pts.col_text(2)},
              {"error", nullptr}};
    if (p["status"] != "ok") {
      points.push_back(std::move(p));
      continue;
    }
    p["memory"] = {{"peak_allocated", pts.col_number(3, true)},
                   {"peak_reserved", pts.col_number(4, true)},
                   {"predicted_peak", pts.col_number(5, true)}};
    json samples = pts.is_null(9) ? json::array() : json::parse(pts.col_text(9), nullptr, false);
    if (!samples.is_array()) samples = json::array();
    json time = {{"samples_s", samples}, {"median_s", pts.col_number(6, false)}};
    if (!samples.empty()) {
      const auto v = samples.get<std::vector<double> >();
      time["p10_s"] = quantile(v, 0.1);
      time["p90_s"] = quantile(v, 0.9);
      time["cv"] = coefficient_of_variation(v);
    }
    p["time"] = std::move(time);
    p["throughput"] = {{"samples_per_s", pts.col_number(7, false)},
                       {"tokens_per_s", pts.col_number(8, false)}};
    points.push_back(std::move(p));
  }
  return json{{"schema", "memtrade.results/1"}, {"meta", meta}, {"points", points}};
}

#endif

}  // namespace memtrade
