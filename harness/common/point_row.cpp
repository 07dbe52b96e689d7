#include "harness/common/point_row.h"

#include <unistd.h>

#include <fstream>
#include <set>
#include <sstream>

#include <fmt/format.h>

#include "harness/common/bad_input.h"
#include "harness/common/output_file.h"
#include "models/config/input_text.h"

namespace memtrade {
namespace {

using nlohmann::json;

// Reads the fields of one JSON object, removing each as it is read, so that what is left at the
// end is what this build does not know (kept in PointRow::extra).
class Fields {
 public:
  Fields(json obj, std::string where) : obj_(std::move(obj)), where_(std::move(where)) {
    if (!obj_.is_object()) fail("expected an object");
  }
  [[noreturn]] void fail(const std::string& what) const {
    throw BadInput(fmt::format("{}: {}", where_, what));
  }
  bool has(const char* key) const { return obj_.contains(key) && !obj_.at(key).is_null(); }
  json take(const char* key) {
    json v = obj_.contains(key) ? std::move(obj_[key]) : json();
    obj_.erase(key);
    return v;
  }
  std::int64_t bytes(const char* key) {
    json v = take(key);
    if (!v.is_number_integer()) fail(fmt::format("'{}' must be an integer", key));
    return v.get<std::int64_t>();
  }
  std::optional<std::int64_t> opt_bytes(const char* key) {
    if (has(key)) return bytes(key);
    take(key);  // null or absent
    return std::nullopt;
  }
  double number(const char* key) {
    json v = take(key);
    if (!v.is_number()) fail(fmt::format("'{}' must be a number", key));
    return v.get<double>();
  }
  std::optional<double> opt_number(const char* key) {
    if (has(key)) return number(key);
    take(key);
    return std::nullopt;
  }
  std::string text(const char* key) {
    json v = take(key);
    if (!v.is_string()) fail(fmt::format("'{}' must be a string", key));
    return v.get<std::string>();
  }
  ByteBreakdown breakdown(const char* key) {
    json v = take(key);
    if (!v.is_object()) fail(fmt::format("'{}' must be an object of byte counts", key));
    ByteBreakdown b;
    for (const auto& [category, n] : v.items()) {
      if (!n.is_number_integer()) fail(fmt::format("'{}.{}' must be an integer", key, category));
      b[category] = n.get<std::int64_t>();
    }
    return b;
  }
  Fields section(const char* key) { return Fields(take(key), where_ + "." + key); }
  json rest() { return std::move(obj_); }

