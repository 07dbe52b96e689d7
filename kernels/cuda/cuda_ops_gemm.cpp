// GEMM-based ops on cuBLASLt: matmul, linear forward/backward, and the row-major GEMM they share.
//
// cuBLASLt is column-major; a row-major C = op(A)·op(B) is the column-major Cᵀ = op(B)ᵀ·op(A)ᵀ,
// so A and B swap places and each row-major matrix is read as its column-major transpose — no
// data moves. fp32 uses COMPUTE_32F (COMPUTE_32F_FAST_TF32 with tf32 on); fp16/bf16 inputs use
// fp32 compute and fp32 scaling, with a 16-bit or an fp32 output. Operands of differing dtypes
// are cast to one dtype first (scratch: Category::workspace). The algorithm chosen by the
// heuristic is cached per problem description.
#include <fmt/format.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>

#include "kernels/cuda/cuda_ops.h"

namespace memtrade::cuda {
namespace {

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::F32:
      return CUDA_R_32F;
    case DType::F16:
      return CUDA_R_16F;
    case DType::BF16:
      return CUDA_R_16BF;
    case DType::I32:
      break;
  }
  throw std::invalid_argument("cuBLASLt GEMM: i32 operands are not supported");
}

// Largest power of two (<= 256 B) dividing the address and, when batched, the batch stride:
// what cuBLASLt may assume about every matrix of the batch.
std::uint32_t alignment_of(const void* p, std::int64_t stride, DType t, std::int64_t batch) {
  std::uint64_t x = reinterpret_cast<std::uintptr_t>(p);
  if (batch > 1) x |= static_cast<std::uint64_t>(stride) * dtype_size(t);
  std::uint32_t a = 256;
  while (a > 1 && x % a != 0) a >>= 1;
  return a;
}

struct DescDeleter {
  void operator()(cublasLtMatmulDescOpaque_t* d) const noexcept {
    CUBLAS_CHECK_NOTHROW(cublasLtMatmulDescDestroy(d));
  }
};
struct LayoutDeleter {
  void operator()(cublasLtMatrixLayoutOpaque_t* l) const noexcept {
    CUBLAS_CHECK_NOTHROW(cublasLtMatrixLayoutDestroy(l));
  }
};
struct PrefDeleter {
  void operator()(cublasLtMatmulPreferenceOpaque_t* p) const noexcept {
    CUBLAS_CHECK_NOTHROW(cublasLtMatmulPreferenceDestroy(p));
  }
};
using MatmulDesc = std::unique_ptr<cublasLtMatmulDescOpaque_t, DescDeleter>;
using Layout = std::unique_ptr<cublasLtMatrixLayoutOpaque_t, LayoutDeleter>;
using Preference = std::unique_ptr<cublasLtMatmulPreferenceOpaque_t, PrefDeleter>;

// A column-major layout of `rows` x `cols` with leading dimension ld, batched.
Layout make_layout(DType t, std::int64_t rows, std::int64_t cols, std::int64_t ld,
                   std::int64_t batch, std::int64_t stride) {
  cublasLtMatrixLayout_t l = nullptr;
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&l, cuda_type(t), static_cast<std::uint64_t>(rows),
                                          static_cast<std::uint64_t>(cols), ld));
  Layout owner(l);
  if (batch > 1) {
    const auto count = static_cast<std::int32_t>(batch);
    CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count,
                                                  sizeof(count)));
    CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                  &stride, sizeof(stride)));
  }
  return owner;
}

template <typename T>
void set_desc(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr, const T& value) {
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d, attr, &value, sizeof(value)));
}

// Picks the dtype a GEMM runs in: the output's, unless A and B share a 16-bit dtype and the
// output is F32 (cuBLASLt's native mixed mode).
DType gemm_input_dtype(const Tensor& a, const Tensor& b, const Tensor& c) {
  if (a.dtype() == b.dtype() && (a.dtype() == c.dtype() || c.dtype() == DType::F32))
    return a.dtype();
  return c.dtype();
}

}  // namespace

