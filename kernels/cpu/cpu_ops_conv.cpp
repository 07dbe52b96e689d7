// 2-D convolution (NCHW) by im2col + GEMM, one image at a time: the im2col matrix
// (Ci·KH·KW, OH·OW) is the op's library scratch (category workspace), the same buffer holds
// the column gradient in backward before col2im folds it into dinp. im2col/col2im are serial on
// purpose: they sit between OpenBLAS calls (O(K·P) next to O(Co·K·P)), where an OpenMP region
// would make the OpenMP and OpenBLAS thread pools spin against each other.
#include <algorithm>
#include <optional>

#include "kernels/cpu/cpu_ops_impl.h"

namespace memtrade::cpu {
namespace {

// col (K, P) of image `img`: col[(ci, ky, kx), (oy, ox)] = inp[img, ci, oy·s − pad + ky, ...].
void im2col(const Tensor& inp, std::int64_t img, const ConvDims& d, float* col) {
  const bool f32 = inp.dtype() == DType::F32;
  const std::int64_t base = img * d.ci * d.h * d.w;
  for (std::int64_t k = 0; k < d.k(); ++k) {
    const std::int64_t ci = k / (d.kh * d.kw), ky = (k / d.kw) % d.kh, kx = k % d.kw;
    float* row = col + k * d.p();
    for (std::int64_t oy = 0; oy < d.oh; ++oy) {
      const std::int64_t iy = oy * d.stride - d.pad + ky;
      for (std::int64_t ox = 0; ox < d.ow; ++ox) {
        const std::int64_t ix = ox * d.stride - d.pad + kx;
        float v = 0.0f;
        if (iy >= 0 && iy < d.h && ix >= 0 && ix < d.w) {
          const std::int64_t i = base + (ci * d.h + iy) * d.w + ix;
          v = f32 ? inp.as<float>()[i] : load_as_float(inp.data(), inp.dtype(), i);
        }
        row[oy * d.ow + ox] = v;
      }
    }
  }
}

// dx (Ci, H, W) = Σ over windows of col (K, P): the adjoint of im2col.
void col2im(const float* col, const ConvDims& d, float* dx) {
  for (std::int64_t ci = 0; ci < d.ci; ++ci) {
    float* plane = dx + ci * d.h * d.w;
    std::fill(plane, plane + d.h * d.w, 0.0f);
    for (std::int64_t ky = 0; ky < d.kh; ++ky)
      for (std::int64_t kx = 0; kx < d.kw; ++kx) {
        const float* row = col + ((ci * d.kh + ky) * d.kw + kx) * d.p();
        for (std::int64_t oy = 0; oy < d.oh; ++oy) {
          const std::int64_t iy = oy * d.stride - d.pad + ky;
          if (iy < 0 || iy >= d.h) continue;
          for (std::int64_t ox = 0; ox < d.ow; ++ox) {
            const std::int64_t ix = ox * d.stride - d.pad + kx;
            if (ix >= 0 && ix < d.w) plane[iy * d.w + ix] += row[oy * d.ow + ox];
          }
        }
      }
  }
}

std::optional<Tensor> scratch_if(bool need, CachingAllocator& alloc, Shape shape) {
  if (!need) return std::nullopt;
  return Tensor(alloc, std::move(shape), DType::F32, Category::workspace);  // 16-bit copies
}

}  // namespace

void CpuOps::conv2d_forward(Tensor& out, const Tensor& inp, const Tensor& weight,
                            const Tensor* bias, int stride, int pad) {
  const ConvDims d = check_conv_forward(out, inp, weight, bias, stride, pad);
  CachingAllocator& alloc = *out.allocator();
  F32In w(weight, alloc);
  auto out_buf = scratch_if(out.dtype() != DType::F32, alloc, {d.co, d.p()});
  Tensor col(alloc, {d.k(), d.p()}, DType::F32, Category::workspace);
  for (std::int64_t img = 0; img < d.n; ++img) {
    im2col(inp, img, d, col.as<float>());
    const std::int64_t off = img * d.co * d.p();
    float* y = out_buf ? out_buf->as<float>() : out.as<float>() + off;
    if (bias) {
      for (std::int64_t o = 0; o < d.co; ++o)
        std::fill(y + o * d.p(), y + (o + 1) * d.p(),
                  load_as_float(bias->data(), bias->dtype(), o));
    }
    sgemm(false, false, d.co, d.p(), d.k(), 1.0f, w.data(), d.k(), col.as<float>(), d.p(),
          bias ? 1.0f : 0.0f, y, d.p());
    if (out_buf) write_f32(out, off, d.co * d.p(), y);
  }
}

void CpuOps::conv2d_backward(Tensor* dinp, Tensor* dweight, Tensor* dbias, const Tensor& dout,
                             const Tensor& inp, const Tensor& weight, int stride, int pad,
                             bool accumulate) {
  const ConvDims d = check_conv_backward(dinp, dweight, dbias, dout, inp, weight, stride, pad);
  if (dbias) {  // Σ over images and pixels, one channel per thread
#pragma omp parallel for schedule(static)
    for (std::int64_t o = 0; o < d.co; ++o) {
      float buf[kChunk];
      double sum = 0.0;
      for (std::int64_t img = 0; img < d.n; ++img)
        for (std::int64_t q = 0; q < d.p(); q += kChunk) {
          const std::int64_t len = std::min(kChunk, d.p() - q);
          const float* g = read_f32(dout, (img * d.co + o) * d.p() + q, len, buf);
          for (std::int64_t j = 0; j < len; ++j) sum += g[j];
        }
      const float old = accumulate ? load_as_float(dbias->data(), dbias->dtype(), o) : 0.0f;
      store_from_float(dbias->data(), dbias->dtype(), o, old + static_cast<float>(sum));
    }
  }
  if (!dinp && !dweight) return;
  CachingAllocator& alloc = *(dinp ? dinp : dweight)->allocator();
  std::optional<F32In> w;
  if (dinp) w.emplace(weight, alloc);
  std::optional<F32Out> dw;
  if (dweight) dw.emplace(*dweight, accumulate);
  auto dout_buf = scratch_if(dout.dtype() != DType::F32, alloc, {d.co, d.p()});
  auto dinp_buf = scratch_if(dinp && dinp->dtype() != DType::F32, alloc, {d.ci, d.h, d.w});
  Tensor col(alloc, {d.k(), d.p()}, DType::F32, Category::workspace);
  // An empty batch still assigns a gradient of zeros (the per-image GEMMs below never run).
  if (dw && d.n == 0 && !accumulate) std::fill_n(dw->data(), weight.numel(), 0.0f);
  for (std::int64_t img = 0; img < d.n; ++img) {
    const std::int64_t out_off = img * d.co * d.p();
    const float* g = dout_buf ? dout_buf->as<float>() : dout.as<float>() + out_off;
    if (dout_buf) read_f32(dout, out_off, d.co * d.p(), dout_buf->as<float>());
    if (dw) {  // dweight (Co, K) (+)= dout_n (Co, P) · col_nᵀ (P, K)
      im2col(inp, img, d, col.as<float>());
      const float beta = (img == 0 && !accumulate) ? 0.0f : 1.0f;
      sgemm(false, true, d.co, d.k(), d.p(), 1.0f, g, d.p(), col.as<float>(), d.p(), beta,
            dw->data(), d.k());
    }
    if (dinp) {  // dcol (K, P) = weightᵀ (K, Co) · dout_n (Co, P), folded back by col2im
      sgemm(true, false, d.k(), d.p(), d.co, 1.0f, w->data(), d.k(), g, d.p(), 0.0f,
            col.as<float>(), d.p());
      const std::int64_t in_off = img * d.ci * d.h * d.w;
      float* dx = dinp_buf ? dinp_buf->as<float>() : dinp->as<float>() + in_off;
      col2im(col.as<float>(), d, dx);
      if (dinp_buf) write_f32(*dinp, in_off, d.ci * d.h * d.w, dx);
    }
  }
  if (dw) dw->commit();
}

}  // namespace memtrade::cpu
