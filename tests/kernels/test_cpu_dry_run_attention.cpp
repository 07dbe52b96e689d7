// The dry-run ops (kernels/cpu/cpu_dry_run_ops.cpp) allocate what the real ops do, for the
// attention ops: math (multi-head and grouped-query) and flash, forward and backward, in every
// storage dtype. Both run against the same CPU allocator; every alloc and free is compared
// (size, requested size, category, order). For the CUDA target the dry run must make the CPU's
// sequence outside Category::workspace (tests/gpu/test_cuda_alloc_sequence.cpp holds CUDA to
// the CPU there); its workspace is PyTorch's (tests/kernels/test_torch_workspace.cpp).
#include <functional>
#include <tuple>

#include "kernels/cpu/cpu_ops.h"
#include "tests/kernels/attention_reference.h"

namespace memtrade::test {
namespace {

using AllocEvent = std::tuple<int, std::size_t, std::size_t, int>;

std::vector<AllocEvent> events(const CachingAllocator& a, bool skip_workspace) {
  std::vector<AllocEvent> out;
  for (const TraceEvent& e : a.trace()) {
    if (e.kind != TraceEvent::Kind::alloc && e.kind != TraceEvent::Kind::free) continue;
    if (skip_workspace && e.category == Category::workspace) continue;
    out.emplace_back(static_cast<int>(e.kind), e.bytes, e.requested, static_cast<int>(e.category));
  }
  return out;
}

class DryRunAttention : public OpsTest, public ::testing::WithParamInterface<DType> {
 protected:
  // The allocation events of fn(ops) on this device's allocator.
  template <typename F>
  std::vector<AllocEvent> trace(Ops& o, bool skip_workspace, F&& fn) {
    mem().clear_trace();
    mem().enable_trace(true);
    fn(o);
    mem().enable_trace(false);
    return events(mem(), skip_workspace);
  }
};

TEST_P(DryRunAttention, AllocatesAsTheRealOps) {
  const DType dt = GetParam();
  auto cpu_dry = make_dry_run_ops(Backend::cpu);
  auto cuda_dry = make_dry_run_ops(Backend::cuda);
  for (const AttnShape& s :
       {AttnShape{2, 9, 4, 4, 8}, AttnShape{2, 70, 4, 2, 16}, AttnShape{1, 33, 6, 1, 32}}) {
    SCOPED_TRACE(::testing::Message() << "NH " << s.nh << " NKV " << s.nkv << " T " << s.t);
    Tensor qkv = make({s.b, s.t, s.w()}, rand_vec(s.qkv_numel(), 1), dt);
    Tensor dout = make({s.b, s.t, s.c()}, rand_vec(s.out_numel(), 2), dt);
    Tensor out = zeros({s.b, s.t, s.c()}, dt), att = zeros({s.b, s.nh, s.t, s.t}, dt);
    Tensor lse = zeros({s.b, s.nh, s.t}), dqkv = zeros({s.b, s.t, s.w()}, dt);
    const std::vector<std::pair<const char*, std::function<void(Ops&)>>> calls = {
        {"attention_forward", [&](Ops& o) { o.attention_forward(out, att, qkv, s.nh, s.nkv); }},
        {"attention_probs", [&](Ops& o) { o.attention_probs(att, qkv, s.nh, s.nkv); }},
        {"attention_backward",
         [&](Ops& o) { o.attention_backward(dqkv, dout, qkv, att, s.nh, s.nkv); }},
        {"flash_attention_forward",
         [&](Ops& o) { o.flash_attention_forward(out, lse, qkv, s.nh, s.nkv); }},
        {"flash_attention_backward",
         [&](Ops& o) { o.flash_attention_backward(dqkv, dout, qkv, out, lse, s.nh, s.nkv); }},
    };
    for (const auto& [name, call] : calls) {
      SCOPED_TRACE(name);
      const auto real = trace(ops(), false, call);
      const auto dry = trace(*cpu_dry, false, call);
      if (std::string_view(name).ends_with("backward")) {
        EXPECT_FALSE(real.empty());
      }
      EXPECT_EQ(dry, real) << "CPU target";
      const auto real_shared = trace(ops(), true, call);
      const auto dry_cuda = trace(*cuda_dry, true, call);
      EXPECT_EQ(dry_cuda, real_shared) << "CUDA target, outside the workspace";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, DryRunAttention,
                         ::testing::Values(DType::F32, DType::BF16, DType::F16),
                         [](const auto& param_info) {
                           return std::string(dtype_name(param_info.param));
                         });

}  // namespace
}  // namespace memtrade::test
