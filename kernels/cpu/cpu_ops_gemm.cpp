// GEMM-based ops: matmul, linear forward/backward, and the sgemm they share.
//
// fp32 operands go straight to the GEMM (memtrade's own AVX-512F or AVX2 one where the CPU has
// it, else OpenBLAS's: kernels/cpu/cpu_gemm.h); 16-bit operands are converted to fp32 scratch
// tensors (category workspace, from the output's allocator) first, since OpenBLAS has no
// half-precision GEMM and arithmetic is fp32 anyway.
#include <algorithm>
#include <climits>
#include <cstring>

#ifdef MEMTRADE_HAVE_OPENBLAS
#include <cblas.h>
#endif
#ifdef _OPENMP
#include <omp.h>
#endif

#include "kernels/cpu/cpu_gemm.h"
#include "kernels/cpu/cpu_ops_impl.h"

namespace memtrade::cpu {

void blocked_sgemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                   float alpha, const float* a, std::int64_t lda, const float* b, std::int64_t ldb,
                   float beta, float* c, std::int64_t ldc) {
  // Row blocks of C go to threads; within one, a KB x NB panel of alpha·op(B) is packed so the
  // innermost loop is a contiguous axpy over a row of C.
  constexpr std::int64_t MB = 32, NB = 128, KB = 128;
  const std::int64_t row_blocks = (m + MB - 1) / MB;
#pragma omp parallel for schedule(static)
  for (std::int64_t rb = 0; rb < row_blocks; ++rb) {
    float panel[KB * NB];
    const std::int64_t i0 = rb * MB, i1 = std::min(m, i0 + MB);
    for (std::int64_t i = i0; i < i1; ++i) {
      float* crow = c + i * ldc;
      if (beta == 0.0f) {
        std::fill(crow, crow + n, 0.0f);  // beta = 0 must not propagate NaN from old C
      } else if (beta != 1.0f) {
        for (std::int64_t j = 0; j < n; ++j) crow[j] *= beta;
      }
    }
    for (std::int64_t j0 = 0; j0 < n; j0 += NB) {
      const std::int64_t nb = std::min(NB, n - j0);
      for (std::int64_t p0 = 0; p0 < k; p0 += KB) {
        const std::int64_t kb = std::min(KB, k - p0);
        for (std::int64_t p = 0; p < kb; ++p)
          for (std::int64_t j = 0; j < nb; ++j)
            panel[p * NB + j] =
                alpha * (trans_b ? b[(j0 + j) * ldb + p0 + p] : b[(p0 + p) * ldb + j0 + j]);
        for (std::int64_t i = i0; i < i1; ++i) {
          float* crow = c + i * ldc + j0;
          for (std::int64_t p = 0; p < kb; ++p) {
            const float aip = trans_a ? a[(p0 + p) * lda + i] : a[i * lda + p0 + p];
            const float* brow = panel + p * NB;
            for (std::int64_t j = 0; j < nb; ++j) crow[j] += aip * brow[j];
          }
        }
      }
    }
  }
}

namespace {

#ifdef MEMTRADE_HAVE_OPENBLAS
// Multiply-adds below which a GEMM stays on one thread: OpenBLAS's own threshold
// (GEMM_MULTITHREAD_THRESHOLD 4: 4·2^16), so that OpenBLAS never threads a GEMM itself.
constexpr double kSplitWork = 1 << 18;

// Blocks sgemm splits C into: one per thread, outside a parallel region, for a large enough GEMM
// (1 = no split), each at least 16 rows or columns wide (a full register block of the kernels).
int split_parts(std::int64_t m, std::int64_t n, std::int64_t k) {
#ifdef _OPENMP
  if (omp_in_parallel() || !sgemm_nests()) return 1;
  if (static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k) < kSplitWork)
    return 1;
  const std::int64_t widest = std::max(m, n) / 16;
  return static_cast<int>(std::clamp<std::int64_t>(widest, 1, omp_get_max_threads()));
#else
  (void)m, (void)n, (void)k;
  return 1;
#endif
}

// One single-threaded GEMM on the path in use (kernels/cpu/cpu_gemm.h): memtrade's own, or
// cblas_sgemm.
void one_sgemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
               float alpha, const float* a, std::int64_t lda, const float* b, std::int64_t ldb,
               float beta, float* c, std::int64_t ldc) {
  if (gemm_path() != GemmPath::blas) {
    own_sgemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, static_cast<int>(m), static_cast<int>(n),
              static_cast<int>(k), alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb), beta,
              c, static_cast<int>(ldc));
}
#endif

