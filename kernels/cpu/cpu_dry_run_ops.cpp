// Dry-run CPU ops: no arithmetic, no reads or writes of tensor memory, but every scratch
// buffer the real CPU ops take, of the same size and category, in the same order. The memory
// model (harness/run/estimate.cpp) runs a whole training step with them on a device whose memory
// is address space only. tests/harness/test_estimate.cpp holds them to the real ops: the
// predicted peak must equal the measured one on every smoke-grid point.
#include <optional>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cuda_workspace.h"

namespace memtrade {
namespace {

class DryRunOps final : public Ops {
 public:
  explicit DryRunOps(Backend target) : cuda_(target == Backend::cuda) {}
  std::string name() const override { return cuda_ ? "cuda (dry run)" : "cpu (dry run)"; }

  void matmul(Tensor& c, const Tensor& a, const Tensor& b, bool, bool, float, float) override {
    lt_workspace(*c.allocator());
    auto a32 = f32_copy(a, *c.allocator());
    auto b32 = f32_copy(b, *c.allocator());
    auto c32 = f32_copy(c, *c.allocator());
  }
  void linear_forward(Tensor& out, const Tensor& inp, const Tensor& weight,
                      const Tensor*) override {
    lt_workspace(*out.allocator());
    auto x = f32_copy(inp, *out.allocator());
    auto w = f32_copy(weight, *out.allocator());
    auto y = f32_copy(out, *out.allocator());
  }
  void linear_backward(Tensor* dinp, Tensor* dweight, Tensor*, const Tensor& dout,
                       const Tensor& inp, const Tensor& weight, bool) override {
    if (dinp || dweight) lt_workspace(*(dinp ? dinp : dweight)->allocator());
    if (dinp) {
      auto g = f32_copy(dout, *dinp->allocator());
      auto w = f32_copy(weight, *dinp->allocator());
      auto dx = f32_copy(*dinp, *dinp->allocator());
    }
    if (dweight) {
      auto g = f32_copy(dout, *dweight->allocator());
      auto x = f32_copy(inp, *dweight->allocator());
      auto dw = f32_copy(*dweight, *dweight->allocator());
    }
  }

  void fill(Tensor&, float) override {}
  void cast(Tensor&, const Tensor&) override {}
  void add(Tensor&, const Tensor&, const Tensor&) override {}
  void add_inplace(Tensor&, const Tensor&) override {}
  void scale(Tensor&, float) override {}
  void gelu_forward(Tensor&, const Tensor&) override {}
  void gelu_backward(Tensor&, const Tensor&, const Tensor&) override {}
  void relu_forward(Tensor&, const Tensor&) override {}
  void relu_backward(Tensor&, const Tensor&, const Tensor&) override {}
  void layernorm_forward(Tensor&, Tensor&, Tensor&, const Tensor&, const Tensor&, const Tensor&,
                         float) override {}
  void layernorm_backward(Tensor&, Tensor*, Tensor*, const Tensor&, const Tensor&, const Tensor&,
                          const Tensor&, const Tensor&, bool) override {}
  void softmax_forward(Tensor&, const Tensor&) override {}
  void softmax_backward(Tensor&, const Tensor&, const Tensor&) override {}

