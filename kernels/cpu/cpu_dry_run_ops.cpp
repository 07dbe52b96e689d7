// Dry-run CPU ops: no arithmetic, no reads or writes of tensor memory, but every scratch
// buffer the real CPU ops take, of the same size and category, in the same order. The memory
// model (harness/run/estimate.cpp) runs a whole training step with them on a device whose memory
// is address space only. tests/harness/test_estimate.cpp holds them to the real ops: the
// predicted peak must equal the measured one on every smoke-grid point.
//
// With a StepClock they are also the time model's source (kernels/op_cost.h): each op charges
// its GEMM shapes, FLOPs and the bytes it reads and writes (each input read once, each output
// written once, an in-place tensor both), which the clock prices on the chosen GPU.
//
// For a CUDA target the CPU's workspace (fp32 copies, im2col) is left out and PyTorch's CUDA
// workspaces are taken where PyTorch's CUDA path takes them (kernels/torch_workspace.h): the
// cuBLAS and cuBLASLt workspaces of the main and the autograd thread on their first GEMM, and
// the embedding backward's sort buffers in the op. Each is named; those live at the
// allocator's peak are dry_run_workspace()'s (kernels/torch_workspace.h).
#include <algorithm>
#include <optional>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/op_cost.h"
#include "kernels/torch_workspace.h"

namespace memtrade {
namespace {

class DryRunOps final : public Ops {
 public:
  DryRunOps(Backend target, StepClock* clock, bool host, ComputeCapability cc)
      : cuda_(target == Backend::cuda), clock_(clock), host_(host), cc_(cc) {}
  std::string name() const override { return cuda_ ? "cuda (dry run)" : "cpu (dry run)"; }
  void set_tf32(bool on) override { tf32_ = on; }

  // dry_run_workspace(): the named blocks at the peak, merged by name in first-seen order.
  DryRunWorkspace workspace(const CachingAllocator* alloc) {
    if (alloc) note_peak(*alloc);
    DryRunWorkspace w;
    for (const auto& [name, bytes] : at_peak_) {
      auto it = std::find_if(w.at_peak.begin(), w.at_peak.end(),
                             [&](const auto& e) { return e.first == name; });
      if (it == w.at_peak.end())
        w.at_peak.emplace_back(name, bytes);
      else
        it->second += bytes;
    }
    w.convolutions = convolutions_;
    w.embedding_sorts = embedding_sorts_;
    w.embedding_cub_bound = embedding_cub_bound_;
    return w;
  }
  const CachingAllocator* allocator() const {
    return !kept_.empty() ? kept_.front().t.allocator() : nullptr;
  }

