// memtrade's own sgemm for CPUs with AVX-512F, chosen at run time in place of OpenBLAS.
//
// Why: OpenBLAS picks its kernels by core type, and a machine may pin it to an older one (the
// build machines pin OPENBLAS_CORETYPE=Haswell: 256-bit FMAs, half of what an AVX-512 core can
// issue; measured on a Zen 5 EPYC core, 137 vs 274 GFLOP/s of FMAs). PyTorch's CPU matmuls and
// convolutions run through oneDNN, which dispatches on the CPU itself; this GEMM does the same
// for memtrade's, and on a CPU without AVX-512F OpenBLAS keeps them.
//
// Contract: cblas_sgemm's, row-major: C (m, n) = alpha·op(A)·op(B) + beta·C, op(A) (m, k),
// op(B) (k, n); beta = 0 never reads C (no NaN from old contents). Single-threaded: callers split
// C among their threads (sgemm_blocks, conv2d's tiles).
//
// B in place: a B of at most 32 columns, not transposed, with ldb = 32 and 64-byte aligned is
// already in the packed form and is read where it is (conv2d lays its im2col tiles out so).
//
// Rounding: each element of C is summed over k in one fixed order, in blocks of 256 from k = 0
// up, with C updated after each block (C = alpha·Σ₀ + beta·C, then C = alpha·Σ₁ + C, ...). That
// order depends on k alone, never on m, n or on which rows or columns of C a call is given, so
// splitting a GEMM among threads does not change a bit (tests/kernels/test_cpu_gemm.cpp).
#pragma once

#include <cstdint>
#include <cstdlib>
#include <memory>

namespace memtrade::cpu {

// The GEMM the CPU ops use: OpenBLAS (or blocked_sgemm without it), or the AVX-512F one here.
enum class GemmPath { blas, avx512 };

// avx512 where the CPU (and OS) support AVX-512F, unless the environment says MEMTRADE_GEMM=blas
// or caps the vector loops below AVX-512 (MEMTRADE_ISA, kernels/cpu/cpu_vec.h); else blas.
GemmPath gemm_path();
// Whether this CPU can run the avx512 path.
bool gemm_avx512_available();
// Tests and benchmarks choose the path (std::invalid_argument for avx512 without the CPU).
void set_gemm_path(GemmPath path);
const char* gemm_path_name(GemmPath path);

// The AVX-512F GEMM itself (requires gemm_avx512_available()), the contract above.
void sgemm_avx512(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                  float alpha, const float* a, std::int64_t lda, const float* b, std::int64_t ldb,
                  float beta, float* c, std::int64_t ldc);

// 64-byte aligned floats (std::aligned_alloc), freed with std::free.
struct AlignedFree {
  void operator()(float* p) const { std::free(p); }
};
using AlignedFloats = std::unique_ptr<float, AlignedFree>;

// op(A) (m, k) packed once, for many products with the same A: a convolution's weight, used once
// per image and pixel tile. Requires gemm_avx512_available(). Host memory of its own (m rounded
// up to 8, times k, floats), like the packing buffers.
class PackedA {
 public:
  PackedA(bool trans_a, std::int64_t m, std::int64_t k, const float* a, std::int64_t lda);
  std::int64_t m() const { return m_; }
  std::int64_t k() const { return k_; }

 private:
  friend void sgemm_avx512(const PackedA&, std::int64_t, std::int64_t, bool, std::int64_t, float,
                           const float*, std::int64_t, float, float*, std::int64_t);
  AlignedFloats data_;
  std::int64_t m_ = 0, k_ = 0, rows_ = 0;
};

// C (m, n) = alpha·op(A)[i0 : i0 + m]·op(B) + beta·C with rows [i0, i0 + m) of a packed A (i0 a
// multiple of 8, else std::invalid_argument): the same bits as sgemm_avx512 on those rows of the
// A it was packed from.
void sgemm_avx512(const PackedA& a, std::int64_t i0, std::int64_t m, bool trans_b, std::int64_t n,
                  float alpha, const float* b, std::int64_t ldb, float beta, float* c,
                  std::int64_t ldc);

}  // namespace memtrade::cpu
