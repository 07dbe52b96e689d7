// LossScaler: dynamic loss scaling for fp16 with torch.cuda.amp.GradScaler's semantics.
//
// The loss (in practice: dloss handed to backward) is multiplied by `scale()` so that small
// gradients survive fp16's narrow exponent range. After backward the Trainer checks the scaled
// gradients for inf/nan and calls update(found_inf):
//   - found_inf: the optimizer step is skipped, the scale is multiplied by the back-off factor
//     (0.5) and the run of clean steps restarts;
//   - otherwise the run grows by one; after `growth_interval` clean steps in a row the scale is
//     multiplied by the growth factor (2) and the run restarts.
// A disabled scaler (fp32, tf32, bf16, bf16-o2, bf16-pure) always reports scale 1 and never
// changes.
#pragma once

#include <cstdint>

namespace memtrade {

class LossScaler {
 public:
  static constexpr float kGrowthFactor = 2.0f;
  static constexpr float kBackoffFactor = 0.5f;

  // Throws std::invalid_argument for init_scale <= 0 (or not finite) or growth_interval < 1.
  LossScaler(bool enabled, float init_scale, std::int64_t growth_interval);

  bool enabled() const { return enabled_; }
  float scale() const { return scale_; }
  float inv_scale() const { return 1.0f / scale_; }
  void update(bool found_inf);

  std::int64_t growth_tracker() const { return growth_tracker_; }  // clean steps in a row
  std::int64_t skipped_steps() const { return skipped_; }          // steps with inf/nan so far

 private:
  bool enabled_;
  float scale_;
  std::int64_t growth_interval_;
  std::int64_t growth_tracker_ = 0;
  std::int64_t skipped_ = 0;
};

}  // namespace memtrade
