// Private header of the CPU ops: the CpuOps class (its members are defined across
// cpu_ops_*.cpp by topic) and the helpers they share.
//
// Every float tensor may be F32, F16 or BF16 independently. Kernels work on fp32 values: F32
// tensors are read and written in place, 16-bit ones through small stack chunks (kChunk values)
// or, for GEMM and convolution operands, through fp32 scratch tensors taken from the output's
// allocator with category `workspace`: OpenBLAS has no 16-bit GEMM, so these copies are library
// scratch, like cuBLASLt's and cuDNN's workspace, and the other categories stay equal across
// backends.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "kernels/op_checks.h"
#include "kernels/ops.h"
#include "kernels/tensor.h"

namespace memtrade::cpu {

// Values per stack chunk: 4 KiB of floats, so a handful of them per thread is cheap.
inline constexpr std::int64_t kChunk = 1024;

// ---- validation ---------------------------------------------------------------------------------
// The checks every backend shares are in kernels/op_checks.h; fail() formats the CPU's own.
template <typename... Args>
[[noreturn]] void fail(std::string_view op, fmt::format_string<Args...> f, Args&&... args) {
  throw_bad_op_argument(op, fmt::format(f, std::forward<Args>(args)...));
}

// ---- fp32 access to float tensors ---------------------------------------------------------------
// n fp32 values of t from element `off`: a pointer into t when it is F32, else converted into buf.
const float* read_f32(const Tensor& t, std::int64_t off, std::int64_t n, float* buf);
// Where to compute n fp32 values for t from element `off`: t itself when F32, else buf; then
// write_f32() stores them (a no-op when the pointer is t's own memory).
float* dest_f32(Tensor& t, std::int64_t off, float* buf);
void write_f32(Tensor& t, std::int64_t off, std::int64_t n, const float* src);
// v[0..n) rounded in place to the precision of float dtype t (through its storage format).
void round_f32(float* v, std::int64_t n, DType t);
// Bulk conversions between any float storage and fp32 (over the threads when large).
void convert_to_f32(const void* src, DType t, std::int64_t n, float* dst);
void convert_from_f32(const float* src, DType t, std::int64_t n, void* dst);

// Whole-tensor fp32 view for GEMM operands: no copy for F32, else an fp32 scratch tensor
// (category workspace) from `alloc`, converted on construction and freed on destruction.
class F32In {
 public:
  F32In(const Tensor& t, CachingAllocator& alloc);
  const float* data() const { return p_; }

 private:
  Tensor scratch_;
  const float* p_ = nullptr;
};

// Whole-tensor fp32 output: t itself for F32, else a scratch (optionally initialised from t,
// for beta != 0 or accumulation); commit() rounds the result into t.
class F32Out {
 public:
  F32Out(Tensor& t, bool load_existing);
  float* data() { return p_; }
  void commit();

 private:
  Tensor& t_;
  Tensor scratch_;
  float* p_ = nullptr;
};

// Work (elements touched) below which an op stays on the calling thread, as PyTorch's
// at::internal::GRAIN_SIZE: with OMP_WAIT_POLICY=passive every parallel region wakes the other
// threads through the kernel, which costs more than a few thousand element operations, and
// far more on a loaded machine, where the woken thread may wait for a core.
inline constexpr std::int64_t kParallelGrain = 32768;

// Runs f(off, len) over [0, n) in kChunk pieces, in parallel when n >= kParallelGrain.
template <typename F>
void for_chunks(std::int64_t n, F&& f) {
  const std::int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (n >= kParallelGrain)
  for (std::int64_t c = 0; c < chunks; ++c) {
    const std::int64_t off = c * kChunk;
    f(off, n - off < kChunk ? n - off : kChunk);
  }
}

// Columns per block of the column-wise reductions (bias and norm parameter gradients): small
// enough that a GPT's 64..768 columns make several blocks for the threads, wide enough for
// vector loops. Each column is summed over the rows in order by one thread, so the result is
// the same for any block size or thread count.
inline constexpr std::int64_t kColumnBlock = 64;

// Runs f(col0, ncols) over the column blocks of a (rows, cols) reduction, in parallel when
// rows·cols >= kParallelGrain.
template <typename F>
void for_column_blocks(std::int64_t rows, std::int64_t cols, F&& f) {
  const std::int64_t blocks = (cols + kColumnBlock - 1) / kColumnBlock;
#pragma omp parallel for schedule(static) if (rows * cols >= kParallelGrain)
  for (std::int64_t b = 0; b < blocks; ++b) {
    const std::int64_t c0 = b * kColumnBlock;
    f(c0, cols - c0 < kColumnBlock ? cols - c0 : kColumnBlock);
  }
}

// ---- GEMM ---------------------------------------------------------------------------------------
// Row-major C (M, N) = alpha · op(A) · op(B) + beta · C with leading dimensions as in cblas.
// OpenBLAS when available, else blocked_sgemm. Inside a parallel region only if sgemm_nests().
// Outside one, a GEMM of 2^18 multiply-adds or more is split into one block of C's rows (or
// columns) per thread, each a single-threaded OpenBLAS call (cpu_ops_gemm.cpp says why); so, as
// with OpenBLAS's own threading, how a sum is rounded depends on the thread count.
void sgemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
           const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c,
           std::int64_t ldc);
// Whether sgemm may run inside an OpenMP parallel region, one call per thread: yes for the
// OpenMP (or sequential) OpenBLAS and for blocked_sgemm, which then run single-threaded; no for
// the pthreads OpenBLAS, whose pool would fight ours.
bool sgemm_nests();
// The portable fallback (always compiled so that tests cover it): cache-blocked, OpenMP over
// row blocks.
void blocked_sgemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                   float alpha, const float* a, std::int64_t lda, const float* b, std::int64_t ldb,
                   float beta, float* c, std::int64_t ldc);

// ---- the backend
// ---------------------------------------------------------------------------------
class CpuOps final : public Ops {
 public:
  std::string name() const override { return "cpu"; }

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
};

}  // namespace memtrade::cpu
