// The time model of a step on a GPU of the table (kernels/gpu_specs.h), from the memory model's
// dry run: `estimate --gpu NAME` runs the step on the meta device with a StepClock
// (kernels/op_cost.h) and summarises it here: step time, throughput per GPU, MFU, and where the
// time goes.
//
// MFU follows PaLM (Chowdhery et al. 2022, Appendix B), the convention llm.c and nanoGPT print:
// model FLOPs per token 6N + 12·L·H·Q·T, N the parameters that multiply (every block's matrices
// and the head: Model::flops' forward + backward, without recompute), over the dense peak of
// the step's precision (bf16/fp16, tf32 or fp32). MLP and CNN: Model::flops per sample.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "kernels/op_cost.h"
#include "models/config/config.h"

namespace memtrade {

class Model;

struct TimeModel {
  std::string gpu;              // the table's name
  int gpus = 1;                 // tp × dp ranks, one GPU each
  double step_s = 0;            // one optimizer step (its slowest rank: rank 0)
  bool language_model = false;  // tokens (GPT, Llama) or samples (MLP, CNN)
  std::int64_t samples_per_step = 0, tokens_per_step = 0;  // every rank's
  double model_flops_per_sample = 0;                       // the MFU convention's
  double peak_flops = 0;                                   // the GPU's for the precision
  std::array<double, kNumTimeShares> shares{};             // fractions of step_s
  std::int64_t kernels = 0;                                // ops on the compute stream

  double samples_per_s_per_gpu() const;
  double tokens_per_s_per_gpu() const;
  double mfu() const;
};

TimeModel summarize_time(const StepClock& clock, const TrainConfig& cfg, const Model& model);
// The `time_model` object of a point of `estimate --json`.
nlohmann::json time_model_json(const TimeModel& t);
// "0.301 s/step, 218K tok/s/GPU (1.74M tok/s on 8), MFU 60.1%; compute 81% memory 15% ..."
std::string time_model_line(const TimeModel& t);

}  // namespace memtrade