  void matmul(Tensor& c, const Tensor& a, const Tensor& b, bool trans_a, bool, float,
              float beta) override {
    const std::size_t r = c.shape().size();
    gemm(r == 3 ? c.dim(0) : 1, c.dim(r - 2), c.dim(r - 1), trans_a ? a.dim(r - 2) : a.dim(r - 1),
         gemm_dtype(a, b, c), nb(a) + nb(b) + nb(c) * (beta != 0.0f ? 2 : 1));
    cublas(*c.allocator());
    auto a32 = f32_copy(a, *c.allocator());
    auto b32 = f32_copy(b, *c.allocator());
    auto c32 = f32_copy(c, *c.allocator());
  }
  void linear_forward(Tensor& out, const Tensor& inp, const Tensor& weight,
                      const Tensor* bias) override {
    const std::int64_t oc = weight.dim(0), c = weight.dim(1);
    gemm(1, inp.numel() / std::max<std::int64_t>(c, 1), oc, c, gemm_dtype(inp, weight, out),
         nb(inp) + nb(weight) + nb(out) + (bias ? nb(*bias) : 0));
    cublas(*out.allocator());
    if (bias) cublaslt(*out.allocator());  // addmm with a bias: cuBLASLt's gemm_and_bias
    auto x = f32_copy(inp, *out.allocator());
    auto w = f32_copy(weight, *out.allocator());
    auto y = f32_copy(out, *out.allocator());
  }
  void linear_backward(Tensor* dinp, Tensor* dweight, Tensor* dbias, const Tensor& dout,
                       const Tensor& inp, const Tensor& weight, bool accumulate) override {
    const std::int64_t oc = weight.dim(0), c = weight.dim(1);
    const std::int64_t rows = inp.numel() / std::max<std::int64_t>(c, 1);
    if (dinp)
      gemm(1, rows, c, oc, gemm_dtype(dout, weight, *dinp), nb(dout) + nb(weight) + nb(*dinp));
    if (dweight)
      gemm(1, oc, c, rows, gemm_dtype(dout, inp, *dweight),
           nb(dout) + nb(inp) + nb(*dweight) * (accumulate ? 2 : 1));
    if (dbias) memory(nb(dout) + nb(*dbias) * (accumulate ? 2 : 1));
    if (dinp || dweight) cublas(*(dinp ? dinp : dweight)->allocator());
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

  void fill(Tensor& t, float) override { memory(nb(t)); }
  void cast(Tensor& dst, const Tensor& src) override { memory(nb(dst) + nb(src)); }
  void add(Tensor& out, const Tensor& a, const Tensor& b) override {
    memory(nb(out) + nb(a) + nb(b));
  }
  void add_inplace(Tensor& y, const Tensor& x) override { memory(2 * nb(y) + nb(x)); }
  void scale(Tensor& t, float) override { memory(2 * nb(t)); }
  void gelu_forward(Tensor& out, const Tensor& inp) override { memory(nb(out) + nb(inp)); }
  void gelu_backward(Tensor& dinp, const Tensor& dout, const Tensor& inp) override {
    memory(nb(dinp) + nb(dout) + nb(inp));
  }
  void relu_forward(Tensor& out, const Tensor& inp) override { memory(nb(out) + nb(inp)); }
  void relu_backward(Tensor& dinp, const Tensor& dout, const Tensor& out) override {
    memory(nb(dinp) + nb(dout) + nb(out));
  }
  void layernorm_forward(Tensor& out, Tensor& mean, Tensor& rstd, const Tensor& inp,
                         const Tensor& weight, const Tensor& bias, float) override {
    memory(nb(out) + nb(mean) + nb(rstd) + nb(inp) + nb(weight) + nb(bias));
  }
  void layernorm_backward(Tensor& dinp, Tensor* dweight, Tensor* dbias, const Tensor& dout,
                          const Tensor& inp, const Tensor& weight, const Tensor& mean,
                          const Tensor& rstd, bool) override {
    memory(nb(dinp) + nb(dout) + nb(inp) + nb(weight) + nb(mean) + nb(rstd) +
           2 * (opt_nb(dweight) + opt_nb(dbias)));
  }
  void softmax_forward(Tensor& out, const Tensor& inp) override { memory(nb(out) + nb(inp)); }
  void softmax_backward(Tensor& dinp, const Tensor& dout, const Tensor& out) override {
    memory(nb(dinp) + nb(dout) + nb(out));
  }

  // Math attention as the engine runs it per sequence: S = QKᵀ, the softmax (the scaled,
  // masked scores written, read and the probabilities written), and O = PV.
  // Soft-capping (Gemma 2) is one more pass over the scores (read, written, tanh written) in
  // forward and over dS (read, tanh read, written) in backward; no scratch on either backend.
  void attention_forward(Tensor& out, Tensor& att, const Tensor& qkv, int n_head, int n_kv_head,
                         const AttentionScores&, Tensor* tanh_out) override {
    const std::int64_t b = qkv.dim(0), t = qkv.dim(1), hd = head_dim(qkv, n_head, n_kv_head);
    const double scores = static_cast<double>(b * n_head * t * t) * dtype_size(qkv.dtype());
    gemm(b * n_head, t, t, hd, qkv.dtype(), 2.0 * nb(qkv) / 3 + scores);
    memory(2 * scores + nb(att));
    if (tanh_out) memory(2 * scores + nb(*tanh_out));
    gemm(b * n_head, t, hd, t, qkv.dtype(), nb(att) + nb(qkv) / 3.0 + nb(out));
    attention(&out, att, qkv, n_head, n_kv_head);
  }
  void attention_probs(Tensor& att, const Tensor& qkv, int n_head, int n_kv_head,
                       const AttentionScores&, Tensor* tanh_out) override {
    const std::int64_t b = qkv.dim(0), t = qkv.dim(1), hd = head_dim(qkv, n_head, n_kv_head);
    const double scores = static_cast<double>(b * n_head * t * t) * dtype_size(qkv.dtype());
    gemm(b * n_head, t, t, hd, qkv.dtype(), 2.0 * nb(qkv) / 3 + scores);
    memory(2 * scores + nb(att));
    if (tanh_out) memory(2 * scores + nb(*tanh_out));
    attention(nullptr, att, qkv, n_head, n_kv_head);
  }
  void attention_backward(Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& att,
                          int n_head, int n_kv_head, const AttentionScores&, const Tensor* tanh_in,
                          const Tensor* probs) override {
    const std::int64_t t = qkv.dim(1), hd = head_dim(qkv, n_head, n_kv_head);
    {  // dV = Pᵀ dO, dP = dO Vᵀ, dS = P ∘ (dP − rowsum(dP ∘ P)), dQ = dS K, dK = dSᵀ Q
      const std::int64_t bh = qkv.dim(0) * n_head;
      const double scores = static_cast<double>(bh * t * t) * dtype_size(qkv.dtype());
      gemm(bh, t, hd, t, qkv.dtype(), nb(att) + nb(dout) + nb(dqkv) / 3.0);
      gemm(bh, t, t, hd, qkv.dtype(), nb(dout) + nb(qkv) / 3.0 + scores);
      memory(nb(probs ? *probs : att) + 3 * scores);  // dS reads the fp32 P where given
      if (tanh_in) memory(nb(*tanh_in) + 2 * scores);
      gemm(bh, t, hd, t, qkv.dtype(), scores + nb(qkv) / 3.0 + nb(dqkv) / 3.0);
      gemm(bh, t, hd, t, qkv.dtype(), scores + nb(qkv) / 3.0 + nb(dqkv) / 3.0);
    }
    CachingAllocator& alloc = *dqkv.allocator();
    cublas(alloc);
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
  // no cuBLAS workspace; backward's D on both backends, the CPU's fp32 copies on the CPU.
  void flash_attention_forward(Tensor& out, Tensor& lse, const Tensor& qkv, int n_head,
                               int n_kv_head) override {
    if (qkv.numel() == 0) return;
    if (clock_)
      clock_->flash(flash_flops(qkv, n_head, n_kv_head), nb(qkv) + nb(out) + nb(lse), qkv.dtype(),
                    false);
    auto qkv32 = f32_copy(qkv, *out.allocator());
  }
  void flash_attention_backward(Tensor& dqkv, const Tensor& dout, const Tensor& qkv,
                                const Tensor& out, const Tensor& lse, int n_head,
                                int n_kv_head) override {
    if (qkv.numel() == 0) return;
    if (clock_) {
      memory(nb(dout) + nb(out) + nb(lse));  // D = rowsum(dO ∘ O), its own kernel
      // FlashAttention-2's backward: 5 GEMMs against the forward's 2 (S recomputed, dV, dP, dQ,
      // dK), 2.5 x its FLOPs.
      clock_->flash(2.5 * flash_flops(qkv, n_head, n_kv_head),
                    nb(qkv) + nb(dout) + 2 * nb(lse) + nb(dqkv), qkv.dtype(), true);
    }
    CachingAllocator& alloc = *dqkv.allocator();
    Tensor dsum(alloc, lse.shape(), DType::F32, Category::temporaries);
    auto qkv32 = f32_copy(qkv, alloc);
    auto dout32 = f32_copy(dout, alloc);
    auto dqkv32 = f32_copy(dqkv, alloc);
  }

  void embedding_forward(Tensor& out, const Tensor& tokens, const Tensor&,
                         const Tensor* wpe) override {
    memory(nb(tokens) + nb(out) * (wpe ? 3 : 2));  // the gathered rows, the positions, out
  }
  // torch's embedding_dense_backward: a zeroed (V, C) gradient, then the rows scattered into it.
  // For CUDA, PyTorch's sort buffers: wte's over the B·T tokens, wpe's over the T positions
  // (HF's position_ids are one (1, T) row, broadcast over the batch).
  void embedding_backward(Tensor* dwte, Tensor* dwpe, const Tensor& dout, const Tensor& tokens,
                          bool accumulate) override {
    memory(nb(tokens) + nb(dout) + 2 * nb(dout) * ((dwte ? 1 : 0) + (dwpe ? 1 : 0)) +
           (accumulate ? 0 : opt_nb(dwte) + opt_nb(dwpe)));
    if (dwte) {
      Tensor order(*dwte->allocator(), {tokens.numel()}, DType::I32, Category::temporaries);
      embedding_sort(*dwte->allocator(), tokens.numel(), dwte->dim(0), dwte->dim(1));
    }
    if (dwpe) embedding_sort(*dwpe->allocator(), tokens.dim(1), dwpe->dim(0), dwpe->dim(1));
  }
  void vocab_local_tokens(Tensor& local, const Tensor& targets, std::int64_t,
                          std::int64_t) override {
    memory(nb(local) + nb(targets));
  }
  void vocab_crossentropy_stats(Tensor& stats, const Tensor& logits, const Tensor& targets,
                                std::int64_t) override {
    memory(nb(stats) + nb(logits) + nb(targets));
  }
  void vocab_crossentropy_combine(Tensor& losses, Tensor& stats, const Tensor& a,
                                  const Tensor& b) override {
    memory(nb(losses) + nb(stats) + nb(a) + nb(b));
  }
  void vocab_crossentropy_backward(Tensor& dlogits, const Tensor& logits, const Tensor& targets,
                                   const Tensor& stats, std::int64_t, float) override {
    memory(nb(dlogits) + nb(logits) + nb(targets) + nb(stats));
  }
  void crossentropy_forward(Tensor& losses, const Tensor& logits, const Tensor& targets) override {
    memory(nb(logits) + nb(targets) + nb(losses));
  }
  void crossentropy_backward(Tensor& dlogits, const Tensor& logits, const Tensor& targets,
                             float) override {
    memory(nb(dlogits) + nb(logits) + nb(targets));
  }
  double sum_to_host(const Tensor& t) override {
    memory(nb(t));
    return 0.0;
  }

  // Convolution as cuDNN's implicit GEMM: (Co) x (N·OH·OW) x (Ci·KH·KW).
  // For CUDA, cuDNN's workspace is the chosen plan's (algorithm-dependent): not modelled, only
  // counted (DryRunWorkspace::convolutions), so that the estimate names it.
  void conv2d_forward(Tensor& out, const Tensor& inp, const Tensor& weight, const Tensor*,
                      int stride, int pad) override {
    ++convolutions_;
    Conv d = dims(inp, weight, stride, pad);
    gemm(1, d.co, inp.dim(0) * d.p, d.k, gemm_dtype(inp, weight, out),
         nb(inp) + nb(weight) + nb(out));
    CachingAllocator& alloc = *out.allocator();
    auto w = f32_copy(weight, alloc);
    auto out_buf = scratch_if(out.dtype() != DType::F32, alloc, {d.co, d.p}, Category::workspace);
    auto col = scratch_if(true, alloc, {d.k, d.p}, Category::workspace);
  }
  void conv2d_backward(Tensor* dinp, Tensor* dweight, Tensor*, const Tensor& dout,
                       const Tensor& inp, const Tensor& weight, int stride, int pad,
                       bool) override {
    if (!dinp && !dweight) return;
    ++convolutions_;
    Conv d = dims(inp, weight, stride, pad);
    if (dinp)
      gemm(1, d.k, inp.dim(0) * d.p, d.co, gemm_dtype(dout, weight, *dinp),
           nb(dout) + nb(weight) + nb(*dinp));
    if (dweight)
      gemm(1, d.co, d.k, inp.dim(0) * d.p, gemm_dtype(dout, inp, *dweight),
           nb(dout) + nb(inp) + 2 * nb(*dweight));
    CachingAllocator& alloc = *(dinp ? dinp : dweight)->allocator();
    std::optional<Tensor> w, dw;
    if (dinp) w = f32_copy(weight, alloc);
    if (dweight) dw = f32_copy(*dweight, *dweight->allocator());
    auto dout_buf = scratch_if(dout.dtype() != DType::F32, alloc, {d.co, d.p}, Category::workspace);
    auto dinp_buf = scratch_if(dinp && dinp->dtype() != DType::F32, alloc,
                               {inp.dim(1), inp.dim(2), inp.dim(3)}, Category::workspace);
    auto col = scratch_if(true, alloc, {d.k, d.p}, Category::workspace);
  }
  // Batch-norm reads its input twice (statistics, then normalisation); backward reads dout and
  // the input twice (the sums, then dinp).
  void batchnorm_forward(Tensor& out, Tensor&, Tensor&, const Tensor& inp, const Tensor&,
                         const Tensor&, Tensor*, Tensor*, float, float) override {
    memory(2 * nb(inp) + nb(out));
  }
  void batchnorm_backward(Tensor& dinp, Tensor*, Tensor*, const Tensor& dout, const Tensor& inp,
                          const Tensor&, const Tensor&, const Tensor&, bool) override {
    memory(2 * (nb(dout) + nb(inp)) + nb(dinp));
  }
  void global_avgpool_forward(Tensor& out, const Tensor& inp) override {
    memory(nb(out) + nb(inp));
  }
  void global_avgpool_backward(Tensor& dinp, const Tensor& dout) override {
    memory(nb(dinp) + nb(dout));
  }
  void maxpool2d_forward(Tensor& out, Tensor& argmax, const Tensor& inp, int, int) override {
    memory(nb(out) + nb(argmax) + nb(inp));
  }
  void maxpool2d_backward(Tensor& dinp, const Tensor& dout, const Tensor& argmax) override {
    memory(2 * nb(dinp) + nb(dout) + nb(argmax));  // zeroed, then scattered into
  }

  // The Llama-family ops take no scratch on either backend.
  void rmsnorm_forward(Tensor& out, Tensor& rstd, const Tensor& inp, const Tensor& weight, float,
                       bool) override {
    memory(nb(out) + nb(rstd) + nb(inp) + nb(weight));
  }
  void rmsnorm_backward(Tensor& dinp, Tensor* dweight, const Tensor& dout, const Tensor& inp,
                        const Tensor& weight, const Tensor& rstd, bool, bool) override {
    memory(nb(dinp) + nb(dout) + nb(inp) + nb(weight) + nb(rstd) + 2 * opt_nb(dweight));
  }
  // RoPE rotates the q and k heads in place: NH + NKV of the NH + 2·NKV heads, read and written.
  void rope_forward(Tensor& qkv, int n_head, int n_kv_head, const RopeConfig&) override {
    memory(2 * nb(qkv) * (n_head + n_kv_head) / (n_head + 2.0 * n_kv_head));
  }
  void rope_backward(Tensor& dqkv, int n_head, int n_kv_head, const RopeConfig&) override {
    memory(2 * nb(dqkv) * (n_head + n_kv_head) / (n_head + 2.0 * n_kv_head));
  }
  void swiglu_forward(Tensor& out, const Tensor& gate, const Tensor& up) override {
    memory(nb(out) + nb(gate) + nb(up));
  }
  void swiglu_backward(Tensor& dgate, Tensor& dup, const Tensor& dout, const Tensor& gate,
                       const Tensor& up) override {
    memory(nb(dgate) + nb(dup) + nb(dout) + nb(gate) + nb(up));
  }
  void geglu_forward(Tensor& out, const Tensor& gate, const Tensor& up) override {
    memory(nb(out) + nb(gate) + nb(up));
  }
  void geglu_backward(Tensor& dgate, Tensor& dup, const Tensor& dout, const Tensor& gate,
                      const Tensor& up) override {
    memory(nb(dgate) + nb(dup) + nb(dout) + nb(gate) + nb(up));
  }
  void softcap_forward(Tensor& out, const Tensor& inp, float) override {
    memory(nb(out) + nb(inp));
  }
  void softcap_backward(Tensor& dinp, const Tensor& dout, const Tensor& out, float) override {
    memory(nb(dinp) + nb(dout) + nb(out));
  }

  // One multi-tensor launch over every grad: read, and written where it scales.
  bool unscale_and_check(std::span<Tensor* const> grads, float inv_scale) override {
    grads_read();
    double bytes = 0;
    for (Tensor* g : grads)
      if (g) bytes += nb(*g) * (inv_scale != 1.0f ? 2 : 1);
    memory(bytes);
    return false;
  }
  void optimizer_update(const OptimizerHyper&, Tensor& param, const Tensor& grad, Tensor* state0,
                        Tensor* state1) override {
    grads_read();
    memory(update_bytes(param, grad, state0, state1));
  }
  // Multi-tensor apply (torch's fused/foreach optimizers): one pass over every slot.
  void optimizer_update_many(const OptimizerHyper&, std::span<const OptimizerSlot> slots) override {
    grads_read();
    double bytes = 0;
    for (const OptimizerSlot& s : slots)
      bytes += update_bytes(*s.param, *s.grad, s.state0, s.state1);
    if (!slots.empty()) memory(bytes);
  }

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
  // ---- PyTorch's CUDA workspaces (CUDA target only) ----
  // The host thread whose cuBLAS handle a GEMM uses: autograd's device thread in backward
  // (recomputation included), the main thread elsewhere (kernels/torch_workspace.h).
  static int thread_of(const CachingAllocator& alloc) { return alloc.phase() == "backward"; }
  // A named block: kept (the handles' workspaces) or transient (in an op, until `pop`).
  void named(CachingAllocator& alloc, std::int64_t bytes, const char* name, bool kept) {
    note_peak(alloc);
    auto& list = kept ? kept_ : transient_;
    Tensor t(alloc, {(bytes + 3) / 4}, DType::I32, Category::workspace);
    const auto block = static_cast<std::int64_t>(alloc.block_size(t.data()));
    list.push_back({name, std::move(t), block});
    note_peak(alloc);
  }
  void pop_transient(std::size_t n) {  // the last-taken first
    for (; n > 0; --n) transient_.pop_back();
  }
  // The calling thread's cuBLAS workspace, taken on its handle's first GEMM.
  void cublas(CachingAllocator& alloc) {
    if (!cuda_) return;
    note_peak(alloc);
    const int t = thread_of(alloc);
    if (cublas_[t]) return;
    cublas_[t] = true;
    named(alloc, static_cast<std::int64_t>(cublas_workspace_bytes(cc_)),
          t ? "cublas_autograd_thread" : "cublas_main_thread", true);
  }
  void cublaslt(CachingAllocator& alloc) {
    if (!cuda_) return;
    const int t = thread_of(alloc);
    if (cublaslt_[t]) return;
    cublaslt_[t] = true;
    named(alloc, static_cast<std::int64_t>(cublaslt_workspace_bytes(cc_)),
          t ? "cublaslt_autograd_thread" : "cublaslt_main_thread", true);
  }
  // embedding_dense_backward_cuda's sort path for n indices into v rows of c
  // (kernels/torch_workspace.h), in its allocation order; everything is freed when it returns.
  void embedding_sort(CachingAllocator& alloc, std::int64_t n, std::int64_t v, std::int64_t c) {
    if (!cuda_) return;
    const EmbeddingSortBuffers b = embedding_sort_buffers(n, v, c);
    if (b.index == 0) return;
    ++embedding_sorts_;
    embedding_cub_bound_ = std::max(embedding_cub_bound_, b.cub_tiles_bound);
    const char* seg = "embedding_sort_segments";
    named(alloc, b.index, "embedding_sort_indices", false);  // sorted_indices
    named(alloc, b.index, "embedding_sort_indices", false);  // orig_indices
    named(alloc, b.range, "embedding_sort_range", false);
    named(alloc, b.sort_alt, "embedding_sort_cub", false);
    pop_transient(2);                             // the sort's temporary storage, then `range`
    named(alloc, b.segment_offsets, seg, false);  // segment_offsets
    named(alloc, b.scalar, seg, false);           // num_of_segments
    named(alloc, b.partials, seg, false);         // partials_per_segment
    named(alloc, b.partials, seg, false);         // partials_per_segment_offset
    named(alloc, b.scalar, seg, false);           // num_of_partial_segments
    named(alloc, b.partial_offsets, seg, false);  // partial_segment_offset
    named(alloc, b.partial_sums, "embedding_sort_partial_sums", false);
    pop_transient(9);
  }
  // Records the named blocks live whenever the allocator's peak has moved since the last look:
  // between ops only kept blocks live, so a look at every GEMM and in every named allocation
  // sees each peak with what was live at it.
  void note_peak(const CachingAllocator& alloc) {
    const std::int64_t peak = alloc.stats().allocated.peak;
    if (peak == seen_peak_) return;
    seen_peak_ = peak;
    at_peak_.clear();
    for (const auto* list : {&kept_, &transient_})
      for (const Named& n : *list) at_peak_.emplace_back(n.name, n.block);
  }

  // ---- the time model's charges (no clock: nothing) ----
  static double nb(const Tensor& t) { return static_cast<double>(t.nbytes()); }
  static double opt_nb(const Tensor* t) { return t ? nb(*t) : 0.0; }
  static double update_bytes(const Tensor& param, const Tensor& grad, const Tensor* s0,
                             const Tensor* s1) {
    return 2 * nb(param) + nb(grad) + 2 * (opt_nb(s0) + opt_nb(s1));
  }
  // A GEMM runs in one dtype (kernels/ops.h): both operands' 16-bit one, else the output's.
  static DType gemm_dtype(const Tensor& a, const Tensor& b, const Tensor& out) {
    return a.dtype() == b.dtype() && a.dtype() != DType::F32 ? a.dtype() : out.dtype();
  }
  // Causal attention's GEMMs, QKᵀ and PV, over the lower triangle: 2 · 2·T²·hd / 2 per head.
  static double flash_flops(const Tensor& qkv, int n_head, int n_kv_head) {
    const double t = static_cast<double>(qkv.dim(1));
    return 2.0 * static_cast<double>(qkv.dim(0)) * n_head * t * t *
           static_cast<double>(head_dim(qkv, n_head, n_kv_head));
  }
  void gemm(std::int64_t batch, std::int64_t m, std::int64_t n, std::int64_t k, DType dtype,
            double bytes) {
    if (!clock_) return;
    if (host_)
      clock_->host_op(bytes);
    else
      clock_->gemm(batch, m, n, k, dtype, tf32_, bytes);
  }
  // The optimizer reads reduced grads: the compute stream waits for the started reductions.
  void grads_read() {
    if (clock_ && !host_) clock_->wait_collectives();
  }
  void memory(double bytes) {
    if (!clock_) return;
    if (host_)
      clock_->host_op(bytes);
    else
      clock_->memory_op(bytes);
  }

  bool cuda_;
  StepClock* clock_;
  bool host_;
  ComputeCapability cc_;
  bool tf32_ = false;
  struct Named {
    const char* name;
    Tensor t;
    std::int64_t block;  // the allocator's rounded bytes
  };
  std::vector<Named> kept_, transient_;
  bool cublas_[2] = {false, false}, cublaslt_[2] = {false, false};  // by thread_of()
  std::int64_t seen_peak_ = -1;
  std::vector<std::pair<std::string, std::int64_t>> at_peak_;
  std::int64_t convolutions_ = 0, embedding_sorts_ = 0, embedding_cub_bound_ = 0;

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
    cublas(alloc);
    const Category ws = Category::workspace;
    auto qkv_buf = scratch_if(qkv.dtype() != DType::F32, alloc, {3, t, hd}, ws);
    // an F32 att of 16-bit qkv keeps fp32 P: the ·V product's rounded copy is scratch
    auto att_buf =
        scratch_if(att.dtype() != DType::F32 || qkv.dtype() != DType::F32, alloc, {t, t}, ws);
    auto out_buf = scratch_if(out && out->dtype() != DType::F32, alloc, {t, hd}, ws);
  }
};

}  // namespace

std::unique_ptr<Ops> make_dry_run_ops(Backend target, StepClock* clock, bool host) {
  return std::make_unique<DryRunOps>(target, clock, host, kDefaultCudaTarget);
}

std::unique_ptr<Ops> make_dry_run_ops(Backend target, StepClock* clock, bool host,
                                      ComputeCapability cc) {
  return std::make_unique<DryRunOps>(target, clock, host, cc);
}

DryRunWorkspace dry_run_workspace(Ops& ops) {
  auto* d = dynamic_cast<DryRunOps*>(&ops);
  return d ? d->workspace(d->allocator()) : DryRunWorkspace{};
}

}  // namespace memtrade
