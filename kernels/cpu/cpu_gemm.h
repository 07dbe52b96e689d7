// memtrade's own sgemm, chosen at run time in place of OpenBLAS: AVX-512F where the CPU has it,
// else AVX2 with FMA, else OpenBLAS.
//
// Why: OpenBLAS picks its kernels by core type, and a machine may pin it to an older one (the
// build machines pin OPENBLAS_CORETYPE=Haswell: 256-bit FMAs, half of what an AVX-512 core can
// issue; measured on a Zen 5 EPYC core, 137 vs 274 GFLOP/s of FMAs). PyTorch's CPU matmuls and
// convolutions run through oneDNN, which dispatches on the CPU itself; this GEMM does the same.
// Owning the GEMM also lets a convolution pack its weight once per op and hand im2col tiles over
// already in panel form (PackedA, fill_panel_rows), where cblas_sgemm packs both every call.
//
// Contract: cblas_sgemm's, row-major: C (m, n) = alpha·op(A)·op(B) + beta·C, op(A) (m, k),
// op(B) (k, n); beta = 0 never reads C (no NaN from old contents). Single-threaded: callers split
// C among their threads (sgemm_blocks, conv2d's tiles).
//
// B in place: a B of at most gemm_panel_width() columns, not transposed, with ldb equal to that
// width and 64-byte aligned is already in the packed form and is read where it is.
//
// Rounding: each element of C is summed over k in one fixed order, in blocks of 256 from k = 0
// up, one FMA per k step within a block, with C updated after each block (C = alpha·Σ₀ + beta·C,
// then C = alpha·Σ₁ + C, ...). That order depends on k alone, never on m, n, on which rows or
// columns of C a call is given, or on the vector width: splitting a GEMM among threads does not
// change a bit, and the AVX2 and AVX-512 paths give the same bits
// (tests/kernels/test_cpu_gemm.cpp).
#pragma once

#include <cstdint>
#include <cstdlib>
#include <memory>

namespace memtrade::cpu {

// The GEMM the CPU ops use: OpenBLAS (or blocked_sgemm without it), or memtrade's own.
enum class GemmPath { blas, avx2, avx512 };

// The widest own path this CPU (and OS) supports, unless the environment says MEMTRADE_GEMM=blas
// or caps the vector loops (MEMTRADE_ISA, kernels/cpu/cpu_vec.h: avx2 keeps the GEMM at AVX2,
// sse2 at BLAS).
GemmPath gemm_path();
// Whether this CPU can run `path` (blas: always).
bool gemm_available(GemmPath path);
// Tests and benchmarks choose the path (std::invalid_argument for one the CPU lacks).
void set_gemm_path(GemmPath path);
const char* gemm_path_name(GemmPath path);
// The register block of the own path in use: rows of an A panel, columns of a B panel (0 on
// blas).
std::int64_t gemm_panel_rows();
std::int64_t gemm_panel_width();

// The own GEMM on the path in use (std::logic_error on blas), the contract above.
void own_sgemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
               float alpha, const float* a, std::int64_t lda, const float* b, std::int64_t ldb,
               float beta, float* c, std::int64_t ldc);

// Whether own_sgemm(false, true, m, n, k, ...) on the path in use takes its small-m route, which
// reads B's rows in place (no packing of Bᵀ): a caller then gains nothing by handing Bᵀ over as
// panels (false on blas).
bool own_sgemm_reads_b_rows(std::int64_t m, std::int64_t n, std::int64_t k);

// 64-byte aligned floats (std::aligned_alloc), freed with std::free.
struct AlignedFree {
  void operator()(float* p) const { std::free(p); }
};
using AlignedFloats = std::unique_ptr<float, AlignedFree>;
// n floats (at least 16, a whole number of 64-byte lines: aligned_alloc's size rule); throws
// std::bad_alloc.
AlignedFloats aligned_floats(std::int64_t n);

// op(A) (m, k) packed once, for many products with the same A: a convolution's weight, used once
// per image and pixel tile. On the own path in use when made (std::logic_error on blas), and
// only usable on that path. Host memory of its own (m rounded up to a panel, times k, floats),
// like the packing buffers.
class PackedA {
 public:
  PackedA(bool trans_a, std::int64_t m, std::int64_t k, const float* a, std::int64_t lda);

 private:
  friend void own_sgemm(const PackedA&, std::int64_t, std::int64_t, bool, std::int64_t, float,
                        const float*, std::int64_t, float, float*, std::int64_t);
  AlignedFloats data_;
  std::int64_t m_ = 0, k_ = 0;
  GemmPath path_;
  std::int64_t panel_ = 0, rows_ = 0;
};

// C (m, n) = alpha·op(A)[i0 : i0 + m]·op(B) + beta·C with rows [i0, i0 + m) of a packed A (i0 a
// multiple of gemm_panel_rows(), else std::invalid_argument): the same bits as own_sgemm on
// those rows of the A it was packed from.
void own_sgemm(const PackedA& a, std::int64_t i0, std::int64_t m, bool trans_b, std::int64_t n,
               float alpha, const float* b, std::int64_t ldb, float beta, float* c,
               std::int64_t ldc);

// A B panel straight from its source rows (a convolution's im2col tile): for c < channels and
// t < taps, panel row c·taps + t (gemm_panel_width() floats; the panel 64-byte aligned) = the
// floats at base + c·stride + offsets[t], those whose bit of masks[t] is clear as 0 (only lanes
// whose bit is set are read).
void fill_panel_rows(const float* base, std::int64_t channels, std::int64_t stride,
                     const std::int64_t* offsets, const std::uint32_t* masks, std::int64_t taps,
                     float* panel);

// The same for sources whose lanes are not consecutive (a strided convolution's tile): panel row
// c·taps + t, lane i = the float at base + c·stride + offsets[t] + lanes[i] (lanes:
// gemm_panel_width() of them), those whose bit of masks[t] is clear as 0 (only set lanes are
// read).
void fill_panel_lanes(const float* base, std::int64_t channels, std::int64_t stride,
                      const std::int64_t* offsets, const std::uint32_t* masks, std::int64_t taps,
                      const std::int32_t* lanes, float* panel);

}  // namespace memtrade::cpu
