// The CUDA flash-attention kernels' tile algorithm (kernels/cuda/flash_attention_block.h) run on
// the host, block by block and thread by thread, against the CPU ops: CPU-only CI checks the
// kernels' indexing, tiling, causal masking, grouped-query mapping and dtype handling for every
// head-dim bucket. The emulation also checks what would be races or stray accesses on the GPU:
//   - phases run with the threads in ascending and in descending order, which must give the
//     same bits (a thread reading what another writes in the same phase would not);
//   - shared memory starts as NaN before every block (a read of anything not written first
//     shows in the outputs) and sits between guard values that must survive the block;
//   - every global load and store is bounds-checked against the tensor it indexes.
#include <map>

#define MEMTRADE_FLASH_FN inline
#include "kernels/cuda/flash_attention_block.h"
#include "tests/kernels/attention_reference.h"

namespace memtrade::test {
namespace {

// Global memory: the CPU tensors, bounds-checked by base pointer.
std::map<const void*, std::int64_t>& extents() {
  static std::map<const void*, std::int64_t> m;  // base -> elements
  return m;
}
void check_access(const void* p, std::int64_t i) {
  auto it = extents().find(p);
  if (it == extents().end()) throw std::logic_error("access through an unknown base pointer");
  if (i < 0 || i >= it->second)
    throw std::logic_error("global access " + std::to_string(i) + " outside [0, " +
                           std::to_string(it->second) + ")");
}

struct HostMem {
  static float load(const void* p, DType t, std::int64_t i) {
    check_access(p, i);
    return load_as_float(p, t, static_cast<std::size_t>(i));
  }
  static void store(void* p, DType t, std::int64_t i, float v) {
    check_access(p, i);
    store_from_float(p, t, static_cast<std::size_t>(i), v);
  }
};

struct HostExec {
  bool reverse;
  template <typename F>
  void operator()(F&& phase) {
    for (int k = 0; k < flash::kThreads; ++k) phase(reverse ? flash::kThreads - 1 - k : k);
  }
};

// Shared memory of `floats`, NaN-filled before each block, with guard zones around it.
class Smem {
 public:
  explicit Smem(int floats) : n_(floats), v_(static_cast<std::size_t>(floats) + 2 * kGuard) {}
  float* begin_block() {
    std::fill(v_.begin(), v_.end(), kSentinel);
    std::fill(v_.begin() + kGuard, v_.begin() + kGuard + n_, NAN);
    return v_.data() + kGuard;
  }
  void end_block() const {
    for (int i = 0; i < kGuard; ++i)
      if (v_[i] != kSentinel || v_[kGuard + n_ + i] != kSentinel)
        throw std::logic_error("shared memory written outside its layout");
  }

