// Vectorised fp32 loops of the CPU ops (exp-based activations, softmax rows, double-precision
// sums), compiled three times — SSE2 (every x86-64), AVX2 and AVX-512F — and chosen at run time by
// what the CPU and OS support, as the F16C conversions are (the build itself targets generic
// x86-64).
//
// Every path gives the same bits: the loops are one IEEE operation per element step, compiled
// without FMA contraction and without reassociation (-ffp-contract=off; kernels/CMakeLists.txt),
// so a wider vector only does more elements at once; and every sum runs in kLanes fixed lanes,
// element i in lane i mod kLanes, the lanes then added in a fixed tree, whatever the vector width.
// tests/kernels/test_cpu_vec.cpp runs each path the machine has and compares them bit for bit.
//
// exp is this file's own (Cephes' expf polynomial with an exact power-of-two scaling): within
// 1 ulp of the true value for every float (measured: 0.95 ulp), subnormal results rounded once,
// exp(-inf) = 0, exp(+inf) = +inf, NaN in NaN out; glibc's expf is correctly rounded (≤ 0.5 ulp)
// but a call per element and five times slower than the AVX2 loop.
#pragma once

#include <cstdint>

namespace memtrade {
struct OptimizerScalars;  // kernels/optimizer_math.h
}  // namespace memtrade

