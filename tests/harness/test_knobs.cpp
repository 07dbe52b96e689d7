// The knob table walk: every axis of models/config/knobs.h, with every value it is tested with,
// goes through every consumer: the CLI flag (CLI11 transformer), a grid file, the point id, the
// results-JSON config (round trip), the CSV export, `memtrade knobs --json` and `run --list
// --json`. A new row that some consumer does not handle fails here, not in a user's hands.
// (The reports' labels are walked in tests/python/test_knobs.py.)
#include <gtest/gtest.h>

#include <set>
#include <sstream>

#include <fmt/format.h>

#include "fixtures/gate_fixtures.h"
#include "harness/cli/knob_flags.h"
#include "harness/common/bad_input.h"
#include "harness/run/grid.h"
#include "harness/run/results.h"
#include "models/config/knobs.h"

namespace memtrade {
namespace {

using namespace memtrade::testing;

// The walk's base point: the defaults on a model every axis applies to (GPT takes every knob).
TrainConfig base() {
  TrainConfig c;
  c.model = "gpt-tiny";
  return c;
}

// A base where `k` applies: base(), or base() with one other axis changed (the autocast policy
// applies to an autocast precision only). A model config file defines the model itself, so its
// walk leaves the model axis at its default.
TrainConfig base_for(const Knob& k) {
  if (k.name == "model_config") return TrainConfig{};
  if (k.applies(base())) return base();
  for (const Knob& o : knobs())
    for (const std::string& v : o.test_values()) {
      TrainConfig c = base();
      set_knob(c, o, v);
      if (k.applies(c)) return c;
    }
  ADD_FAILURE() << k.name << " applies to no config the walk can make";
  return base();
}

// The base with one axis set (through the row) and resolved.
TrainConfig with(const Knob& k, const std::string& value) {
  TrainConfig c = base_for(k);
  set_knob(c, k, value);
  resolve_config(c);
  return c;
}

// A TOML literal for a value: integers bare, everything else quoted.
std::string toml_value(const Knob& k, const std::string& v) {
  return k.type == KnobType::integer ? v : fmt::format("\"{}\"", v);
}

std::vector<std::string> csv_header(const std::string& csv) {
  std::vector<std::string> cols;
  std::stringstream line(csv.substr(0, csv.find('\n')));
  std::string col;
  while (std::getline(line, col, ',')) cols.push_back(col);
  return cols;
}

TEST(Knobs, EveryRowIsComplete) {
  std::set<std::string> names, flags;
  ASSERT_FALSE(knobs().empty());
  for (const Knob& k : knobs()) {
    SCOPED_TRACE(k.name);
    EXPECT_TRUE(names.insert(k.name).second) << "duplicate axis";
    EXPECT_TRUE(flags.insert(k.flag).second) << "duplicate flag";
    EXPECT_EQ(k.flag.rfind("--", 0), 0u);
    EXPECT_FALSE(k.help.empty());
    EXPECT_TRUE(k.get && k.set && k.applies && k.choices);
    EXPECT_FALSE(k.test_values().empty()) << "no values to test the axis with";
    EXPECT_TRUE(!k.choices().empty() || !k.values_text.empty());
    // The default is an accepted value and canonical.
    TrainConfig d;
    set_knob(d, k, k.default_text());
    EXPECT_EQ(point_id(d), point_id(TrainConfig{}));
  }
}

// One value of one axis through every consumer.
void walk(const Knob& k, const std::string& v) {
  SCOPED_TRACE(k.name + "=" + v);
  const TrainConfig expected = with(k, v);
  EXPECT_EQ(k.get(expected), v) << "test values must be canonical";

  // CLI flag: parsed and canonicalised by the row.
  CLI::App app;
  KnobFlags flags;
  add_knob_flags(app, flags);
  const TrainConfig b = base_for(k);
  std::vector<std::string> argv{v, k.flag};  // CLI11 parses argv reversed
  for (const Knob& o : knobs())
    if (o.name != k.name) argv.insert(argv.end(), {o.get(b), o.flag});
  app.parse(argv);
  const TrainConfig from_flag = to_train_config(flags);
  EXPECT_EQ(point_id(from_flag), point_id(expected));
  EXPECT_EQ(k.get(from_flag), v);

  // Point id: the value shows where the rule says so, and ids tell configs apart.
  const std::string id = point_id(expected);
  const bool shown =
      k.id_rule == IdRule::always ||
      (k.applies(expected) && (k.id_rule == IdRule::when_applies || v != k.default_text()));
  if (shown) {
    EXPECT_NE(id.find(k.id_prefix + k.id_text(expected)), std::string::npos) << id;
  }
  if (v != k.get(b) && k.applies(expected)) {
    EXPECT_NE(id, point_id(b));
  }

  // The one serialiser round-trips, with the row's JSON type.
  const nlohmann::json j = config_json(expected);
  ASSERT_TRUE(j.contains(k.name));
  EXPECT_EQ(j.at(k.name).is_number_integer(), k.type == KnobType::integer);
  EXPECT_EQ(point_id(config_from_json(j)), id);
  EXPECT_EQ(k.get(config_from_json(j)), v);

  // A grid file: the axis key with the value, in its TOML type.
  std::string others;
  for (const Knob& o : knobs())
    if (o.name != k.name) others += fmt::format("{} = [{}]\n", o.name, toml_value(o, o.get(b)));
  const Grid g = parse_grid(fmt::format("[axes]\n{}{} = [{}]\n", others, k.name, toml_value(k, v)),
                            "walk.toml", "cpu");
  ASSERT_EQ(g.points.size(), 1u);
  EXPECT_EQ(g.points[0].id, id);
}

TEST(Knobs, EveryValueThroughFlagsIdsJsonAndGrid) {
  for (const Knob& k : knobs())
    for (const std::string& v : k.test_values()) walk(k, v);
}

// Values no row lists: a model with overrides and a model config file, through the same walk.
TEST(Knobs, ModelOverridesAndModelConfigFilesThroughEveryConsumer) {
  walk(knob("model"), "llama-tiny:n_kv_head=1,n_layer=4");
  walk(knob("model"), "gpt-tiny:n_layer=3,tie_word_embeddings=false");
  const std::string file =
      std::string(MEMTRADE_SOURCE_DIR) + "/tests/models/fixtures/hf/Llama-3.2-1B.json";
  walk(knob("model_config"), file);
  const TrainConfig c = with(knob("model_config"), file);
  EXPECT_EQ(knob("model_config").id_text(c), "Llama-3.2-1B-bfb5d39c");
  EXPECT_EQ(knob("model").id_text(c), "hf");
  EXPECT_EQ(point_id(c).rfind("hf/b8/", 0), 0u) << point_id(c);
}

TEST(Knobs, BadValuesAreOneLineErrorsEverywhere) {
  for (const Knob& k : knobs()) {
    SCOPED_TRACE(k.name);
    const std::string bad = k.type == KnobType::integer ? "-1" : "no-such-value";
    TrainConfig c;
    EXPECT_THROW(set_knob(c, k, bad), KnobError);
    CLI::App app;
    KnobFlags flags;
    add_knob_flags(app, flags);
    EXPECT_THROW(app.parse(std::vector<std::string>{bad, k.flag}), CLI::ValidationError);
    try {
      parse_grid(fmt::format("[axes]\n{} = [{}]\n", k.name, toml_value(k, bad)), "bad.toml", "cpu");
      ADD_FAILURE() << "grid accepted " << bad;
    } catch (const BadInput& e) {
      EXPECT_EQ(std::string(e.what()).rfind("bad.toml:2: axes." + k.name + ": ", 0), 0u)
          << e.what();
    }
    EXPECT_THROW(config_from_json({{k.name, bad}}), KnobError);
  }
}

TEST(Knobs, CsvHasAColumnPerAxisFilledForOldFiles) {
  ResultsFile file;
  TrainConfig c;
  file.points.push_back(PointRow::failed(point_id(c), config_json(c), "skipped", "x"));
  nlohmann::json old_config = config_json(c);  // a file written before the last axis existed
  old_config.erase(knobs().back().name);
  file.points.push_back(PointRow::failed("old", old_config, "skipped", "x"));
  const std::string csv = results_csv(file);
  const auto cols = csv_header(csv);
  for (const Knob& k : knobs())
    EXPECT_NE(std::find(cols.begin(), cols.end(), k.name), cols.end()) << k.name;
  // Every row has as many fields as the header (no field of these values needs quoting), and
  // an old file's missing axis shows the default it ran at.
  std::stringstream rows(csv);
  std::string line;
  std::vector<std::vector<std::string>> table;
  while (std::getline(rows, line)) {
    EXPECT_EQ(std::count(line.begin(), line.end(), ','), static_cast<long>(cols.size() - 1))
        << line;
    std::vector<std::string> fields;
    std::stringstream ls(line);
    std::string field;
    while (std::getline(ls, field, ',')) fields.push_back(field);
    table.push_back(fields);
  }
  ASSERT_EQ(table.size(), 3u);
  const auto last = std::find(cols.begin(), cols.end(), knobs().back().name) - cols.begin();
  EXPECT_EQ(table[2][static_cast<std::size_t>(last)], knobs().back().default_text());
  EXPECT_EQ(table[1][static_cast<std::size_t>(last)], knobs().back().default_text());
}

TEST(Knobs, TableAsJsonThroughTheCli) {
  const CliResult r = run_cli("knobs --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  const nlohmann::json table = nlohmann::json::parse(r.out);
  ASSERT_EQ(table.size(), knobs().size());
  for (std::size_t i = 0; i < knobs().size(); ++i) {
    const Knob& k = knobs()[i];
    EXPECT_EQ(table[i]["name"], k.name);
    EXPECT_EQ(table[i]["flag"], k.flag);
    EXPECT_EQ(table[i]["default"], config_json(TrainConfig{})[k.name]);
    EXPECT_EQ(table[i]["examples"].size(), k.test_values().size());
  }
  // run --list --json: full configs a peer can run without parsing ids.
  const CliResult list = run_cli("run --model gpt-tiny --batch-size 2 --list --json --backend cpu");
  ASSERT_EQ(list.rc, 0) << list.err;
  const nlohmann::json doc = nlohmann::json::parse(list.out);
  ASSERT_EQ(doc["points"].size(), 1u);
  const nlohmann::json& cfg = doc["points"][0]["config"];
  for (const Knob& k : knobs()) EXPECT_TRUE(cfg.contains(k.name)) << k.name;
  EXPECT_EQ(cfg["batch_size"], 2);
  EXPECT_EQ(cfg["hyper"]["n_layer"], 2);
  EXPECT_EQ(config_from_json(cfg).model, "gpt-tiny");
}

}  // namespace
}  // namespace memtrade
