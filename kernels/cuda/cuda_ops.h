// Private header of the CUDA ops: the CudaOps class (members defined across cuda_ops_*.{cu,cpp}
// by topic), the cuBLASLt GEMM description, dtype scratch helpers and the kernel launchers that
// host-only files call.
//
// Conventions (the same as the CPU ops, kernels/ops.h): every float tensor may be F32, F16 or
// BF16 independently; arithmetic is fp32; results are rounded once to the output's dtype. All
// work is enqueued on the device's compute stream; only sum_to_host and unscale_and_check
// synchronise. Every op opens an NVTX range with its own name.
//
// Scratch memory. Everything a CPU op allocates as Category::temporaries is allocated here too,
// with the same sizes and order in every dtype, so both backends make the same allocation
// sequence apart from Category::workspace; tests/gpu/test_cuda_alloc_sequence.cpp checks it.
//   - cuBLASLt workspace: one 32 MiB block (Category::workspace) taken from the device allocator
//     on the first GEMM (or reduction) and kept for the CudaOps' lifetime, with a 64 KiB tail for
//     reduction partials (sum_to_host, linear_backward's bias gradient, batch-norm over split
//     channels) and the inf/nan flag, so that these make no allocation of their own, as on the
//     CPU. Its users share it only through the one compute stream: none keeps data in it past the
//     end of its call;
//   - dtype casts that a library call needs because its operands differ in dtype (cuBLASLt wants
//     A and B alike; cuDNN wants x, w, y alike), fp32 accumulators for 16-bit maxpool
//     gradients and for the dqkv of 16-bit grouped-query attention, and the fp32 result of a
//     16-bit linear output whose bias is not fused (so that it is rounded once, with the bias
//     in): Category::workspace, freed before returning;
//   - cuDNN convolution workspace and the embedding-gradient sort buffers: Category::workspace;
//   - shared with the CPU: attention_backward's dP (NH, T, T) in qkv's dtype, flash attention
//     backward's D (B, NH, T) F32 and the embedding-gradient order (Category::temporaries);
//   - flash attention's tiles are shared memory (kernels/cuda/flash_attention_block.h). The CPU's
//   fp32 copies of 16-bit GEMM
//     operands are its workspace, as the casts here are ours.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/cuda/cuda_raii.h"
#include "kernels/cuda_workspace.h"
#include "kernels/op_checks.h"
#include "kernels/ops.h"

namespace memtrade::cuda {

// Sizes shared with the memory model (kernels/cuda_workspace.h).
inline constexpr std::size_t kLtWorkspaceBytes = kCudaLtWorkspaceBytes;
inline constexpr std::size_t kSmallScratchBytes = kCudaSmallScratchBytes;  // after cuBLASLt's

// ---- validation: kernels/op_checks.h (shared with the CPU backend), and for CUDA's own ----------
[[noreturn]] inline void fail(std::string_view op, const std::string& message) {
  throw_bad_op_argument(op, message);
}

// ---- dtype scratch ------------------------------------------------------------------------------
// `t` read as dtype `want`: t's own memory, or a cast copy (Category::workspace) from `alloc`.
class AsDType {
 public:
  AsDType(const Tensor& t, DType want, CachingAllocator& alloc, cudaStream_t stream);
  const void* data() const { return p_; }

 private:
  Tensor scratch_;
  const void* p_ = nullptr;
};

// `t` written as dtype `want`: t itself, or a scratch (initialised from t when load_existing)
// that commit() casts back into t.
class AsDTypeOut {
 public:
  AsDTypeOut(Tensor& t, DType want, bool load_existing, cudaStream_t stream);
  void* data() const { return p_; }
  void commit();