 private:
  json obj_;
  std::string where_;
};

json breakdown_json(const ByteBreakdown& b) {
  json j = json::object();
  for (const auto& [k, v] : b) j[k] = v;
  return j;
}

template <typename T>
json opt(const std::optional<T>& v) {
  return v ? json(*v) : json(nullptr);
}

}  // namespace

const std::vector<std::string>& point_statuses() {
  static const std::vector<std::string> s = {"ok", "oom", "error", "timeout", "skipped"};
  return s;
}

PointRow PointRow::failed(std::string id, json config, std::string status, std::string error) {
  PointRow r;
  r.id = std::move(id);
  r.config = config.is_object() ? std::move(config) : json::object();
  r.status = std::move(status);
  r.error = std::move(error);
  return r;
}

json PointRow::to_json() const {
  json j = {{"id", id}, {"config", config}, {"status", status}, {"error", opt(error)}};
  if (memory) {
    const MemoryFigures& m = *memory;
    j["memory"] = {{"peak_allocated", m.peak_allocated},
                   {"peak_requested", m.peak_requested},
                   {"peak_reserved", m.peak_reserved},
                   {"breakdown_at_peak", breakdown_json(m.breakdown_at_peak)},
                   {"predicted_peak", opt(m.predicted_peak)},
                   {"predicted_breakdown",
                    m.predicted_breakdown ? breakdown_json(*m.predicted_breakdown) : json(nullptr)},
                   {"device_peak", opt(m.device_peak)},
                   {"host_pinned_peak", m.host_pinned_peak}};
    if (!m.per_rank.empty()) {
      json ranks = json::array();
      for (const RankMemory& rm : m.per_rank)
        ranks.push_back({{"rank", rm.rank},
                         {"peak_allocated", rm.peak_allocated},
                         {"peak_reserved", rm.peak_reserved},
                         {"breakdown_at_peak", breakdown_json(rm.breakdown_at_peak)},
                         {"predicted_peak", opt(rm.predicted_peak)}});
      j["memory"]["per_rank"] = std::move(ranks);
    }
  } else {
    j["memory"] = nullptr;
  }
  j["time"] = time ? json{{"samples_s", time->samples_s},
                          {"median_s", time->median_s},
                          {"p10_s", time->p10_s},
                          {"p90_s", time->p90_s},
                          {"cv", time->cv},
                          {"cpu_median_s", opt(time->cpu_median_s)}}
                   : json(nullptr);
  j["throughput"] = throughput ? json{{"samples_per_s", throughput->samples_per_s},
                                      {"tokens_per_s", throughput->tokens_per_s},
                                      {"flops_per_step", throughput->flops_per_step},
                                      {"tflops", throughput->tflops},
                                      {"mfu", opt(throughput->mfu)}}
                               : json(nullptr);
  j["train"] = train ? json{{"loss_first", train->loss_first},
                            {"loss_last", train->loss_last},
                            {"skipped_steps", train->skipped_steps},
                            {"loss_scale", train->loss_scale}}
                     : json(nullptr);
  j["transfer"] = transfer
                      ? json{{"h2d_bytes", transfer->h2d_bytes}, {"d2h_bytes", transfer->d2h_bytes}}
                      : json(nullptr);
  if (wall_s) j["wall_s"] = *wall_s;
  for (const auto& [k, v] : extra.items()) j[k] = v;
  return j;
}

PointRow PointRow::from_json(const json& j) {
  const std::string label =
      j.is_object() && j.contains("id") && j["id"].is_string() ? j["id"].get<std::string>() : "?";
  Fields f(j, "point " + label);
  PointRow r;
  r.id = f.text("id");
  r.status = f.text("status");
  const auto& statuses = point_statuses();
  if (std::find(statuses.begin(), statuses.end(), r.status) == statuses.end())
    f.fail(fmt::format("status '{}' is not one of ok, oom, error, timeout, skipped", r.status));
  if (f.has("config")) {
    r.config = f.take("config");
    if (!r.config.is_object()) f.fail("'config' must be an object");
  } else {
    f.take("config");
  }
  if (f.has("error")) r.error = f.text("error");
  f.take("error");
  if (f.has("memory")) {
    Fields m = f.section("memory");
    MemoryFigures mem;
    mem.peak_allocated = m.bytes("peak_allocated");
    mem.peak_requested = m.has("peak_requested") ? m.bytes("peak_requested") : 0;
    mem.peak_reserved = m.bytes("peak_reserved");
    if (m.has("breakdown_at_peak")) mem.breakdown_at_peak = m.breakdown("breakdown_at_peak");
    mem.predicted_peak = m.opt_bytes("predicted_peak");
    if (m.has("predicted_breakdown")) mem.predicted_breakdown = m.breakdown("predicted_breakdown");
    m.take("predicted_breakdown");
    mem.device_peak = m.opt_bytes("device_peak");
    mem.host_pinned_peak = m.has("host_pinned_peak") ? m.bytes("host_pinned_peak") : 0;
    json ranks = m.take("per_rank");
    if (!ranks.is_null()) {
      if (!ranks.is_array()) m.fail("'per_rank' must be an array of ranks");
      for (std::size_t i = 0; i < ranks.size(); ++i) {
        Fields rf(ranks[i], fmt::format("point {}.memory.per_rank[{}]", label, i));
        RankMemory rm;
        rm.rank = static_cast<int>(rf.bytes("rank"));
        rm.peak_allocated = rf.bytes("peak_allocated");
        rm.peak_reserved = rf.bytes("peak_reserved");
        rm.breakdown_at_peak = rf.breakdown("breakdown_at_peak");
        rm.predicted_peak = rf.opt_bytes("predicted_peak");
        mem.per_rank.push_back(std::move(rm));
      }
    }
    r.memory = mem;
  } else {
    f.take("memory");
  }
  if (f.has("time")) {
    Fields t = f.section("time");
    TimeFigures tf;
    json samples = t.take("samples_s");
    if (!samples.is_null()) {
      if (!samples.is_array()) t.fail("'samples_s' must be an array of seconds");
      for (const json& s : samples) {
        if (!s.is_number()) t.fail("'samples_s' must be an array of seconds");
        tf.samples_s.push_back(s.get<double>());
      }
    }
    tf.median_s = t.number("median_s");
    tf.p10_s = t.opt_number("p10_s").value_or(tf.median_s);
    tf.p90_s = t.opt_number("p90_s").value_or(tf.median_s);
    tf.cv = t.opt_number("cv").value_or(0.0);
    tf.cpu_median_s = t.opt_number("cpu_median_s");
    r.time = tf;
  } else {
    f.take("time");
  }
  if (f.has("throughput")) {
    Fields t = f.section("throughput");
    ThroughputFigures tp;
    tp.samples_per_s = t.number("samples_per_s");
    tp.tokens_per_s = t.opt_number("tokens_per_s").value_or(0.0);
    tp.flops_per_step = t.opt_number("flops_per_step").value_or(0.0);
    tp.tflops = t.opt_number("tflops").value_or(0.0);
    tp.mfu = t.opt_number("mfu");
    r.throughput = tp;
  } else {
    f.take("throughput");
  }
  if (f.has("train")) {
    Fields t = f.section("train");
    TrainFigures tr;
    tr.loss_first = t.number("loss_first");
    tr.loss_last = t.number("loss_last");
    tr.skipped_steps = t.has("skipped_steps") ? t.bytes("skipped_steps") : 0;
    tr.loss_scale = t.opt_number("loss_scale").value_or(1.0);
    r.train = tr;
  } else {
    f.take("train");
  }
  if (f.has("transfer")) {
    Fields t = f.section("transfer");
    r.transfer = TransferFigures{t.bytes("h2d_bytes"), t.bytes("d2h_bytes")};
  } else {
    f.take("transfer");
  }
  r.wall_s = f.opt_number("wall_s");
  if (r.status == "ok" && (!r.memory || !r.time))
    f.fail("status ok but no 'memory' or 'time' figures");
  r.extra = f.rest();
  return r;
}

json ResultsFile::to_json() const {
  json pts = json::array();
  for (const PointRow& p : points) pts.push_back(p.to_json());
  return {{"schema", kResultsSchema}, {"meta", meta}, {"points", pts}};
}

ResultsFile ResultsFile::from_json(const json& doc, const std::string& label) {
  auto bad = [&](const std::string& what) { return BadInput(fmt::format("{}: {}", label, what)); };
  if (!doc.is_object() || !doc.contains("schema") || !doc["schema"].is_string())
    throw bad(fmt::format("not a memtrade results file (no \"schema\": \"{}\")", kResultsSchema));
  if (doc["schema"] != kResultsSchema)
    throw bad(fmt::format("unsupported schema {} (this build reads \"{}\")", doc["schema"].dump(),
                          kResultsSchema));
  if (!doc.contains("points") || !doc["points"].is_array()) throw bad("'points' must be an array");
  ResultsFile r;
  if (doc.contains("meta") && doc["meta"].is_object()) r.meta = doc["meta"];
  std::set<std::string> seen;
  for (const json& p : doc["points"]) {
    try {
      r.points.push_back(PointRow::from_json(p));
    } catch (const BadInput& e) {
      throw bad(e.what());
    }
    if (!seen.insert(r.points.back().id).second)
      throw bad(fmt::format("duplicate point id {}", r.points.back().id));
  }
  return r;
}

json read_json_file(const std::filesystem::path& path) {
  const std::string name = echo(path.string(), kEchoPathMax);
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw BadInput(fmt::format("{}: is a folder, not a file", name));
  std::ifstream in(path, std::ios::binary);
  if (!in) throw BadInput(fmt::format("{}: cannot read file", name));
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  if (text.find_first_not_of(" \t\r\n") == std::string::npos)
    throw BadInput(fmt::format("{}: empty file", name));
  try {
    return parse_json_input(text);  // nlohmann's limits plus a depth bound: never a crash
  } catch (const std::invalid_argument& e) {
    throw BadInput(fmt::format("{}: {}", name, e.what()));
  }
}

ResultsFile load_results_file(const std::filesystem::path& path) {
  return ResultsFile::from_json(read_json_file(path), path.string());
}

void write_json_atomic(const std::filesystem::path& path, const json& j) {
  write_file_atomic(path, j.dump(1) + "\n");
}

}  // namespace memtrade
