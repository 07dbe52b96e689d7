// Element-wise ops: fill, cast, add, scale, GELU, ReLU, SwiGLU, GeGLU, soft-capping. Chunked so
// that each chunk is read into fp32 (in place for F32), transformed, and rounded back to the
// output's dtype; the exp-based activations run kernels/cpu/cpu_vec.h's vector loops.
#include <algorithm>
#include <cmath>

#include "kernels/cpu/cpu_ops_impl.h"
#include "kernels/cpu/cpu_vec.h"

namespace memtrade::cpu {
namespace {

// out = f(a) element-wise; f(const float* a, float* out, len). out may alias a.
template <typename F>
void map1(Tensor& out, const Tensor& a, F f) {
  for_chunks(out.numel(), [&](std::int64_t off, std::int64_t len) {
    float ba[kChunk], bo[kChunk];
    const float* x = read_f32(a, off, len, ba);
    float* y = dest_f32(out, off, bo);
    f(x, y, len);
    write_f32(out, off, len, y);
  });
}

// out = f(a, b) element-wise. out may alias a or b.
template <typename F>
void map2(Tensor& out, const Tensor& a, const Tensor& b, F f) {
  for_chunks(out.numel(), [&](std::int64_t off, std::int64_t len) {
    float ba[kChunk], bb[kChunk], bo[kChunk];
    const float* x = read_f32(a, off, len, ba);
    const float* z = read_f32(b, off, len, bb);
    float* y = dest_f32(out, off, bo);
    f(x, z, y, len);
    write_f32(out, off, len, y);
  });
}

}  // namespace

void CpuOps::fill(Tensor& t, float value) {
  check_float("fill", "t", t);
  for_chunks(t.numel(), [&](std::int64_t off, std::int64_t len) {
    float buf[kChunk];
    float* y = dest_f32(t, off, buf);
    std::fill(y, y + len, value);
    write_f32(t, off, len, y);
  });
}

void CpuOps::cast(Tensor& dst, const Tensor& src) {
  check_float("cast", "dst", dst);
  check_float("cast", "src", src);
  check_same_numel("cast", dst, src);
  map1(dst, src, [](const float* x, float* y, std::int64_t n) { std::copy(x, x + n, y); });
}

void CpuOps::add(Tensor& out, const Tensor& a, const Tensor& b) {
  check_binary("add", out, a, b);
  map2(out, a, b,
       [](const float* x, const float* z, float* y, std::int64_t n) { vec::add(x, z, y, n); });
}

void CpuOps::add_inplace(Tensor& y, const Tensor& x) {
  check_binary("add_inplace", y, y, x);
  map2(y, y, x,
       [](const float* a, const float* b, float* o, std::int64_t n) { vec::add(a, b, o, n); });
}

void CpuOps::scale(Tensor& t, float s) {
  check_float("scale", "t", t);
  map1(t, t, [s](const float* x, float* y, std::int64_t n) { vec::scale(x, s, y, n); });
}

void CpuOps::gelu_forward(Tensor& out, const Tensor& inp) {
  check_unary("gelu_forward", out, inp);
  map1(out, inp, [](const float* x, float* y, std::int64_t n) { vec::gelu_forward(x, y, n); });
}

void CpuOps::gelu_backward(Tensor& dinp, const Tensor& dout, const Tensor& inp) {
  check_binary("gelu_backward", dinp, dout, inp);
  map2(dinp, dout, inp, [](const float* g, const float* x, float* y, std::int64_t n) {
    vec::gelu_backward(g, x, y, n);
  });
}

void CpuOps::relu_forward(Tensor& out, const Tensor& inp) {
  check_unary("relu_forward", out, inp);
  // NaN propagates, as in torch.relu (x > 0 ? x : 0 would turn it into 0, hiding it from the loss
  // scaler's inf/nan check).
  map1(out, inp, [](const float* x, float* y, std::int64_t n) { vec::relu_forward(x, y, n); });
}

void CpuOps::relu_backward(Tensor& dinp, const Tensor& dout, const Tensor& out) {
  check_binary("relu_backward", dinp, dout, out);
  map2(dinp, dout, out, [](const float* g, const float* o, float* y, std::int64_t n) {
    vec::relu_backward(g, o, y, n);
  });
}

void CpuOps::swiglu_forward(Tensor& out, const Tensor& gate, const Tensor& up) {
  check_binary("swiglu_forward", out, gate, up);
  map2(out, gate, up, [](const float* g, const float* u, float* y, std::int64_t n) {
    vec::swiglu_forward(g, u, y, n);
  });
}

void CpuOps::swiglu_backward(Tensor& dgate, Tensor& dup, const Tensor& dout, const Tensor& gate,
                             const Tensor& up) {
  check_swiglu_backward(dgate, dup, dout, gate, up);
  for_chunks(gate.numel(), [&](std::int64_t off, std::int64_t len) {
    float bd[kChunk], bg[kChunk], bu[kChunk], bdg[kChunk], bdu[kChunk];
    const float* d = read_f32(dout, off, len, bd);
    const float* g = read_f32(gate, off, len, bg);
    const float* u = read_f32(up, off, len, bu);
    float* dg = dest_f32(dgate, off, bdg);
    float* du = dest_f32(dup, off, bdu);
    // Element i's inputs are all read before its outputs are written (cpu_vec.h): an output
    // may alias the input it replaces.
    vec::swiglu_backward(d, g, u, dg, du, len);
    write_f32(dgate, off, len, dg);
    write_f32(dup, off, len, du);
  });
}

// GeGLU from the GELU loops: gelu(g)·u; dgate = gelu'(g)·(dout·u), dup = dout·gelu(g).
void CpuOps::geglu_forward(Tensor& out, const Tensor& gate, const Tensor& up) {
  check_binary("geglu_forward", out, gate, up);
  map2(out, gate, up, [](const float* g, const float* u, float* y, std::int64_t n) {
    float a[kChunk];
    vec::gelu_forward(g, a, n);
    for (std::int64_t i = 0; i < n; ++i) y[i] = a[i] * u[i];
  });
}

void CpuOps::geglu_backward(Tensor& dgate, Tensor& dup, const Tensor& dout, const Tensor& gate,
                            const Tensor& up) {
  check_swiglu_backward(dgate, dup, dout, gate, up, "geglu_backward");
  for_chunks(gate.numel(), [&](std::int64_t off, std::int64_t len) {
    float bd[kChunk], bg[kChunk], bu[kChunk], bdg[kChunk], bdu[kChunk], du_[kChunk], a[kChunk];
    const float* d = read_f32(dout, off, len, bd);
    const float* g = read_f32(gate, off, len, bg);
    const float* u = read_f32(up, off, len, bu);
    // Every input is read into its own buffer before an output is written: outputs may alias.
    for (std::int64_t i = 0; i < len; ++i) du_[i] = d[i] * u[i];
    vec::gelu_forward(g, a, len);
    for (std::int64_t i = 0; i < len; ++i) a[i] *= d[i];  // dup
    float* dg = dest_f32(dgate, off, bdg);
    vec::gelu_backward(du_, g, dg, len);
    float* du = dest_f32(dup, off, bdu);
    std::copy(a, a + len, du);
    write_f32(dgate, off, len, dg);
    write_f32(dup, off, len, du);
  });
}

void CpuOps::softcap_forward(Tensor& out, const Tensor& inp, float cap) {
  check_unary("softcap_forward", out, inp);
  map1(out, inp, [cap](const float* x, float* y, std::int64_t n) {
    for (std::int64_t i = 0; i < n; ++i) y[i] = cap * std::tanh(x[i] / cap);
  });
}

void CpuOps::softcap_backward(Tensor& dinp, const Tensor& dout, const Tensor& out, float cap) {
  check_binary("softcap_backward", dinp, dout, out);
  map2(dinp, dout, out, [cap](const float* g, const float* o, float* y, std::int64_t n) {
    for (std::int64_t i = 0; i < n; ++i) {
      const float th = o[i] / cap;
      y[i] = g[i] * (1.0f - th * th);
    }
  });
}

}  // namespace memtrade::cpu