void CudaOps::gemm(const GemmDesc& g) {
  if (g.m == 0 || g.n == 0 || g.batch == 0) return;
  if (g.ab == DType::I32 || g.c_type == DType::I32 || (g.c_type != g.ab && g.c_type != DType::F32))
    throw std::invalid_argument(fmt::format("gemm: unsupported dtypes A/B {} with C {}",
                                            dtype_name(g.ab), dtype_name(g.c_type)));
  if (g.k == 0) {
    // C = beta·C (+ bias): nothing to multiply, and cuBLASLt rejects k = 0.
    if (g.ldc != g.n || (g.batch > 1 && g.stride_c != g.m * g.n))
      throw std::invalid_argument("gemm: k = 0 is only supported for contiguous C");
    const std::int64_t total = g.batch * g.m * g.n;
    if (g.beta == 0.0f) {
      CUDA_CHECK(
          cudaMemsetAsync(g.c, 0, static_cast<std::size_t>(total) * dtype_size(g.c_type), stream_));
    } else if (g.beta != 1.0f) {
      launch_scale(g.c, g.c_type, total, g.beta, stream_);
    }
    if (g.bias)
      launch_add_row_bias(g.c, g.c_type, g.bias, g.bias_type, g.batch * g.m, g.n, stream_);
    return;
  }

  const bool f32 = g.ab == DType::F32;
  const cublasComputeType_t compute =
      f32 && tf32_ ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  // Swapped operands (see the file comment): Lt's A is our B, Lt's B is our A.
  const cublasOperation_t op_a = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const std::uint32_t align_a = alignment_of(g.b, g.stride_b, g.ab, g.batch);
  const std::uint32_t align_b = alignment_of(g.a, g.stride_a, g.ab, g.batch);
  const std::uint32_t align_c = alignment_of(g.c, g.stride_c, g.c_type, g.batch);

  auto make_desc = [&](bool with_bias) {
    cublasLtMatmulDesc_t d = nullptr;
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&d, compute, CUDA_R_32F));
    MatmulDesc owner(d);
    set_desc(d, CUBLASLT_MATMUL_DESC_TRANSA, op_a);
    set_desc(d, CUBLASLT_MATMUL_DESC_TRANSB, op_b);
    if (with_bias) {
      set_desc(d, CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_BIAS);
      set_desc(d, CUBLASLT_MATMUL_DESC_BIAS_POINTER, g.bias);
    }
    return owner;
  };
  Layout la =
      make_layout(g.ab, g.trans_b ? g.k : g.n, g.trans_b ? g.n : g.k, g.ldb, g.batch, g.stride_b);
  Layout lb =
      make_layout(g.ab, g.trans_a ? g.m : g.k, g.trans_a ? g.k : g.m, g.lda, g.batch, g.stride_a);
  Layout lc = make_layout(g.c_type, g.n, g.m, g.ldc, g.batch, g.stride_c);

  void* ws = lt_workspace();
  auto find_algo = [&](cublasLtMatmulDesc_t desc, bool with_bias, cublasLtMatmulAlgo_t* algo) {
    const GemmKey key{g.m,
                      g.n,
                      g.k,
                      g.trans_a,
                      g.trans_b,
                      g.lda,
                      g.ldb,
                      g.ldc,
                      g.batch,
                      g.stride_a,
                      g.stride_b,
                      g.stride_c,
                      static_cast<std::int64_t>(g.ab),
                      static_cast<std::int64_t>(g.c_type),
                      with_bias,
                      tf32_,
                      align_a,
                      align_b,
                      align_c,
                      g.beta != 0.0f,
                      0,
                      0,
                      0,
                      0};
    if (auto it = gemm_algos_.find(key); it != gemm_algos_.end()) {
      if (!it->second) return false;  // known: no fused-bias algorithm for this problem
      *algo = *it->second;
      return true;
    }
    cublasLtMatmulPreference_t p = nullptr;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&p));
    Preference pref(p);
    const std::uint64_t ws_bytes = kLtWorkspaceBytes;
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(p, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                      &ws_bytes, sizeof(ws_bytes)));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                                      &align_a, sizeof(align_a)));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                                      &align_b, sizeof(align_b)));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                                      &align_c, sizeof(align_c)));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                                      &align_c, sizeof(align_c)));
    if (g.c_type != DType::F32) {
      // A 16-bit D must be rounded once (ops.h). The default mask also allows split-K schemes
      // that add the partial sums in D's dtype (INPLACE, OUTPUT_TYPE), i.e. round each split;
      // keep fp32 partials (COMPUTE_TYPE) or none. c_type is in the key, so the cache agrees.
      const std::uint32_t schemes =
          CUBLASLT_REDUCTION_SCHEME_NONE | CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
      CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
          p, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &schemes, sizeof(schemes)));
    }
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(
        lt_.get(), desc, la.get(), lb.get(), lc.get(), lc.get(), p, 1, &result, &found);
    // result's fields are valid only when its own state is SUCCESS too (cublasLt.h).
    const cublasStatus_t why = st != CUBLAS_STATUS_SUCCESS ? st : result.state;
    if (why != CUBLAS_STATUS_SUCCESS || found == 0) {
      if (with_bias) {  // the caller retries without the fused bias; don't ask again next call
        gemm_algos_.emplace(key, std::nullopt);
        return false;
      }
      throw std::runtime_error(fmt::format(
          "cuBLASLt found no algorithm ({}) for C ({}, {}) = A{} · B{}, k = {}, batch {}, {} -> {}",
          why != CUBLAS_STATUS_SUCCESS ? cublasGetStatusString(why) : "none returned", g.m, g.n,
          g.trans_a ? "ᵀ" : "", g.trans_b ? "ᵀ" : "", g.k, g.batch, dtype_name(g.ab),
          dtype_name(g.c_type)));
    }
    gemm_algos_.emplace(key, result.algo);
    *algo = result.algo;
    return true;
  };

  // The bias goes into cuBLASLt's epilogue when it is in C's dtype and the heuristic has an
  // algorithm for it; otherwise it is added after the GEMM (GemmDesc).
  bool fused_bias = g.bias != nullptr && g.beta == 0.0f && g.bias_type == g.c_type;
  MatmulDesc desc = make_desc(fused_bias);
  cublasLtMatmulAlgo_t algo{};
  if (fused_bias && !find_algo(desc.get(), true, &algo)) fused_bias = false;
  if (g.bias && !fused_bias) {
    if (g.ldc != g.n || g.batch != 1)
      throw std::invalid_argument("gemm: an unfused bias needs one contiguous C");
    if (g.c_type != DType::F32) {
      gemm_f32_then_bias(g);
      return;
    }
  }
  if (!fused_bias) {
    desc = make_desc(false);
    find_algo(desc.get(), false, &algo);
  }
  CUBLAS_CHECK(cublasLtMatmul(lt_.get(), desc.get(), &g.alpha, g.b, la.get(), g.a, lb.get(),
                              &g.beta, g.c, lc.get(), g.c, lc.get(), &algo, ws, kLtWorkspaceBytes,
                              stream_));
  if (g.bias && !fused_bias)  // fp32 C: the GEMM's sum, then the bias (as the CPU's sgemm onto it)
    launch_add_row_bias(g.c, g.c_type, g.bias, g.bias_type, g.m, g.n, stream_);
}

