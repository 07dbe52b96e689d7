#include "models/layers/llama_mlp.h"

#include "models/layers/tensor_parallel.h"

namespace memtrade {
namespace {

bool fused(const LlamaMlp& m) {
  return m.gate_up_proj.weight >= 0;
}

// The gating: SwiGLU, or Gemma 2's GeGLU. HF's eager act_fn(gate) * up (hf_eager) keeps
// act_fn(gate) (N, I) as the multiply's other operand, in gate's dtype; the fused op recomputes it.
void glu_forward(LayerCtx& c, Tensor& h, const Tensor& gate, const Tensor& up, const LlamaMlp& m) {
  if (c.hf_eager) c.keep(m.key + "act", c.act_tensor(gate.shape(), h.dtype()));
  if (m.gelu)
    c.ops().geglu_forward(h, gate, up);
  else
    c.ops().swiglu_forward(h, gate, up);
}
// dgate holds d h on entry (the gating's output gradient) and d gate on return.
void glu_backward(LayerCtx& c, Tensor& dgate, Tensor& dup, const Tensor& gate, const Tensor& up,
                  const LlamaMlp& m) {
  if (m.gelu)
    c.ops().geglu_backward(dgate, dup, dgate, gate, up);
  else
    c.ops().swiglu_backward(dgate, dup, dgate, gate, up);
  if (c.has(m.key + "act")) (void)c.saved.take(c.segment, m.key + "act");
}

// Phi-3: the halves of the saved (N, 2I) gate_up as two (N, I) temporaries.
std::pair<Tensor, Tensor> split_gate_up(LayerCtx& c, const Tensor& gu) {
  const std::int64_t N = gu.dim(0), I = gu.dim(1) / 2;
  Tensor gate = c.temp({N, I}, gu.dtype()), up = c.temp({N, I}, gu.dtype());
  copy_columns(c, gate, gu, 0);
  copy_columns(c, up, gu, I);
  return {std::move(gate), std::move(up)};
}

std::string key(const LlamaMlp& m, const char* name) {
  return m.key + name;
}

const Tensor& saved_input(LayerCtx& c, const LlamaMlp& m) {
  return c.get(m.input_key.empty() ? key(m, "inp") : m.input_key);
}

// gate_proj, up_proj, SwiGLU and down_proj on x (N, C) in linear's dtype: (N, C), a temporary.
Tensor unfused_forward(LayerCtx& c, const Tensor& inp, const LlamaMlp& m, bool keep_input,
                       Tensor* owned) {
  const std::int64_t C = inp.dim(1);
  const std::int64_t I = c.weight(m.gate_proj.weight).dim(0);  // this rank's I / tp
  Tensor gate, up;  // (N, I): gate_proj and up_proj are column-parallel
  {
    Tensor gathered;  // SP: every rank's tokens
    const Tensor& x = enter_column_parallel(c, inp, gathered, Category::temporaries);
    const std::int64_t n = x.dim(0);
    gate = c.act_tensor({n, I}, c.out_dtype(Op::linear, inp));
    linear_forward(c, gate, x, m.gate_proj);
    up = c.act_tensor({n, I}, c.out_dtype(Op::linear, inp));
    linear_forward(c, up, x, m.up_proj);
  }
  const std::int64_t N = gate.dim(0);
  if (keep_input) c.keep(key(m, "inp"), std::move(*owned));
  Tensor h = c.act_tensor({N, I}, c.out_dtype(Op::swiglu, gate));  // (N, I)
  glu_forward(c, h, gate, up, m);
  c.keep(key(m, "gate"), std::move(gate));
  c.keep(key(m, "up"), std::move(up));
  h = c.cast_input(Op::linear, std::move(h));
  // (N, C): added into the residual (this rank's tokens under SP); down_proj is row-parallel
  Tensor out = c.dev.empty({N, C}, c.out_dtype(Op::linear, h),
                           m.output_saved ? c.cat() : Category::temporaries);
  row_parallel_forward(c, out, h, m.down_proj);
  c.keep(key(m, "h"), std::move(h));
  return out;
}

}  // namespace

Tensor mlp_forward_on(LayerCtx& c, const Tensor& inp, const LlamaMlp& m) {
  ScopedRange scope(c.dev, "mlp");  // names the trace's allocations
  c.expect_input(Op::linear, inp);
  return unfused_forward(c, inp, m, false, nullptr);
}

Tensor mlp_forward(LayerCtx& c, Tensor inp, const LlamaMlp& m) {
  ScopedRange scope(c.dev, "mlp");  // names the trace's allocations
  const bool cast = c.in_dtype(Op::linear, inp) != inp.dtype();
  inp = c.cast_input(Op::linear, std::move(inp));
  // HF's eager code under autocast (hf_eager): gate_proj and up_proj each cast the input and keep
  // their own cast (autocast caches the weights' casts only).
  if (c.hf_eager && cast && !fused(m))
    c.keep(key(m, "inp_cast"), c.act_tensor(inp.shape(), inp.dtype()));
  if (!fused(m)) return unfused_forward(c, inp, m, true, &inp);
  // Phi-3's gate_up_proj, whole (tensor parallelism refuses it: llama.cpp)
  const std::int64_t N = inp.dim(0), C = inp.dim(1);
  const std::int64_t I2 = c.weight(m.gate_up_proj.weight).dim(0);
  Tensor gu = c.act_tensor({N, I2}, c.out_dtype(Op::linear, inp));  // (N, 2I)
  linear_forward(c, gu, inp, m.gate_up_proj);
  c.keep(key(m, "inp"), std::move(inp));
  Tensor h;  // (N, I): down_proj's input
  {
    auto [gate, up] = split_gate_up(c, gu);  // temporaries, freed before down_proj
    h = c.act_tensor({N, I2 / 2}, c.out_dtype(Op::swiglu, gate));
    glu_forward(c, h, gate, up, m);
    c.keep(key(m, "gate_up"), std::move(gu));
  }
  h = c.cast_input(Op::linear, std::move(h));
  Tensor out = c.temp({N, C}, c.out_dtype(Op::linear, h));  // (N, C)
  row_parallel_forward(c, out, h, m.down_proj);
  c.keep(key(m, "h"), std::move(h));
  return out;
}

Tensor mlp_backward(LayerCtx& c, const Tensor& dout, const LlamaMlp& m) {
  ScopedRange scope(c.dev, "mlp");  // names the trace's allocations
  const Tensor& inp = saved_input(c, m);
  const Tensor& h = c.get(key(m, "h"));
  Tensor dh = c.temp_like(h);
  row_parallel_backward(c, &dh, dout, h, m.down_proj);
  if (fused(m)) {
    const Tensor& gu = c.get(key(m, "gate_up"));
    auto [gate, up] = split_gate_up(c, gu);
    Tensor dgate = c.grad_as(std::move(dh), c.out_dtype(Op::swiglu, gate));
    Tensor dup = c.temp_like(up);
    glu_backward(c, dgate, dup, gate, up, m);
    gate.reset();
    up.reset();
    Tensor dgu = c.temp_like(gu);  // (N, 2I): the halves side by side, as chunk's backward
    place_columns(c, dgu, 0, dgate);
    place_columns(c, dgu, dgate.dim(1), dup);
    dgate.reset();
    dup.reset();
    Tensor dinp = c.temp_like(inp);  // (N, C)
    linear_backward(c, &dinp, dgu, inp, m.gate_up_proj);
    return dinp;
  }
  const Tensor& gate = c.get(key(m, "gate"));
  const Tensor& up = c.get(key(m, "up"));
  // d h, then d gate in place (the SwiGLU output has gate's dtype); d up beside it.
  Tensor dgate = c.grad_as(std::move(dh), c.out_dtype(Op::swiglu, gate));
  Tensor dup = c.temp_like(up);
  glu_backward(c, dgate, dup, gate, up, m);

  Tensor gathered;
  const Tensor& x = enter_column_parallel(c, inp, gathered, Category::temporaries);
  Tensor dinp = c.temp_like(x);  // (N, C): gate_proj's and up_proj's contributions added
  linear_backward(c, &dinp, dgate, x, m.gate_proj);
  dgate.reset();
  Tensor dinp_up = c.temp_like(x);
  linear_backward(c, &dinp_up, dup, x, m.up_proj);
  dup.reset();
  c.ops().add_inplace(dinp, dinp_up);
  dinp_up.reset();
  gathered.reset();
  if (c.has(key(m, "inp_cast"))) (void)c.saved.take(c.segment, key(m, "inp_cast"));
  return enter_column_parallel_grad(c, std::move(dinp));
}

}  // namespace memtrade
