// The knob table: every grid axis, written down once, as data (nvbench's "axes as data").
//
// A row says everything the rest of memtrade needs to know about one axis: its name (grid key,
// results-JSON config key, CSV column), its CLI flag, how it appears in point ids, which values
// it accepts, its help text, and how to read and write it on a TrainConfig. The default is not
// written here: it is TrainConfig's member initialiser, read through the row's getter.
//
// Everything else iterates over this table: the CLI flags of run/estimate/step/fit (each a CLI11
// option validated and canonicalised by the row), grid files, point ids, the one config
// serialiser (config_json: results, step-dump meta, traces, CSV, history and fit output),
// `run --list --json`, and `memtrade knobs --json`, which is how reports/ and bench/peers/
// learn the axes. Adding an axis = a TrainConfig field + one row here + its behaviour + tests
// (tests/models/test_knobs.cpp walks every row through every consumer).
//
// Values travel as canonical text ("8", "bf16", "0.5", "sqrt"): a row's `set` parses any
// accepted spelling and `get` gives the canonical one, so get(set(x)) is the same for every
// spelling of a value and the point id of a config is unique.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "models/config/config.h"

namespace memtrade {

class Model;

// How a value is written in JSON and TOML.
enum class KnobType : std::uint8_t {
  integer,  // a JSON/TOML integer ("batch_size": 8)
  text,     // a string ("precision": "bf16")
  density,  // a string in results ("0.5", "sqrt"); grids and old files may give a number
};

// Where an axis appears in point ids.
enum class IdRule : std::uint8_t {
  always,        // every id has it (the first release's axes: their ids must not change)
  non_default,   // only where it applies and differs from its default, so that adding an axis
                 // leaves every existing id (and baseline, and history) as it was
  when_applies,  // wherever it applies, default or not (an axis that qualifies another one:
                 // the autocast policy of an autocast precision)
};

// What `memtrade advise` (harness/run/advise.h) may do with an axis.
enum class AdviseRole : std::uint8_t {
  keep,   // never changed: what is trained (model, seq_len), not training (mode eval), or nothing
          // on the device to gain (input staging is host memory)
  turn,   // trades memory for time and leaves the training math unchanged (tests prove it);
          // advise turns it by default
  allow,  // changes what the training computes (precision, optimizer): only with --allow NAME
};

// What the time of a value of the axis scales with, in advise's cost model
// (harness/run/advise_cost.h), which measures each value's cost once and scales it by this.
enum class CostDriver : std::uint8_t {
  compute,    // a ratio on the micro-batch's compute (attention kind, precision; the default)
  structure,  // the step's shape: micro-batches of so many rows (batch_size, accumulation)
  recompute,  // the FLOPs it recomputes in backward (Model::flops: checkpoint)
  copies,     // bytes copied per micro-batch (the memory model counts them), plus work per
              // parameter per step (offload)
  params,     // work per parameter per step (zero_grad, optimizer)
  reserved,   // work per reserved byte per step (empty_cache)
};

struct Knob {
  std::string name;       // "batch_size": grid key, JSON config key, CSV column
  std::string flag;       // "--batch-size"
  std::string id_prefix;  // "b" -> "b8"; "" -> "fp32"; "off-" -> "off-none"
  IdRule id_rule = IdRule::always;
  KnobType type = KnobType::text;
  // What is trained rather than how (model, batch size): a model's default point may have any
  // value of a workload axis, every other axis at its default (the reports' baseline rule).
  bool workload = false;
  std::string help;         // one line, for --help and the docs' knob table
  std::string values_text;  // what is accepted, in words (for open-ended axes)
  // The accepted values for a closed set (empty for open-ended axes such as batch_size).
  std::function<std::vector<std::string>()> choices;
  // Values every consumer is tested with (the choices, or examples of an open-ended axis).
  std::vector<std::string> examples;
  std::function<std::string(const TrainConfig&)> get;  // canonical text
  // The value as the point id shows it, after id_prefix: get() unless a row says otherwise
  // (model_config: the file's name and hash, not its path; model: "hf" when a model config file
  // defines the model).
  std::function<std::string(const TrainConfig&)> id_text;
  // Parses `text` into the config; returns an error message (without the axis name) when
  // the text is not an accepted value.
  std::function<std::optional<std::string>(TrainConfig&, std::string_view text)> set;
  // False where the axis means nothing for this config (then it is left out of the id).
  std::function<bool(const TrainConfig&)> applies;
  // Once every axis is set: checks the value against the others (a seq_len the model cannot
  // take) and makes it canonical where it depends on them; returns an error message.
  std::function<std::optional<std::string>(TrainConfig&)> resolve;
  // What advise may do with the axis, and the values it tries from a starting point (turn and
  // allow rows; default: choices()). Advise searches the cartesian product of these over the
  // rows that apply, keeping the samples per optimizer step (samples_per_step) of the start.
  AdviseRole advise = AdviseRole::keep;
  std::function<std::vector<std::string>(const TrainConfig& start)> advise_values;
  CostDriver cost = CostDriver::compute;
  bool only_costs = false;  // a value other than the default only adds work: a measured saving
                            // is timing noise and counts as none

  std::string default_text() const { return get(TrainConfig{}); }
  std::vector<std::string> test_values() const;  // choices() if any, else examples
};

// The table, in id order.
const std::vector<Knob>& knobs();
// The row of an axis; nullptr / std::invalid_argument when there is none.
const Knob* find_knob(std::string_view name);
const Knob& knob(std::string_view name);
std::vector<std::string> knob_names();

// A bad value for an axis: "precision: unknown value 'x' (expected one of: fp32, ...)". The CLI
// turns it (a std::invalid_argument) into one line and exit code 2.
class KnobError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// Sets one axis from text; throws KnobError naming the axis.
void set_knob(TrainConfig& cfg, const Knob& k, std::string_view text);
// After the axes are set (flags, a grid point, a JSON config): every row's resolve() (throws
// KnobError naming the axis), then every axis that does not apply is set to its default.
void resolve_config(TrainConfig& cfg);

// "gpt-tiny/b8/a1/fp32/ck0/adam/off-none/zg-set_to_none/train/ec-never/in-pinned", with the
// when_applies axes where they apply ("gpt-tiny/b8/a1/bf16/ac-torch-cuda/ck0/..."), and the
// non_default axes that apply and differ from their default ("/seq128"), in table order; each
// axis as its prefix and id_text.
std::string point_id(const TrainConfig& c);

// The one config serialiser: every axis by its JSON type (defaults filled in), plus "seed".
// Results points, fit rows, traces, step-dump meta and `run --list --json` all use it.
nlohmann::json config_json(const TrainConfig& c);
// config_json plus "hyper", the model's hyper-parameters (num_params among them): a point's
// config as results, estimates, `run --list --json` and advise write it.
nlohmann::json config_json(const TrainConfig& c, const Model& model);
// The inverse, resolved. Missing axes take their default (files written before an axis existed
// load); keys that are not axes (hyper, lr, ...) are ignored. Throws KnobError.
TrainConfig config_from_json(const nlohmann::json& j);

// The table as JSON (`memtrade knobs --json`, and meta.knobs of every results file):
// [{"name", "flag", "id_prefix", "id_rule", "type", "workload", "advise" (keep | turn | allow),
//   "default", "choices" (or null), "examples", "values", "help"}, ...].
nlohmann::json knobs_json();

}  // namespace memtrade