// sgemm, with before(rows, i0, len) and after(rows, i0, len) called on each block of C by the
// thread that computes it, just before the product goes in and just after: C's rows
// [i0, i0 + len) when `rows`, else its columns. (Once, for all rows, when the GEMM is not split.)
// linear_forward writes its bias in `before`, and the linear ops round a 16-bit output in `after`
// while the block is still in that thread's cache, so neither costs a parallel region of its own.
template <typename F, typename G>
void sgemm_blocks(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                  float alpha, const float* a, std::int64_t lda, const float* b, std::int64_t ldb,
                  float beta, float* c, std::int64_t ldc, F&& before, G&& after) {
  if (m == 0 || n == 0) return;
  if (k == 0) {  // C = beta·C; BLAS would do the same, but keep the NaN rule explicit
    before(true, std::int64_t{0}, m);
    for (std::int64_t i = 0; i < m; ++i)
      for (std::int64_t j = 0; j < n; ++j)
        c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
    after(true, std::int64_t{0}, m);
    return;
  }
#ifdef MEMTRADE_HAVE_OPENBLAS
  for (std::int64_t v : {m, n, k, lda, ldb, ldc})
    if (v > INT_MAX) fail("sgemm", "dimension {} exceeds the BLAS int range", v);
  const int parts = split_parts(m, n, k);
  if (parts > 1) {
    // Rows (or columns, when there are more of them) of C in `parts` blocks, one per thread,
    // each a single-threaded GEMM (OpenMP OpenBLAS nests): no synchronisation between the
    // threads until the end, where OpenBLAS's own threading hands packed panels from thread to
    // thread and waits for them with sched_yield (measured on 2 loaded cores: 1024·1152·384
    // 3.8 vs 9.0 ms, 1536·384·1024 10.8 vs 16.0 ms, and 10-20% less CPU time).
    const bool rows = m >= n;
    const std::int64_t dim = rows ? m : n;
    const std::int64_t block = (dim + parts - 1) / parts;
#pragma omp parallel for schedule(static) num_threads(parts)
    for (int part = 0; part < parts; ++part) {
      const std::int64_t i0 = std::min(dim, part * block), len = std::min(block, dim - i0);
      if (len <= 0) continue;
      before(rows, i0, len);
      if (rows)
        one_sgemm(trans_a, trans_b, len, n, k, alpha, trans_a ? a + i0 : a + i0 * lda, lda, b, ldb,
                  beta, c + i0 * ldc, ldc);
      else
        one_sgemm(trans_a, trans_b, m, len, k, alpha, a, lda, trans_b ? b + i0 * ldb : b + i0, ldb,
                  beta, c + i0, ldc);
      after(rows, i0, len);
    }
    return;
  }
  before(true, std::int64_t{0}, m);
  one_sgemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
#else
  before(true, std::int64_t{0}, m);
  blocked_sgemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
#endif
  after(true, std::int64_t{0}, m);
}

// An `after` for sgemm_blocks that writes a block of the fp32 result c (rows, cols) into out, a
// 16-bit tensor of that shape (nothing for an F32 out, which c is): F32Out::commit block by
// block.
auto commit_block(Tensor& out, const float* c, std::int64_t cols) {
  return [&out, c, cols](bool by_rows, std::int64_t i0, std::int64_t len) {
    if (out.dtype() == DType::F32) return;
    if (by_rows && len * cols == out.numel()) {  // not split: over the threads, as commit()
      convert_from_f32(c, out.dtype(), out.numel(), out.data());
      return;
    }
    if (by_rows) {
      write_f32(out, i0 * cols, len * cols, c + i0 * cols);
      return;
    }
    for (std::int64_t r = 0; r < out.numel() / cols; ++r)
      write_f32(out, r * cols + i0, len, c + r * cols + i0);
  };
}

void no_hook(bool, std::int64_t, std::int64_t) {}

}  // namespace

void sgemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
           const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c,
           std::int64_t ldc) {
  sgemm_blocks(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, no_hook, no_hook);
}

bool sgemm_nests() {
#ifdef MEMTRADE_HAVE_OPENBLAS
  static const bool ok = openblas_get_parallel() != OPENBLAS_THREAD;
  return ok;
#else
  return true;  // blocked_sgemm's own parallel for is then nested: one thread
#endif
}