void CudaOps::gemm_f32_then_bias(const GemmDesc& g) {
  // A 16-bit C that must not be rounded before its bias is added (ops.h: one rounding).
  if (g.bias_scratch == nullptr)
    throw std::logic_error("gemm: an unfused bias on a 16-bit C needs bias_scratch");
  Tensor acc(*g.bias_scratch, {g.m, g.n}, DType::F32, Category::workspace);
  if (g.beta != 0.0f) launch_cast(acc.data(), DType::F32, g.c, g.c_type, g.m * g.n, stream_);
  GemmDesc f = g;  // A and B in C's 16-bit dtype with an fp32 C: cuBLASLt's native mixed mode
  f.c = acc.data();
  f.c_type = DType::F32;
  f.bias = nullptr;
  gemm(f);
  launch_add_row_bias(g.c, g.c_type, g.bias, g.bias_type, g.m, g.n, stream_, acc.as<float>());
}

void CudaOps::matmul(Tensor& c, const Tensor& a, const Tensor& b, bool trans_a, bool trans_b,
                     float alpha, float beta) {
  NvtxRange range("matmul");
  const MatmulDims dims = check_matmul(c, a, b, trans_a, trans_b);
  const std::int64_t batch = dims.batch, m = dims.m, n = dims.n, k = dims.k;
  const DType ab = gemm_input_dtype(a, b, c);
  AsDType a_(a, ab, *c.allocator(), stream_);
  AsDType b_(b, ab, *c.allocator(), stream_);
  GemmDesc g;
  g.a = a_.data();
  g.b = b_.data();
  g.c = c.data();
  g.ab = ab;
  g.c_type = c.dtype();
  g.m = m;
  g.n = n;
  g.k = k;
  g.trans_a = trans_a;
  g.trans_b = trans_b;
  g.lda = trans_a ? m : k;
  g.ldb = trans_b ? k : n;
  g.ldc = n;
  g.batch = batch;
  g.stride_a = m * k;
  g.stride_b = k * n;
  g.stride_c = m * n;
  g.alpha = alpha;
  g.beta = beta;
  gemm(g);
}