 private:
  Tensor& t_;
  Tensor scratch_;
  void* p_ = nullptr;
  cudaStream_t stream_;
};

// Streaming multiprocessors of the current device: sizes grids of reductions that would
// otherwise leave SMs idle (cudaDeviceGetAttribute is a host-side lookup, cheap per call).
inline int sm_count() {
  int device = 0, sms = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  return sms;
}

// ---- kernel launchers for host-only files (defined in .cu files) --------------------------------
// dst = src converted element-wise (n elements).
void launch_cast(void* dst, DType dt, const void* src, DType st, std::int64_t n, cudaStream_t s);
// p *= s element-wise (n elements).
void launch_scale(void* p, DType t, std::int64_t n, float s, cudaStream_t stream);
// dst (+)= src element-wise, any float dtypes.
void launch_store_grad(void* dst, DType dt, const void* src, DType st, std::int64_t n,
                       bool accumulate, cudaStream_t s);
// out (rows, cols) = from (rows, cols) + bias (cols), broadcast over rows, rounded once to out's
// dtype; from nullptr: out += bias.
void launch_add_row_bias(void* out, DType ot, const void* bias, DType bt, std::int64_t rows,
                         std::int64_t cols, cudaStream_t s, const float* from = nullptr);
// dst (cols) (+)= Σ_rows src (rows, cols), fp32 accumulation, deterministic (a fixed order for a
// given shape and GPU). Long columns are split into row chunks whose fp32 partials go to
// `scratch` (scratch_bytes of it; the small scratch), then summed in order.
void launch_col_sum(void* dst, DType dt, const void* src, DType st, std::int64_t rows,
                    std::int64_t cols, bool accumulate, float* scratch, std::size_t scratch_bytes,
                    cudaStream_t s);
// NCHW: out (N, C, HW) += bias (C).
void launch_channel_bias_add(void* out, DType ot, const void* bias, DType bt, std::int64_t n,
                             std::int64_t c, std::int64_t hw, cudaStream_t s);
// NCHW: dst (C) (+)= Σ over (N, HW) of src (N, C, HW).
void launch_channel_sum(void* dst, DType dt, const void* src, DType st, std::int64_t n,
                        std::int64_t c, std::int64_t hw, bool accumulate, cudaStream_t s);
// Gemma 2's soft-capped scores (kernels/ops.h AttentionScores), in place on n = slices·T·T scores
// of dtype t: tanh_out = tanh(s / cap) (masked entries 0), s = cap·tanh; and backward
// ds *= 1 − tanh².
void launch_softcap_scores(void* s, void* tanh_out, DType t, std::int64_t n, std::int64_t len,
                           float cap, cudaStream_t stream);
void launch_softcap_scores_backward(void* ds, const void* tanh_in, DType t, std::int64_t n,
                                    cudaStream_t stream);
// Causal softmax in place over rows of length T (row r is position r % T of its slice);
// masked entries become exactly 0. p32 (same rows), when not null, also receives the
// probabilities unrounded, in fp32.
void launch_causal_softmax(void* att, DType t, std::int64_t rows, std::int64_t len, cudaStream_t s,
                           float* p32 = nullptr);
// In place: dp <- P ⊙ (dP − Σ_j P·dP), masked entries 0; p and dp rows as above.
void launch_causal_softmax_backward(void* dp, DType dpt, const void* p, DType pt, std::int64_t rows,
                                    std::int64_t len, cudaStream_t s);

// ---- cuBLASLt GEMM ------------------------------------------------------------------------------
// Row-major C (M, N) = alpha · op(A) · op(B) + beta · C (+ bias (N) broadcast over rows), where
// op(A) is (M, K) — A stored (M, K) with row stride lda, or (K, M) when trans_a — and likewise
// op(B) is (K, N). `batch` matrices lie `stride_*` elements apart. A and B share `ab`; C is of
// dtype `ab` or F32 (16-bit A/B with fp32 output is native in cuBLASLt). The bias, if any, is of
// C's dtype and requires beta == 0.
struct GemmDesc {
  const void* a = nullptr;
  const void* b = nullptr;
  void* c = nullptr;
  // A bias (n) goes in before C's one rounding: in cuBLASLt's epilogue when it can (bias in C's
  // dtype, beta = 0), else added to an fp32 C, or, for a 16-bit C, to an fp32 scratch
  // (Category::workspace, from bias_scratch) that is then rounded into C once.
  const void* bias = nullptr;
  DType bias_type = DType::F32;
  CachingAllocator* bias_scratch = nullptr;
  DType ab = DType::F32, c_type = DType::F32;
  std::int64_t m = 0, n = 0, k = 0;
  bool trans_a = false, trans_b = false;
  std::int64_t lda = 0, ldb = 0, ldc = 0;
  std::int64_t batch = 1, stride_a = 0, stride_b = 0, stride_c = 0;
  float alpha = 1.0f, beta = 0.0f;
};

// One usable cuDNN algorithm of one convolution direction (forward, data or filter gradient),
// with the math type it needs and its workspace bytes; candidates are kept best first.
struct ConvChoice {
  int algo;
  cudnnMathType_t math;
  std::size_t bytes;
};

class CudaOps final : public Ops {
 public:
  // Workspace comes from `device_memory`; work goes to `stream` (not owned).
  CudaOps(CachingAllocator& device_memory, cudaStream_t stream);
  ~CudaOps() override;
  CudaOps(const CudaOps&) = delete;
  CudaOps& operator=(const CudaOps&) = delete;

