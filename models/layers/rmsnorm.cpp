#include "models/layers/rmsnorm.h"

namespace memtrade {
namespace {

// The tensors HF's eager RMSNorm keeps besides x and rstd (hf_eager; rmsnorm.h), by save key.
constexpr const char* kEagerKeys[] = {".f32", ".sq", ".normed", ".w1"};

// Autograd frees a node's saved tensors once it has run: the norm's, after its backward.
void release_eager_extras(LayerCtx& c, const RmsNorm& n) {
  if (!c.hf_eager) return;
  for (const char* k : kEagerKeys)
    if (c.has(n.key + k)) (void)c.saved.take(c.segment, n.key + k);
}

}  // namespace

void norm_forward(LayerCtx& c, Tensor& out, const Tensor& inp, const RmsNorm& n) {
  ScopedRange scope(c.dev, "rmsnorm");  // names the trace's allocations
  c.expect_input(Op::rmsnorm, inp);
  if (!c.hf_eager) {
    Tensor rstd = c.dev.empty({inp.dim(0)}, DType::F32, c.cat());  // (N)
    c.ops().rmsnorm_forward(out, rstd, inp, c.weight(n.weight), n.eps, n.unit_offset);
    c.keep(n.key + ".rstd", std::move(rstd));
    return;
  }
  // HF's eager code, op by op, as autograd allocates and keeps (rmsnorm.h); the op computes `out`
  // and rstd as above, and the rest are the bytes eager holds.
  const std::int64_t N = inp.dim(0), C = inp.dim(1);
  if (inp.dtype() != DType::F32) c.keep(n.key + ".f32", c.act_tensor({N, C}, DType::F32));
  c.keep(n.key + ".sq", c.act_tensor({N, C}, DType::F32));  // pow(2): MeanBackward1 keeps it
  Tensor rstd;
  {
    Tensor mean = c.temp({N, 1}, DType::F32);
    Tensor var = c.temp({N, 1}, DType::F32);  // + eps
    mean.reset();
    rstd = c.dev.empty({N}, DType::F32, c.cat());  // rsqrt: both multiplies keep it
  }
  c.ops().rmsnorm_forward(out, rstd, inp, c.weight(n.weight), n.eps, n.unit_offset);
  c.keep(n.key + ".rstd", std::move(rstd));
  // x · rsqrt, in fp32; the weight's multiply keeps it rounded to x's dtype (Llama), or as is
  // times (1 + w) (Gemma 2, which keeps that (C) sum too).
  const bool rounded = !n.unit_offset && inp.dtype() != DType::F32;
  Tensor normed = rounded ? c.temp({N, C}, DType::F32) : c.act_tensor({N, C}, DType::F32);
  if (rounded) normed = c.act_tensor({N, C}, inp.dtype());  // .to(x.dtype), then fp32's is freed
  c.keep(n.key + ".normed", std::move(normed));
  if (n.unit_offset) c.keep(n.key + ".w1", c.act_tensor({C}, DType::F32));
}

void norm_backward(LayerCtx& c, Tensor& dinp, const Tensor& dout, const Tensor& inp,
                   const RmsNorm& n) {
  ScopedRange scope(c.dev, "rmsnorm");  // names the trace's allocations
  OpGrad gw = c.grad(n.weight);
  c.ops().rmsnorm_backward(dinp, &gw.t, dout, inp, c.weight(n.weight), c.get(n.key + ".rstd"),
                           gw.accumulate, n.unit_offset);
  release_eager_extras(c, n);
}

void norm_backward_add(LayerCtx& c, Tensor& dres, const Tensor& dout, const Tensor& inp,
                       const RmsNorm& n) {
  ScopedRange scope(c.dev, "rmsnorm");  // names the trace's allocations
  Tensor dinp = c.temp(inp.shape());    // (N, C)
  norm_backward(c, dinp, dout, inp, n);
  c.ops().add_inplace(dres, dinp);
}

}  // namespace memtrade
