// RoPE's inverse frequencies, as HF transformers computes them (modeling_rope_utils.py: the
// default parameters and _compute_llama3_parameters) with PyTorch's fp32 CPU tensor ops. Each
// statement below is one PyTorch op and rounds to fp32 where that op does, so the result is the
// same floats, not just close ones:
//   - `base ** (arange(0, dim, 2).float() / dim)`: the exponent is an fp32 division; pow is
//     computed in double and rounded once (PyTorch's vectorised pow is SLEEF's 1-ulp powf, so it
//     can differ by one ulp for some head dims: none for 64 and 128 at θ 1e4 or 5e5, which
//     tests/python/test_rope_reference.py checks);
//   - `1.0 / t` and `x / t` for a tensor t are t.reciprocal() · x in PyTorch (Tensor.__rdiv__),
//     two roundings, not one division;
//   - a Python float operand of an fp32 op is rounded to fp32 first; divisions by a scalar are
//     true fp32 divisions on the CPU.
// No statement may be contracted into an FMA (ISO C++ mode: GCC and Clang keep them apart
// unless told otherwise; the test against PyTorch's values would show it).
#include <cmath>
#include <numbers>

#include "kernels/op_checks.h"
#include "kernels/ops.h"

namespace memtrade {
namespace {

void check_rope_config(std::int64_t head_dim, const RopeConfig& r) {
  constexpr std::string_view op = "rope";
  auto bad = [&](const std::string& m) { throw_bad_op_argument(op, m); };
  if (head_dim < 2 || head_dim % 2 != 0 || head_dim > kRopeMaxHeadDim)
    bad("head_dim " + std::to_string(head_dim) + " must be even, in [2, " +
        std::to_string(kRopeMaxHeadDim) + "]");
  if (!(r.theta > 0.0)) bad("rope_theta must be positive");
  if (r.factor == 0.0) return;
  if (!(r.factor > 0.0) || !(r.low_freq_factor > 0.0) || r.original_max_position <= 0 ||
      !(r.high_freq_factor > r.low_freq_factor))
    bad("llama3 rope_scaling needs factor > 0, low_freq_factor > 0, high_freq_factor > "
        "low_freq_factor and original_max_position_embeddings > 0");
}

}  // namespace

std::vector<float> rope_inv_freq(std::int64_t head_dim, const RopeConfig& r) {
  check_rope_config(head_dim, r);
  const float base = static_cast<float>(r.theta);
  const float dim = static_cast<float>(head_dim);
  std::vector<float> inv(static_cast<std::size_t>(head_dim / 2));
  for (std::size_t i = 0; i < inv.size(); ++i) {
    const float exponent = static_cast<float>(2 * i) / dim;
    const float p = static_cast<float>(std::pow(static_cast<double>(base), exponent));
    inv[i] = 1.0f / p;
  }
  if (r.factor == 0.0) return inv;

  // Llama 3.1's frequency-dependent scaling: wavelengths longer than original / low_freq_factor
  // are stretched by `factor`, shorter than original / high_freq_factor kept, and the band
  // between interpolates smoothly in 1 / wavelength.
  const double old_len = static_cast<double>(r.original_max_position);
  const float factor = static_cast<float>(r.factor);
  const float low = static_cast<float>(r.low_freq_factor);
  const float low_wavelen = static_cast<float>(old_len / r.low_freq_factor);
  const float high_wavelen = static_cast<float>(old_len / r.high_freq_factor);
  const float band = static_cast<float>(r.high_freq_factor - r.low_freq_factor);
  const float two_pi = static_cast<float>(2.0 * std::numbers::pi);
  for (float& f : inv) {
    const float wavelen = (1.0f / f) * two_pi;
    if (wavelen > low_wavelen) {
      f = f / factor;
    } else if (!(wavelen < high_wavelen)) {
      const float ratio = (1.0f / wavelen) * static_cast<float>(old_len);
      const float smooth = (ratio - low) / band;
      const float stretched = ((1.0f - smooth) * f) / factor;
      const float kept = smooth * f;
      f = stretched + kept;
    }
  }
  return inv;
}

}  // namespace memtrade