  void attention_forward(Tensor& out, Tensor& att, const Tensor& qkv, int n_head,
                         int n_kv_head) override {
    attention(&out, att, qkv, n_head, n_kv_head);
  }
  void attention_probs(Tensor& att, const Tensor& qkv, int n_head, int n_kv_head) override {
    attention(nullptr, att, qkv, n_head, n_kv_head);
  }
  void attention_backward(Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& att,
                          int n_head, int n_kv_head) override {
    const std::int64_t t = qkv.dim(1), hd = head_dim(qkv, n_head, n_kv_head);
    CachingAllocator& alloc = *dqkv.allocator();
    lt_workspace(alloc);
    Tensor dp(alloc, {n_head, t, t}, qkv.dtype(), Category::temporaries);
    const Category ws = Category::workspace;
    const bool lowp = qkv.dtype() != DType::F32;
    auto qkv_buf = scratch_if(lowp, alloc, {3, t, hd}, ws);
    auto att_buf = scratch_if(att.dtype() != DType::F32 || lowp, alloc, {t, t}, ws);
    auto dout_buf = scratch_if(dout.dtype() != DType::F32 || lowp, alloc, {t, hd}, ws);
    auto dqkv_buf = scratch_if(dqkv.dtype() != DType::F32, alloc, {3, t, hd}, ws);
    auto ds_buf = scratch_if(lowp, alloc, {t, t}, ws);
  }
  // Flash (kernels/cpu/cpu_ops_flash.cpp, kernels/cuda/cuda_ops_flash.cu): no GEMM library, so
  // no cuBLASLt workspace; backward's D on both backends, the CPU's fp32 copies on the CPU.
  void flash_attention_forward(Tensor& out, Tensor&, const Tensor& qkv, int, int) override {
    if (qkv.numel() == 0) return;
    auto qkv32 = f32_copy(qkv, *out.allocator());
  }
  void flash_attention_backward(Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor&,
                                const Tensor& lse, int, int) override {
    if (qkv.numel() == 0) return;
    CachingAllocator& alloc = *dqkv.allocator();
    Tensor dsum(alloc, lse.shape(), DType::F32, Category::temporaries);
    auto qkv32 = f32_copy(qkv, alloc);
    auto dout32 = f32_copy(dout, alloc);
    auto dqkv32 = f32_copy(dqkv, alloc);
  }

  void embedding_forward(Tensor&, const Tensor&, const Tensor&, const Tensor*) override {}
  void embedding_backward(Tensor* dwte, Tensor*, const Tensor&, const Tensor& tokens,
                          bool) override {
    if (dwte) Tensor order(*dwte->allocator(), {tokens.numel()}, DType::I32, Category::temporaries);
  }
  void vocab_local_tokens(Tensor&, const Tensor&, std::int64_t, std::int64_t) override {}
  void vocab_crossentropy_stats(Tensor&, const Tensor&, const Tensor&, std::int64_t) override {}
  void vocab_crossentropy_combine(Tensor&, Tensor&, const Tensor&, const Tensor&) override {}
  void vocab_crossentropy_backward(Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                   std::int64_t, float) override {}
  void crossentropy_forward(Tensor&, const Tensor&, const Tensor&) override {}
  void crossentropy_backward(Tensor&, const Tensor&, const Tensor&, float) override {}
  double sum_to_host(const Tensor& t) override {
    lt_workspace(*t.allocator());
    return 0.0;
  }

  void conv2d_forward(Tensor& out, const Tensor& inp, const Tensor& weight, const Tensor*,
                      int stride, int pad) override {
    Conv d = dims(inp, weight, stride, pad);
    CachingAllocator& alloc = *out.allocator();
    auto w = f32_copy(weight, alloc);
    auto out_buf = scratch_if(out.dtype() != DType::F32, alloc, {d.co, d.p}, Category::workspace);
    auto col = scratch_if(true, alloc, {d.k, d.p}, Category::workspace);
  }
  void conv2d_backward(Tensor* dinp, Tensor* dweight, Tensor*, const Tensor& dout,
                       const Tensor& inp, const Tensor& weight, int stride, int pad,
                       bool) override {
    if (!dinp && !dweight) return;
    Conv d = dims(inp, weight, stride, pad);
    CachingAllocator& alloc = *(dinp ? dinp : dweight)->allocator();
    std::optional<Tensor> w, dw;
    if (dinp) w = f32_copy(weight, alloc);
    if (dweight) dw = f32_copy(*dweight, *dweight->allocator());
    auto dout_buf = scratch_if(dout.dtype() != DType::F32, alloc, {d.co, d.p}, Category::workspace);
    auto dinp_buf = scratch_if(dinp && dinp->dtype() != DType::F32, alloc,
                               {inp.dim(1), inp.dim(2), inp.dim(3)}, Category::workspace);
    auto col = scratch_if(true, alloc, {d.k, d.p}, Category::workspace);
  }
  // CUDA's batch-norm keeps its per-block partial sums in the small scratch (when it splits
  // channels across blocks, which the tiny and small CNNs do).
  void batchnorm_forward(Tensor& out, Tensor&, Tensor&, const Tensor&, const Tensor&, const Tensor&,
                         Tensor*, Tensor*, float, float) override {
    lt_workspace(*out.allocator());
  }
  void batchnorm_backward(Tensor& dinp, Tensor*, Tensor*, const Tensor&, const Tensor&,
                          const Tensor&, const Tensor&, const Tensor&, bool) override {
    lt_workspace(*dinp.allocator());
  }
  void global_avgpool_forward(Tensor&, const Tensor&) override {}
  void global_avgpool_backward(Tensor&, const Tensor&) override {}
  void maxpool2d_forward(Tensor&, Tensor&, const Tensor&, int, int) override {}
  void maxpool2d_backward(Tensor&, const Tensor&, const Tensor&) override {}