  std::string name() const override { return "cuda"; }
  // TF32 tensor cores for fp32 GEMMs and convolutions (precision = tf32). Off by default.
  void set_tf32(bool on) override { tf32_ = on; }
  bool tf32() const { return tf32_; }
  cudaStream_t stream() const { return stream_; }

  void matmul(Tensor& c, const Tensor& a, const Tensor& b, bool trans_a, bool trans_b, float alpha,
              float beta) override;
  void linear_forward(Tensor& out, const Tensor& inp, const Tensor& weight,
                      const Tensor* bias) override;
  void linear_backward(Tensor* dinp, Tensor* dweight, Tensor* dbias, const Tensor& dout,
                       const Tensor& inp, const Tensor& weight, bool accumulate) override;

  void fill(Tensor& t, float value) override;
  void cast(Tensor& dst, const Tensor& src) override;
  void add(Tensor& out, const Tensor& a, const Tensor& b) override;
  void add_inplace(Tensor& y, const Tensor& x) override;
  void scale(Tensor& t, float s) override;
  void gelu_forward(Tensor& out, const Tensor& inp) override;
  void gelu_backward(Tensor& dinp, const Tensor& dout, const Tensor& inp) override;
  void relu_forward(Tensor& out, const Tensor& inp) override;
  void relu_backward(Tensor& dinp, const Tensor& dout, const Tensor& out) override;

  void layernorm_forward(Tensor& out, Tensor& mean, Tensor& rstd, const Tensor& inp,
                         const Tensor& weight, const Tensor& bias, float eps) override;
  void layernorm_backward(Tensor& dinp, Tensor* dweight, Tensor* dbias, const Tensor& dout,
                          const Tensor& inp, const Tensor& weight, const Tensor& mean,
                          const Tensor& rstd, bool accumulate) override;
  void softmax_forward(Tensor& out, const Tensor& inp) override;
  void softmax_backward(Tensor& dinp, const Tensor& dout, const Tensor& out) override;

  void attention_forward(Tensor& out, Tensor& att, const Tensor& qkv, int n_head, int n_kv_head,
                         const AttentionScores& scores = {}, Tensor* tanh_out = nullptr) override;
  void attention_probs(Tensor& att, const Tensor& qkv, int n_head, int n_kv_head,
                       const AttentionScores& scores = {}, Tensor* tanh_out = nullptr) override;
  void attention_backward(Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& att,
                          int n_head, int n_kv_head, const AttentionScores& scores = {},
                          const Tensor* tanh_in = nullptr, const Tensor* probs = nullptr) override;
  void flash_attention_forward(Tensor& out, Tensor& lse, const Tensor& qkv, int n_head,
                               int n_kv_head) override;
  void flash_attention_backward(Tensor& dqkv, const Tensor& dout, const Tensor& qkv,
                                const Tensor& out, const Tensor& lse, int n_head,
                                int n_kv_head) override;

  void embedding_forward(Tensor& out, const Tensor& tokens, const Tensor& wte,
                         const Tensor* wpe) override;
  void embedding_backward(Tensor* dwte, Tensor* dwpe, const Tensor& dout, const Tensor& tokens,
                          bool accumulate) override;
  void vocab_local_tokens(Tensor& local, const Tensor& tokens, std::int64_t offset,
                          std::int64_t count) override;
  void vocab_crossentropy_stats(Tensor& stats, const Tensor& logits, const Tensor& targets,
                                std::int64_t offset) override;
  void vocab_crossentropy_combine(Tensor& losses, Tensor& lse, const Tensor& stats,
                                  const Tensor& targets) override;
  void vocab_crossentropy_backward(Tensor& dlogits, const Tensor& logits, const Tensor& targets,
                                   const Tensor& lse, std::int64_t offset, float dloss) override;
  void crossentropy_forward(Tensor& losses, const Tensor& logits, const Tensor& targets) override;
  void crossentropy_backward(Tensor& dlogits, const Tensor& logits, const Tensor& targets,
                             float dloss) override;
  double sum_to_host(const Tensor& t) override;