namespace memtrade::cpu::vec {

enum class Isa : std::uint8_t { sse2, avx2, avx512 };

// The widest path this CPU supports (avx512: AVX-512F; avx2: AVX2).
Isa best_isa();
// The path in use: best_isa(), or a narrower one named by the environment's MEMTRADE_ISA (sse2,
// avx2 or avx512; it narrows the GEMM alike: kernels/cpu/cpu_gemm.h), unless set_isa
// chose another.
Isa isa();
// Tests run each path: `path` must not be wider than best_isa() (throws std::invalid_argument).
void set_isa(Isa path);
const char* isa_name(Isa path);

// Lanes of every double sum below (fixed: results do not depend on the vector width).
inline constexpr int kLanes = 8;

// y[i] = exp(x[i] − shift). y may alias x.
void exp_shifted(const float* x, float shift, float* y, std::int64_t n);
// Σ exp(x[i] − shift) in double (the exp values are fp32); y, when not nullptr, receives them
// (may alias x).
double exp_sum(const float* x, float shift, float* y, std::int64_t n);
// max(x) by x[i] > m ? x[i] : m from −inf, so NaN is skipped (as std::max's loops did).
float max(const float* x, std::int64_t n);
// y[i] = x[i] · s. y may alias x.
void scale(const float* x, float s, float* y, std::int64_t n);
// y[i] = x[i·stride]: a row of im2col for a strided convolution (stride 2 by permutes). x and y
// do not overlap.
void gather_strided(const float* x, std::int64_t stride, float* y, std::int64_t n);
// Rows r < rows of a strided convolution's im2col row: y[r·ldy + i] = 0 for i < lo and
// lo + n <= i < width, y[r·ldy + lo + j] = x[r·ldx + j·stride] for j < n (x points at each row's
// first read). One call for all the whole output rows of a tile. x and y do not overlap.
void gather_strided_rows(const float* x, std::int64_t ldx, std::int64_t stride, float* y,
                         std::int64_t ldy, std::int64_t rows, std::int64_t lo, std::int64_t n,
                         std::int64_t width);
// Rows of src (r < rows, each `width` floats at src + r·lds) as the columns of panels `lanes`
// wide (a GEMM's B panels; lanes a multiple of 8): dst[(r / lanes)·ldp + p·lanes + r % lanes] =
// src[r·lds + p] for p < width and r < rows rounded up to lanes, the rows past `rows` as 0. src
// and dst do not overlap.
void transpose_to_panels(const float* src, std::int64_t lds, std::int64_t rows, std::int64_t width,
                         std::int64_t lanes, float* dst, std::int64_t ldp);
// y[i] += x[i]: col2im's fold. x and y do not overlap.
void accumulate(const float* x, float* y, std::int64_t n);
// y[i] = ((y[i] + a[i]) + b[i]) + c[i]: col2im's fold of a row of three kernel taps at once
// (the same additions as three accumulate calls, y read and written once). No input overlaps y.
void accumulate3(const float* a, const float* b, const float* c, float* y, std::int64_t n);
// y[2i] += x[i] for i < n: the fold of a stride-2 convolution. Only those floats of y change
// (the ones between are rewritten with their own bits), and none past y[2n − 2] is touched.
void accumulate_stride2(const float* x, float* y, std::int64_t n);
// The same for rows r < rows, in order: y[r·ldy + 2i] += x[r·ldx + i] (ldy ≥ 2n): one call for
// all the output rows of a (channel, tap) of col2im. Only those floats of y change; others between
// y and the last one, y[(rows − 1)·ldy + 2n − 2], may be rewritten with their own bits, none
// outside. x and y do not overlap.
void accumulate_stride2_rows(const float* x, std::int64_t ldx, float* y, std::int64_t ldy,
                             std::int64_t rows, std::int64_t n);
// y[i] = a[i] + b[i]. y may alias a or b.
void add(const float* a, const float* b, float* y, std::int64_t n);
// ReLU: y[i] = x[i] <= 0 ? +0 : x[i] (NaN passes, as in torch.relu); backward y[i] = o[i] > 0 ?
// g[i] : +0 (o: the forward's output). y may alias any input.
void relu_forward(const float* x, float* y, std::int64_t n);
void relu_backward(const float* g, const float* o, float* y, std::int64_t n);

// GELU, tanh approximation (kernels/ops.h), tanh(u) = sign(u)·(1 − e^{−2|u|}) / (1 + e^{−2|u|}):
// y = 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))). y may alias x.
void gelu_forward(const float* x, float* y, std::int64_t n);
// y = dout · dGELU/dx at x. y may alias g or x.
void gelu_backward(const float* g, const float* x, float* y, std::int64_t n);
// SwiGLU: y = g·σ(g)·u; backward dg = d·u·σ(g)·(1 + g·(1 − σ(g))), du = d·g·σ(g). Outputs may
// alias the input they replace (kernels/ops.h).
void swiglu_forward(const float* g, const float* u, float* y, std::int64_t n);
void swiglu_backward(const float* d, const float* g, const float* u, float* dg, float* du,
                     std::int64_t n);

// Σ x[i], Σ a[i]·b[i] (fp32 products), Σ (x[i] − mu)² in double.
double sum(const float* x, std::int64_t n);
double dot(const float* a, const float* b, std::int64_t n);
double sum_sq_dev(const float* x, double mu, std::int64_t n);
// Layer-norm backward's row sums: Σ w·g and Σ (w·g)·((x − mu)·rs), each term fp32, summed in
// double.
void layernorm_backward_sums(const float* x, const float* g, const float* w, float mu, float rs,
                             std::int64_t n, double& dnorm, double& dnorm_norm);
// bfloat16 <-> fp32, the bits of kernels/dtype.h's bf16_to_float and float_to_bf16 (round to
// nearest even; a NaN stays a quiet NaN with its sign and top payload bits).
void bf16_to_f32(const std::uint16_t* src, float* dst, std::int64_t n);
void f32_to_bf16(const float* src, std::uint16_t* dst, std::int64_t n);

// One optimizer step on n elements, kernels/optimizer_math.h's element arithmetic for a.kind
// (one IEEE rounding per operation, on every path): p, s0, s1 receive the new parameter and
// states from p_in, the gradient g and s0_in, s1_in (read for every kind: zeros where it has no
// state). Each output may alias its input at the same index.
void optimizer_step(const OptimizerScalars& a, const float* p_in, const float* g,
                    const float* s0_in, const float* s1_in, float* p, float* s0, float* s1,
                    std::int64_t n);

// Batch-norm backward's channel sums: Σ g and Σ g·((x − mu)·rs) (fp32 terms, double sums),
// added to sum_g and sum_gx.
void batchnorm_backward_sums(const float* x, const float* g, float mu, float rs, std::int64_t n,
                             double& sum_g, double& sum_gx);
// Batch-norm's element passes, fp32 in this order: forward y = (x − mu)·rs·gamma + beta;
// backward dx = k·(count·g − sum_g − (x − mu)·rs·sum_gx). y may alias x (or g).
void batchnorm_apply(const float* x, float mu, float rs, float gamma, float beta, float* y,
                     std::int64_t n);
void batchnorm_dx(const float* x, const float* g, float mu, float rs, float k, float count,
                  float sum_g, float sum_gx, float* y, std::int64_t n);

}  // namespace memtrade::cpu::vec