  // The Llama-family ops take no scratch on either backend.
  void rmsnorm_forward(Tensor&, Tensor&, const Tensor&, const Tensor&, float) override {}
  void rmsnorm_backward(Tensor&, Tensor*, const Tensor&, const Tensor&, const Tensor&,
                        const Tensor&, bool) override {}
  void rope_forward(Tensor&, int, int, const RopeConfig&) override {}
  void rope_backward(Tensor&, int, int, const RopeConfig&) override {}
  void swiglu_forward(Tensor&, const Tensor&, const Tensor&) override {}
  void swiglu_backward(Tensor&, Tensor&, const Tensor&, const Tensor&, const Tensor&) override {}

  bool unscale_and_check(std::span<Tensor* const> grads, float) override {
    for (Tensor* g : grads)
      if (g && g->allocator()) lt_workspace(*g->allocator());
    return false;
  }
  void optimizer_update(const OptimizerHyper&, Tensor&, const Tensor&, Tensor*, Tensor*) override {}

 private:
  // The fp32 copy a 16-bit GEMM operand or output gets on the CPU (cpu_ops_impl.h: F32In /
  // F32Out); none for CUDA, whose libraries take 16-bit operands.
  std::optional<Tensor> f32_copy(const Tensor& t, CachingAllocator& alloc) const {
    if (cuda_ || t.dtype() == DType::F32) return std::nullopt;
    return Tensor(alloc, t.shape(), DType::F32, Category::workspace);
  }
  // fp32 scratch; the CPU's workspace kinds only on the CPU.
  std::optional<Tensor> scratch_if(bool need, CachingAllocator& alloc, Shape shape,
                                   Category c = Category::temporaries) const {
    if (!need || (cuda_ && c == Category::workspace)) return std::nullopt;
    return Tensor(alloc, std::move(shape), DType::F32, c);
  }
  // CUDA: the persistent cuBLASLt workspace + small scratch, from the first GEMM or reduction.
  void lt_workspace(CachingAllocator& alloc) {
    if (!cuda_ || workspace_.defined()) return;
    workspace_ = Tensor(
        alloc, {static_cast<std::int64_t>((kCudaLtWorkspaceBytes + kCudaSmallScratchBytes) / 4)},
        DType::I32, Category::workspace);
  }

  bool cuda_;
  Tensor workspace_;

  struct Conv {
    std::int64_t co, k, p;
  };
  static Conv dims(const Tensor& inp, const Tensor& weight, int stride, int pad) {
    const std::int64_t oh = (inp.dim(2) + 2 * pad - weight.dim(2)) / stride + 1;
    const std::int64_t ow = (inp.dim(3) + 2 * pad - weight.dim(3)) / stride + 1;
    return {weight.dim(0), weight.dim(1) * weight.dim(2) * weight.dim(3), oh * ow};
  }
  static std::int64_t head_dim(const Tensor& qkv, int n_head, int n_kv_head) {
    return qkv.dim(2) / (n_head + 2 * std::int64_t{n_kv_head});
  }
  void attention(Tensor* out, Tensor& att, const Tensor& qkv, int n_head, int n_kv_head) {
    const std::int64_t t = qkv.dim(1), hd = head_dim(qkv, n_head, n_kv_head);
    CachingAllocator& alloc = *(out ? out : &att)->allocator();
    lt_workspace(alloc);
    const Category ws = Category::workspace;
    auto qkv_buf = scratch_if(qkv.dtype() != DType::F32, alloc, {3, t, hd}, ws);
    auto att_buf = scratch_if(att.dtype() != DType::F32, alloc, {t, t}, ws);
    auto out_buf = scratch_if(out && out->dtype() != DType::F32, alloc, {t, hd}, ws);
  }
};

}  // namespace

std::unique_ptr<Ops> make_dry_run_ops(Backend target) {
  return std::make_unique<DryRunOps>(target);
}

}  // namespace memtrade
