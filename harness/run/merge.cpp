#include "harness/run/merge.h"

#include <map>
#include <set>

#include <fmt/format.h>

#include "harness/common/bad_input.h"
#include "harness/run/grid.h"

namespace memtrade {

MergeOutcome merge_shards(const std::vector<std::string>& inputs,
                          const std::filesystem::path& grid_path) {
  if (inputs.empty()) throw BadInput("merge: no input files");
  MergeOutcome out;
  ResultsFile& merged = out.merged;
  bool first = true;
  std::map<std::string, std::string> seen;  // id -> file
  // N of the inputs' "shard": "i/N" (0 when unsharded or when the inputs disagree), so that a
  // missing point can be told apart by the shard that should have run it.
  int shard_count = -1;
  for (const auto& path : inputs) {
    ResultsFile r = load_results_file(path);
    int n = 0;
    if (const auto& sh = r.meta.value("shard", nlohmann::json()); sh.is_string()) {
      try {
        n = parse_shard(sh.get<std::string>()).second;
      } catch (const BadInput&) {
        n = 0;
      }
    }
    shard_count = (shard_count < 0 || shard_count == n) ? n : 0;
    if (first) {
      merged.meta = r.meta;
      merged.meta.erase("shard");
      first = false;
    } else {
      for (const char* key : {"grid_hash", "commit", "dirty", "backend"})
        if (r.meta.value(key, nlohmann::json()) != merged.meta.value(key, nlohmann::json()))
          throw BadInput(
              fmt::format("merge: {} has {} {} but {} has {} (shards of one grid and "
                          "one build only)",
                          path, key, r.meta.value(key, nlohmann::json()).dump(), inputs.front(),
                          merged.meta.value(key, nlohmann::json()).dump()));
    }
    for (PointRow& p : r.points) {
      if (auto it = seen.find(p.id); it != seen.end())
        throw BadInput(fmt::format("merge: point {} is in both {} and {}", p.id, it->second, path));
      seen[p.id] = path;
      merged.points.push_back(std::move(p));
    }
  }
  if (grid_path.empty()) return out;

  Grid g = load_grid(grid_path, merged.meta.value("backend", "cpu"));
  // The grid's own hash, without the "+warmup…" of flags that overrode its run settings (the
  // shards agree on those among themselves, checked above).
  const std::string shards_hash = merged.meta.value("grid_hash", "");
  if (shards_hash.substr(0, shards_hash.find('+')) != g.hash)
    throw BadInput(fmt::format("merge: the shards are not of grid {} (hash {} vs {})",
                               grid_path.string(), merged.meta.value("grid_hash", ""), g.hash));
  // Keep the grid's order, so a merged file reads like a single-machine run.
  std::map<std::string, PointRow> by_id;
  for (PointRow& p : merged.points) by_id.emplace(p.id, std::move(p));
  merged.points.clear();
  std::set<std::size_t> shards;
  for (std::size_t k = 0; k < g.points.size(); ++k) {
    if (auto it = by_id.find(g.points[k].id); it != by_id.end()) {
      merged.points.push_back(std::move(it->second));
      continue;
    }
    out.missing.push_back(g.points[k].id);
    if (shard_count > 0) {
      const std::size_t shard = k % static_cast<std::size_t>(shard_count);
      shards.insert(shard);
      out.missing_note.push_back(
          fmt::format("  {}  (shard {}/{})", g.points[k].id, shard, shard_count));
    } else {
      out.missing_note.push_back("  " + g.points[k].id);
    }
  }
  for (auto i : shards) out.incomplete_shards.push_back(fmt::format("{}/{}", i, shard_count));
  return out;
}

}  // namespace memtrade