void CpuOps::matmul(Tensor& c, const Tensor& a, const Tensor& b, bool trans_a, bool trans_b,
                    float alpha, float beta) {
  const auto [batch, m, n, k] = check_matmul(c, a, b, trans_a, trans_b);
  F32In a32(a, *c.allocator());
  F32In b32(b, *c.allocator());
  F32Out c32(c, beta != 0.0f);
  for (std::int64_t i = 0; i < batch; ++i)
    sgemm(trans_a, trans_b, m, n, k, alpha, a32.data() + i * m * k, trans_a ? m : k,
          b32.data() + i * k * n, trans_b ? k : n, beta, c32.data() + i * m * n, n);
  c32.commit();
}

void CpuOps::linear_forward(Tensor& out, const Tensor& inp, const Tensor& weight,
                            const Tensor* bias) {
  const auto [rows, oc, ch] = check_linear_forward(out, inp, weight, bias);
  F32In x(inp, *out.allocator());
  F32In w(weight, *out.allocator());
  F32Out y(out, false);
  // Each block of rows (or columns) of out starts as the bias, written by the thread that then
  // adds the block's product onto it (beta = 1).
  float* yp = y.data();
  auto bias_rows = [&](bool by_rows, std::int64_t i0, std::int64_t len) {
    if (!bias) return;
    float buf[kChunk];
    const std::int64_t r0 = by_rows ? i0 : 0, r1 = by_rows ? i0 + len : rows;
    const std::int64_t c0 = by_rows ? 0 : i0, c1 = by_rows ? oc : i0 + len;
    for (std::int64_t o = c0; o < c1; o += kChunk) {
      const std::int64_t n = std::min(kChunk, c1 - o);
      const float* bv = read_f32(*bias, o, n, buf);
      for (std::int64_t r = r0; r < r1; ++r) std::memcpy(yp + r * oc + o, bv, n * 4);
    }
  };
  sgemm_blocks(false, true, rows, oc, ch, 1.0f, x.data(), ch, w.data(), ch, bias ? 1.0f : 0.0f, yp,
               oc, bias_rows, commit_block(out, yp, oc));
}

void CpuOps::linear_backward(Tensor* dinp, Tensor* dweight, Tensor* dbias, const Tensor& dout,
                             const Tensor& inp, const Tensor& weight, bool accumulate) {
  const auto [rows, oc, ch] = check_linear_backward(dinp, dweight, dbias, dout, inp, weight);
  if (dinp) {  // dinp (N, C) = dout (N, OC) · weight (OC, C)
    F32In g(dout, *dinp->allocator());
    F32In w(weight, *dinp->allocator());
    F32Out dx(*dinp, false);
    sgemm_blocks(false, false, rows, ch, oc, 1.0f, g.data(), oc, w.data(), ch, 0.0f, dx.data(), ch,
                 no_hook, commit_block(*dinp, dx.data(), ch));
  }
  if (dweight) {  // dweight (OC, C) (+)= doutᵀ (OC, N) · inp (N, C)
    F32In g(dout, *dweight->allocator());
    F32In x(inp, *dweight->allocator());
    F32Out dw(*dweight, accumulate);
    sgemm_blocks(true, false, oc, ch, rows, 1.0f, g.data(), oc, x.data(), ch,
                 accumulate ? 1.0f : 0.0f, dw.data(), ch, no_hook,
                 commit_block(*dweight, dw.data(), ch));
  }
  if (dbias) {  // column sums of dout, each column block owned by one thread (deterministic)
    for_column_blocks(rows, oc, [&](std::int64_t o, std::int64_t len) {
      float acc[kChunk], buf[kChunk], out_buf[kChunk];
      std::fill(acc, acc + len, 0.0f);
      for (std::int64_t r = 0; r < rows; ++r) {
        const float* g = read_f32(dout, r * oc + o, len, buf);
        for (std::int64_t j = 0; j < len; ++j) acc[j] += g[j];
      }
      float* db = dest_f32(*dbias, o, out_buf);
      if (accumulate) {
        const float* old = read_f32(*dbias, o, len, buf);
        for (std::int64_t j = 0; j < len; ++j) db[j] = old[j] + acc[j];
      } else {
        std::copy(acc, acc + len, db);
      }
      write_f32(*dbias, o, len, db);
    });
  }
}

}  // namespace memtrade::cpu