void CudaOps::linear_forward(Tensor& out, const Tensor& inp, const Tensor& weight,
                             const Tensor* bias) {
  NvtxRange range("linear_forward");
  const LinearDims dims = check_linear_forward(out, inp, weight, bias);
  const std::int64_t rows = dims.rows, oc = dims.oc, ch = dims.c;
  const DType ab = gemm_input_dtype(inp, weight, out);
  AsDType x(inp, ab, *out.allocator(), stream_);
  AsDType w(weight, ab, *out.allocator(), stream_);
  GemmDesc g;
  g.a = x.data();  // (N, C)
  g.b = w.data();  // (OC, C), used transposed
  g.c = out.data();
  g.ab = ab;
  g.c_type = out.dtype();
  g.m = rows;
  g.n = oc;
  g.k = ch;
  g.trans_b = true;
  g.lda = ch;
  g.ldb = ch;
  g.ldc = oc;
  if (bias) {
    g.bias = bias->data();
    g.bias_type = bias->dtype();
    g.bias_scratch = out.allocator();
  }
  gemm(g);
}

void CudaOps::linear_backward(Tensor* dinp, Tensor* dweight, Tensor* dbias, const Tensor& dout,
                              const Tensor& inp, const Tensor& weight, bool accumulate) {
  NvtxRange range("linear_backward");
  const LinearDims dims = check_linear_backward(dinp, dweight, dbias, dout, inp, weight);
  const std::int64_t rows = dims.rows, oc = dims.oc, ch = dims.c;
  // dinp must alias neither dout nor inp: a GEMM cannot read A or B while writing D (cuBLASLt's
  // in-place support is C == D only), and the CPU writes dinp before its dweight GEMM reads inp.
  if (dbias)  // dbias (OC) (+)= Σ_rows dout (N, OC)
    launch_col_sum(dbias->data(), dbias->dtype(), dout.data(), dout.dtype(), rows, oc, accumulate,
                   static_cast<float*>(small_scratch()), kSmallScratchBytes, stream_);
  if (dweight) {  // dweight (OC, C) (+)= doutᵀ (OC, N) · inp (N, C)
    const DType ab = gemm_input_dtype(dout, inp, *dweight);
    AsDType g_(dout, ab, *dweight->allocator(), stream_);
    AsDType x(inp, ab, *dweight->allocator(), stream_);
    GemmDesc g;
    g.a = g_.data();  // stored (N, OC): transposed
    g.b = x.data();   // (N, C)
    g.c = dweight->data();
    g.ab = ab;
    g.c_type = dweight->dtype();
    g.m = oc;
    g.n = ch;
    g.k = rows;
    g.trans_a = true;
    g.lda = oc;
    g.ldb = ch;
    g.ldc = ch;
    g.beta = accumulate ? 1.0f : 0.0f;
    gemm(g);
  }
  if (dinp) {  // dinp (N, C) = dout (N, OC) · weight (OC, C)
    const DType ab = gemm_input_dtype(dout, weight, *dinp);
    AsDType g_(dout, ab, *dinp->allocator(), stream_);
    AsDType w(weight, ab, *dinp->allocator(), stream_);
    GemmDesc g;
    g.a = g_.data();
    g.b = w.data();
    g.c = dinp->data();
    g.ab = ab;
    g.c_type = dinp->dtype();
    g.m = rows;
    g.n = ch;
    g.k = oc;
    g.lda = oc;
    g.ldb = ch;
    g.ldc = ch;
    gemm(g);
  }
}

}  // namespace memtrade::cuda
