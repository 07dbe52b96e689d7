// advise's time model: the step time of a configuration from what it computes and copies, with
// coefficients measured on the device at hand (advise_calibrate.h). No rate, bandwidth or
// overhead is assumed; every coefficient comes from a measured step.
//
// A step of k micro-batches of b samples (G = b·k, kept by advise):
//
//   T = k · micro + step
//   micro = Π ratio_v · (F + κ_blocks·F_blocks + κ_sel·F_sel) / R(rows) + Σ s_v · copied
//   step  = p · N + Σ q_v · N + Σ e_v · reserved
//
// where, per micro-batch: F = forward + backward FLOPs of the plain passes (Model::flops), rows
// = b · rows_per_sample, R(rows) = the FLOP rate measured at several micro-batch sizes (GEMM
// efficiency at small micro-batches), F_blocks / F_sel = the FLOPs whole-block / selective
// checkpointing recompute (Model::flops), κ = the measured cost of a recomputed FLOP relative to
// a plain one, copied = the bytes the passes copy between host and device (offloaded activations,
// streamed weights: the memory model counts them), s_v = measured seconds per copied byte of
// offload value v (1/bandwidth when nothing overlaps; overlap = 1 − s_v·bandwidth); per step: N
// = trainable parameters, p = measured seconds per parameter of the plain step's fixed part
// (optimizer update, zero_grad, loss read-back), q_v = the same for a value that works per
// parameter (an offloaded optimizer's host update and copies, zero_grad=zero's fill, another
// optimizer), e_v = seconds per reserved byte (empty_cache: segments returned and faulted in
// again). Any other value (attention kind, precision, an axis added later) is priced by its
// measured ratio_v on the micro-batch compute. Which of these carries an axis's cost is a row
// attribute of the knob table (Knob::cost); for checkpoint κ is measured with the advise value
// that recomputes the most whole-block FLOPs ("1") and the one that recomputes selectively.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/run/estimate.h"
#include "models/config/config.h"
#include "models/model.h"

namespace memtrade {

// What the cost model reads of one configuration: nothing measured.
struct CostInputs {
  std::int64_t accumulation = 1;
  double rows = 0;              // loss rows per micro-batch
  double flops = 0;             // forward + backward of one micro-batch's plain passes
  double flops_blocks = 0;      // what whole-block checkpointing recomputes, per micro-batch
  double flops_selective = 0;   // what selective checkpointing recomputes, per micro-batch
  double copied_per_micro = 0;  // host<->device bytes of one micro-batch's passes
  double copied_per_step = 0;   // host<->device bytes of the optimizer phase
  double params = 0;            // trainable parameters
  double reserved = 0;          // peak reserved bytes
  std::vector<std::pair<std::string, std::string>> values;  // (axis, value) of every axis
};

// `e` is the memory model's estimate of `cfg` run with `estimated_accumulation` micro-batches
// (advise estimates with fewer than cfg.accumulation: the device side repeats from the second
// micro-batch on); the copies it counted are scaled to one micro-batch.
CostInputs cost_inputs(const TrainConfig& cfg, const Model& model, const MemoryEstimate& e,
                       std::int64_t estimated_accumulation);

struct CostModel {
  // The plain passes' FLOP rate: (rows per micro-batch, FLOP/s), rows ascending; interpolated
  // linearly in log(rows), flat beyond the ends.
  std::vector<std::pair<double, double>> rate;
  double step_per_param = 0;  // p
  double kappa_blocks = 1, kappa_selective = 1;
  struct Term {
    std::string axis, value;
    double ratio = 1, per_byte = 0, per_param = 0, per_reserved = 0;
  };
  std::vector<Term> terms;
  double bandwidth = 0;      // host<->device bytes/s, measured (for the overlap it implies)
  std::string device;        // where the coefficients were measured
  std::string model;         // on which model
  bool transferred = false;  // measured on another device or model than the one predicted for

  double rate_at(double rows) const;
  // Each rate becomes the highest at its rows or fewer: a larger micro-batch is never slower per
  // FLOP (for a model measured on one device and used for another).
  void rate_never_falls();
  double predict(const CostInputs& in) const;  // seconds per step
  // 1 − s_v·bandwidth for an offload term: how much of the copy time the engine hides.
  double overlap(const Term& t) const;
  nlohmann::json to_json() const;
};

// A measured calibration point: what the model reads of it and its median step time.
struct Measured {
  TrainConfig config;
  CostInputs in;
  double seconds = 0;
};

// What the coefficients are fitted to, all on one model and device: the plain configuration
// (the start with every axis advise turns at its default) at several micro-batch sizes with
// a = 1 (`curve`, which includes b0), at b0 with a = 2 (`plain2`: the per-step part), and per
// priced value, the plain configuration at b0 with that value (a = 1, and a = 2 for a value that
// copies both per micro-batch and per step: offload=params). Checkpoint values give κ.
struct CalibrationSet {
  std::vector<Measured> curve;
  Measured plain1, plain2;  // b0 with a = 1 (also in curve) and a = 2
  struct Value {
    std::string axis, value;
    Measured a1;
    std::optional<Measured> a2;
  };
  std::vector<Value> values;
};

CostModel fit_cost_model(const CalibrationSet& s);

}  // namespace memtrade