  void conv2d_forward(Tensor& out, const Tensor& inp, const Tensor& weight, const Tensor* bias,
                      int stride, int pad) override;
  void conv2d_backward(Tensor* dinp, Tensor* dweight, Tensor* dbias, const Tensor& dout,
                       const Tensor& inp, const Tensor& weight, int stride, int pad,
                       bool accumulate) override;
  void batchnorm_forward(Tensor& out, Tensor& mean, Tensor& invstd, const Tensor& inp,
                         const Tensor& gamma, const Tensor& beta, Tensor* running_mean,
                         Tensor* running_var, float eps, float momentum) override;
  void batchnorm_backward(Tensor& dinp, Tensor* dgamma, Tensor* dbeta, const Tensor& dout,
                          const Tensor& inp, const Tensor& gamma, const Tensor& mean,
                          const Tensor& invstd, bool accumulate) override;
  void global_avgpool_forward(Tensor& out, const Tensor& inp) override;
  void global_avgpool_backward(Tensor& dinp, const Tensor& dout) override;
  void maxpool2d_forward(Tensor& out, Tensor& argmax, const Tensor& inp, int kernel,
                         int stride) override;
  void maxpool2d_backward(Tensor& dinp, const Tensor& dout, const Tensor& argmax) override;

  void rmsnorm_forward(Tensor& out, Tensor& rstd, const Tensor& inp, const Tensor& weight,
                       float eps, bool unit_offset = false) override;
  void rmsnorm_backward(Tensor& dinp, Tensor* dweight, const Tensor& dout, const Tensor& inp,
                        const Tensor& weight, const Tensor& rstd, bool accumulate,
                        bool unit_offset = false) override;
  void rope_forward(Tensor& qkv, int n_head, int n_kv_head, const RopeConfig& rope) override;
  void rope_backward(Tensor& dqkv, int n_head, int n_kv_head, const RopeConfig& rope) override;
  void swiglu_forward(Tensor& out, const Tensor& gate, const Tensor& up) override;
  void swiglu_backward(Tensor& dgate, Tensor& dup, const Tensor& dout, const Tensor& gate,
                       const Tensor& up) override;
  void geglu_forward(Tensor& out, const Tensor& gate, const Tensor& up) override;
  void geglu_backward(Tensor& dgate, Tensor& dup, const Tensor& dout, const Tensor& gate,
                      const Tensor& up) override;
  void softcap_forward(Tensor& out, const Tensor& inp, float cap) override;
  void softcap_backward(Tensor& dinp, const Tensor& dout, const Tensor& out, float cap) override;

  bool unscale_and_check(std::span<Tensor* const> grads, float inv_scale) override;
  void optimizer_update(const OptimizerHyper& h, Tensor& param, const Tensor& grad, Tensor* state0,
                        Tensor* state1) override;
  void optimizer_update_many(const OptimizerHyper& h,
                             std::span<const OptimizerSlot> slots) override;

 private:
  // One cuBLASLt matmul on the compute stream (cuda_ops_gemm.cpp).
  void gemm(const GemmDesc& g);
  void gemm_f32_then_bias(const GemmDesc& g);  // gemm()'s unfused bias on a 16-bit C
  // The persistent workspace: cuBLASLt's part and the small scratch after it.
  void* lt_workspace();
  void* small_scratch();
  cudnnHandle_t cudnn();  // created on first use: cuDNN loads its sub-libraries lazily
  void attention_impl(Tensor* out, Tensor& att, const Tensor& qkv, int n_head, int n_kv_head,
                      std::string_view op, const AttentionScores& scores, Tensor* tanh_out);

  using ConvKey = std::array<std::int64_t, 12>;
  struct ConvDescs;  // cuDNN descriptors of one convolution (cuda_ops_conv.cpp)
  // Candidates of direction `dir` (0 forward, 1 data gradient, 2 filter gradient), best first;
  // conv_run reorders and prunes the cached list.
  std::vector<ConvChoice>& conv_candidates(const ConvDescs& d, int dir);
  // Runs direction `dir` with the first candidate that cuDNN accepts and whose workspace the
  // allocator can give, and moves that one to the front for later calls. Operand order follows
  // cuDNN: forward (x, w) -> y; data gradient (w, dy) -> dx; filter gradient (x, dy) -> dw.
  void conv_run(const ConvDescs& d, int dir, const void* in0, const void* in1, void* out,
                float beta, CachingAllocator& alloc);
  using GemmKey = std::array<std::int64_t, 24>;

  CachingAllocator& memory_;
  cudaStream_t stream_;
  LtHandle lt_;
  CudnnHandle cudnn_;
  Tensor workspace_;  // kLtWorkspaceBytes + kSmallScratchBytes, Category::workspace
  bool tf32_ = false;
  // nullopt: the heuristic has no algorithm for this key (only fused-bias keys, which fall back).
  std::map<GemmKey, std::optional<cublasLtMatmulAlgo_t>> gemm_algos_;
  std::map<ConvKey, std::vector<ConvChoice>> conv_algos_;
};

}  // namespace memtrade::cuda