 private:
  static constexpr int kGuard = 256;
  static constexpr float kSentinel = 12345.5f;
  int n_;
  std::vector<float> v_;
};

flash::Dims dims(const AttnShape& s) {
  return {s.b, s.t, s.nh, s.nkv, s.hd, 1.0f / std::sqrt(static_cast<float>(s.hd))};
}

// The grids of kernels/cuda/cuda_ops_flash.cu, one block at a time.
template <int HD>
void emulate_forward(const flash::ForwardArgs& a, bool reverse) {
  using L = flash::Layout<HD>;
  HostExec ex{reverse};
  Smem smem(L::kForward);
  const std::int64_t tiles = (a.d.t + L::R - 1) / L::R;
  for (std::int64_t b = 0; b < a.d.b; ++b)
    for (std::int64_t h = 0; h < a.d.nh; ++h)
      for (std::int64_t qt = 0; qt < tiles; ++qt) {
        flash::forward_block<HD, HostMem>(ex, smem.begin_block(), a, qt, h, b);
        smem.end_block();
      }
}

template <int HD>
void emulate_backward(const flash::BackwardArgs& a, bool reverse) {
  using L = flash::Layout<HD>;
  HostExec ex{reverse};
  for (std::int64_t row = 0; row < a.d.b * a.d.nh * a.d.t; ++row) flash::dsum_row<HostMem>(a, row);
  const std::int64_t tiles = (a.d.t + L::R - 1) / L::R;
  Smem kv(L::kBackwardKv), q(L::kBackwardQ);
  for (std::int64_t b = 0; b < a.d.b; ++b) {
    for (std::int64_t g = 0; g < a.d.nkv; ++g)
      for (std::int64_t kt = 0; kt < tiles; ++kt) {
        flash::backward_kv_block<HD, HostMem>(ex, kv.begin_block(), a, kt, g, b);
        kv.end_block();
      }
    for (std::int64_t h = 0; h < a.d.nh; ++h)
      for (std::int64_t qt = 0; qt < tiles; ++qt) {
        flash::backward_q_block<HD, HostMem>(ex, q.begin_block(), a, qt, h, b);
        q.end_block();
      }
  }
}

template <typename F>
void dispatch(std::int64_t hd, F&& f) {
  switch (flash::head_dim_bucket(hd)) {
    case 32:
      return f(std::integral_constant<int, 32>{});
    case 64:
      return f(std::integral_constant<int, 64>{});
    case 128:
      return f(std::integral_constant<int, 128>{});
    default:
      return f(std::integral_constant<int, 256>{});
  }
}

struct EmuCase {
  AttnShape s;
  DType dt;
  const char* name;
};

class FlashEmulation : public OpsTest, public ::testing::WithParamInterface<EmuCase> {
 protected:
  Tensor tensor(const Shape& shape, DType t, const std::vector<float>& v = {}) {
    Tensor x = v.empty() ? garbage(shape, t) : make(shape, v, t);
    extents()[x.data()] = x.numel();
    return x;
  }
};

TEST_P(FlashEmulation, MatchesTheCpuOps) {
  const AttnShape s = GetParam().s;
  const DType dt = GetParam().dt;
  const auto qkv = quantize(rand_vec(s.qkv_numel(), 11, 2.0f), dt);
  const auto r = quantize(rand_vec(s.out_numel(), 12), dt);
  Tensor tq = tensor({s.b, s.t, s.w()}, dt, qkv), dout = tensor({s.b, s.t, s.c()}, dt, r);
  // The CPU ops: the reference.
  Tensor out = tensor({s.b, s.t, s.c()}, dt), lse = tensor({s.b, s.nh, s.t}, DType::F32);
  Tensor dqkv = tensor({s.b, s.t, s.w()}, dt);
  ops().flash_attention_forward(out, lse, tq, s.nh, s.nkv);
  ops().flash_attention_backward(dqkv, dout, tq, out, lse, s.nh, s.nkv);
  const std::vector<float> want_dqkv = get(dqkv);

  std::vector<float> got[2][3];  // [thread order][out, lse, dqkv]
  for (int order = 0; order < 2; ++order) {
    Tensor eo = tensor({s.b, s.t, s.c()}, dt), el = tensor({s.b, s.nh, s.t}, DType::F32);
    Tensor ed = tensor({s.b, s.t, s.w()}, dt), dsum = tensor({s.b, s.nh, s.t}, DType::F32);
    const flash::ForwardArgs fa{dims(s), tq.data(), dt, eo.data(), dt, el.as<float>()};
    // Backward from the CPU's out and lse, so that it is compared on equal inputs.
    const flash::BackwardArgs ba{
        dims(s),         tq.data(),        dt,        out.data(), dt, dout.data(), dt,
        lse.as<float>(), dsum.as<float>(), ed.data(), dt};
    dispatch(s.hd, [&](auto hd) {
      emulate_forward<decltype(hd)::value>(fa, order == 1);
      emulate_backward<decltype(hd)::value>(ba, order == 1);
    });
    got[order][0] = get(eo);
    got[order][1] = get(el);
    got[order][2] = get(ed);
  }
  for (int i = 0; i < 3; ++i)
    EXPECT_TRUE(got[0][i] == got[1][i]) << "output " << i << " depends on the thread order";
  // fp32 arithmetic in another order than the CPU's GEMMs: a few fp32 ulps, then one rounding.
  const double tol = 2e-6 + dtype_eps(dt);
  expect_close(got[0][0], to_d(get(out)), 1e-6, tol, "emulated out");
  expect_close(got[0][1], to_d(get(lse)), 1e-6, 2e-6, "emulated lse");
  double scale = 0;
  for (float v : want_dqkv) scale = std::max(scale, static_cast<double>(std::abs(v)));
  expect_close(got[0][2], to_d(want_dqkv), 1e-6 * scale, tol, "emulated dqkv");
}

INSTANTIATE_TEST_SUITE_P(
    Kernels, FlashEmulation,
    ::testing::Values(EmuCase{{2, 5, 2, 2, 8}, DType::F32, "hd8_t5"},
                      EmuCase{{1, 1, 4, 2, 32}, DType::F32, "t1_gqa"},
                      EmuCase{{1, 130, 4, 1, 48}, DType::F32, "hd48_mqa_three_tiles"},
                      EmuCase{{2, 64, 2, 2, 64}, DType::BF16, "hd64_one_tile_bf16"},
                      EmuCase{{1, 70, 6, 3, 100}, DType::F32, "hd100_gqa"},
                      EmuCase{{1, 33, 2, 1, 128}, DType::F16, "hd128_f16"},
                      EmuCase{{1, 35, 2, 2, 256}, DType::F32, "hd256"}),
    [](const auto& param_info) { return std::string(param_info.param.name); });

}  // namespace
}  // namespace memtrade::test
