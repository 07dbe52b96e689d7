#include "harness/run/time_model.h"

#include <memory>

#include <fmt/format.h>

#include "models/model.h"

namespace memtrade {

double TimeModel::samples_per_s_per_gpu() const {
  return step_s > 0 ? static_cast<double>(samples_per_step) / step_s / gpus : 0.0;
}

double TimeModel::tokens_per_s_per_gpu() const {
  return step_s > 0 ? static_cast<double>(tokens_per_step) / step_s / gpus : 0.0;
}

double TimeModel::mfu() const {
  return peak_flops > 0 ? samples_per_s_per_gpu() * model_flops_per_sample / peak_flops : 0.0;
}

TimeModel summarize_time(const StepClock& clock, const TrainConfig& cfg, const Model& model) {
  TimeModel t;
  t.gpu = std::string(clock.gpu().name);
  t.gpus = clock.ranks();
  t.step_s = clock.elapsed();
  t.language_model = model.rows_per_sample() > 1 || model.max_seq_len() > 0;
  t.samples_per_step = samples_per_step(cfg);
  t.tokens_per_step = t.samples_per_step * model.rows_per_sample();
  // The model's FLOPs, not the hardware's: forward + backward of one sample, recompute excluded,
  // of the whole model (a tp rank's model holds 1/tp of its matrices: the MFU is per GPU of the
  // tp × dp ranks, which together compute the whole model's FLOPs).
  const RunOptions ro = RunOptions::from(cfg);
  std::unique_ptr<Model> whole;
  if (cfg.tensor_parallel > 1 || cfg.expert_parallel > 1) {  // (an ep rank: its experts only)
    TrainConfig one = cfg;
    one.tensor_parallel = 1;
    one.expert_parallel = 1;
    one.sequence_parallel = SequenceParallel::off;
    whole = make_model(one);
  }
  const FlopCount f = (whole ? *whole : model).flops(1, ro);
  t.model_flops_per_sample = ro.training ? f.forward + f.backward : f.forward;
  const bool lowp = cfg.precision != Precision::fp32 && cfg.precision != Precision::tf32;
  t.peak_flops =
      clock.gpu().peak_flops(lowp ? DType::BF16 : DType::F32, cfg.precision == Precision::tf32);
  const auto s = clock.shares();
  for (std::size_t i = 0; i < kNumTimeShares; ++i)
    t.shares[i] = t.step_s > 0 ? s[i] / t.step_s : 0.0;
  t.kernels = clock.kernels();
  return t;
}

nlohmann::json time_model_json(const TimeModel& t) {
  nlohmann::json shares = nlohmann::json::object();
  for (std::size_t i = 0; i < kNumTimeShares; ++i)
    shares[std::string(time_share_name(static_cast<TimeShare>(i)))] = t.shares[i];
  nlohmann::json j = {
      {"gpu", t.gpu},
      {"gpus", t.gpus},
      {"step_s", t.step_s},
      {"samples_per_s_per_gpu", t.samples_per_s_per_gpu()},
      {"samples_per_s", t.samples_per_s_per_gpu() * t.gpus},
      {"mfu", t.mfu()},
      {"mfu_convention", t.language_model ? "PaLM: 6N + 12LHQT per token (N: the parameters that "
                                            "multiply), dense peak of the precision"
                                          : "Model::flops forward + backward per sample, dense "
                                            "peak of the precision"},
      {"model_flops_per_sample", t.model_flops_per_sample},
      {"peak_flops", t.peak_flops},
      {"shares", shares},
      {"kernels", t.kernels}};
  if (t.language_model) {
    j["tokens_per_s_per_gpu"] = t.tokens_per_s_per_gpu();
    j["tokens_per_s"] = t.tokens_per_s_per_gpu() * t.gpus;
  }
  return j;
}

namespace {
std::string rate(double v) {
  if (v >= 1e6) return fmt::format("{:.2f}M", v / 1e6);
  if (v >= 1e3) return fmt::format("{:.1f}K", v / 1e3);
  return fmt::format("{:.1f}", v);
}
}  // namespace

std::string time_model_line(const TimeModel& t) {
  std::string out = fmt::format("{} x{}: {:.4g} s/step, ", t.gpu, t.gpus, t.step_s);
  if (t.language_model)
    out += fmt::format("{} tok/s/GPU ({} tok/s)", rate(t.tokens_per_s_per_gpu()),
                       rate(t.tokens_per_s_per_gpu() * t.gpus));
  else
    out += fmt::format("{} samples/s/GPU ({} samples/s)", rate(t.samples_per_s_per_gpu()),
                       rate(t.samples_per_s_per_gpu() * t.gpus));
  out += fmt::format(", MFU {:.1f}%;", 100 * t.mfu());
  for (std::size_t i = 0; i < kNumTimeShares; ++i)
    if (t.shares[i] >= 0.0005)
      out +=
          fmt::format(" {} {:.1f}%", time_share_name(static_cast<TimeShare>(i)), 100 * t.shares[i]);
  return out;
}

}  // namespace memtrade
