#include "models/train/loss_scaler.h"

#include <cmath>
#include <stdexcept>

#include <fmt/format.h>

namespace memtrade {

LossScaler::LossScaler(bool enabled, float init_scale, std::int64_t growth_interval)
    : enabled_(enabled), scale_(enabled ? init_scale : 1.0f), growth_interval_(growth_interval) {
  if (!enabled_) return;
  if (!(init_scale > 0.0f) || !std::isfinite(init_scale))
    throw std::invalid_argument(
        fmt::format("loss scale must be a finite positive number, got {}", init_scale));
  if (growth_interval < 1)
    throw std::invalid_argument(
        fmt::format("loss scale growth interval must be >= 1, got {}", growth_interval));
}

void LossScaler::update(bool found_inf) {
  if (!enabled_) return;
  if (found_inf) {
    // The scaled gradients overflowed: the step is skipped and the scale backs off.
    scale_ *= kBackoffFactor;
    growth_tracker_ = 0;
    ++skipped_;
    return;
  }
  if (++growth_tracker_ == growth_interval_) {
    // Long enough without overflow: try a larger scale (finite: fp32 goes to 2^127 before inf).
    const float grown = scale_ * kGrowthFactor;
    if (std::isfinite(grown)) scale_ = grown;
    growth_tracker_ = 0;
  }
}

}  // namespace memtrade
