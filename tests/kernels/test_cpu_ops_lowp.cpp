// 16-bit storage: every op run with BF16 / F16 tensors agrees with the fp32 run on the same
// (rounded) inputs within tol + |ref|·eps(dtype); mixed dtypes work; and every op returns the
// allocator to where it was (scratch freed), with the scratch visible in the peak.
#include <functional>
#include <optional>

#include "tests/kernels/test_cpu_ops_common.h"

namespace memtrade::test {
namespace {

struct Arg {
  Shape shape;
  std::vector<float> values;        // empty for outputs: they start as zeros
  std::optional<DType> fixed = {};  // I32 indices, F32 statistics
};

using OpFn = std::function<void(Ops&, std::vector<Tensor>&)>;

class LowpTest : public OpsTest, public ::testing::WithParamInterface<DType> {
 protected:
  // Runs fn on tensors made from args in `dt` (fixed ones keep their dtype) and returns every
  // tensor's values afterwards. Checks that the op leaves no allocation behind.
  std::vector<std::vector<float>> run(const std::vector<Arg>& args, DType dt, const OpFn& fn,
                                      std::int64_t* scratch_peak = nullptr) {
    std::vector<Tensor> ts;
    for (const Arg& a : args) {
      const DType t = a.fixed.value_or(dt);
      if (t == DType::I32) {
        std::vector<std::int32_t> iv(a.values.begin(), a.values.end());
        ts.push_back(ints(a.shape, iv));
      } else {
        ts.push_back(a.values.empty() ? zeros(a.shape, t) : make(a.shape, a.values, t));
      }
    }
    const auto before = mem().stats().allocated.current;
    mem().reset_peak();
    fn(ops(), ts);
    EXPECT_EQ(mem().stats().allocated.current, before) << "op leaked scratch";
    if (scratch_peak) *scratch_peak = mem().stats().allocated.peak - before;
    std::vector<std::vector<float>> out;
    for (const Tensor& t : ts) out.push_back(get(t));
    return out;
  }

  // Inputs are rounded to dt first, so both runs see identical values; then each tensor
  // listed in `outs` must agree: |lo − f32| <= atol + k·eps(dt)·|f32|.
  void compare(const std::string& what, std::vector<Arg> args, const std::vector<int>& outs,
               const OpFn& fn, double atol = 1e-5, double k = 2.0) {
    const DType dt = GetParam();
    for (Arg& a : args)
      if (!a.fixed) a.values = quantize(a.values, dt);
    std::int64_t peak_lo = 0;
    auto lo = run(args, dt, fn, &peak_lo);
    auto hi = run(args, DType::F32, fn);
    for (int i : outs)
      expect_close(lo[i], to_d(hi[i]), atol, k * dtype_eps(dt), what + " #" + std::to_string(i));
  }
};

TEST_P(LowpTest, GemmOps) {
  const int n = 12, c = 20, oc = 9;
  compare("matmul",
          {{{n, c}, rand_vec(n * c, 1)},
           {{oc, c}, rand_vec(oc * c, 2)},
           {{n, oc}, rand_vec(n * oc, 3)}},
          {2}, [](Ops& o, auto& t) { o.matmul(t[2], t[0], t[1], false, true, 1.0f, 0.5f); });
  compare("linear",
          {{{n, c}, rand_vec(n * c, 1)},
           {{oc, c}, rand_vec(oc * c, 2)},
           {{oc}, rand_vec(oc, 3)},
           {{n, oc}, {}}},
          {3}, [](Ops& o, auto& t) { o.linear_forward(t[3], t[0], t[1], &t[2]); });
  compare("linear_backward",
          {{{n, c}, rand_vec(n * c, 1)},
           {{oc, c}, rand_vec(oc * c, 2)},
           {{n, oc}, rand_vec(n * oc, 4)},
           {{n, c}, {}},
           {{oc, c}, rand_vec(oc * c, 5)},
           {{oc}, rand_vec(oc, 6)}},
          {3, 4, 5},
          [](Ops& o, auto& t) { o.linear_backward(&t[3], &t[4], &t[5], t[2], t[0], t[1], true); });
}

TEST_P(LowpTest, ElementwiseOps) {
  const int n = 2100;
  auto x = rand_vec(n, 7, 3.0f), g = rand_vec(n, 8);
  compare("gelu", {{{n}, x}, {{n}, {}}}, {1}, [](Ops& o, auto& t) { o.gelu_forward(t[1], t[0]); });
  compare("gelu_backward", {{{n}, x}, {{n}, g}, {{n}, {}}}, {2},
          [](Ops& o, auto& t) { o.gelu_backward(t[2], t[1], t[0]); });
  // One op per compare: a chain would round its intermediates only in the 16-bit run.
  compare("relu", {{{n}, x}, {{n}, {}}}, {1}, [](Ops& o, auto& t) { o.relu_forward(t[1], t[0]); });
  compare("relu_backward", {{{n}, x}, {{n}, g}}, {1},
          [](Ops& o, auto& t) { o.relu_backward(t[1], t[1], t[0]); });
  compare("add", {{{n}, x}, {{n}, g}, {{n}, {}}}, {2},
          [](Ops& o, auto& t) { o.add(t[2], t[0], t[1]); });
  compare("scale", {{{n}, x}}, {0}, [](Ops& o, auto& t) { o.scale(t[0], 0.3f); });
  compare("add_inplace", {{{n}, x}, {{n}, g}}, {0},
          [](Ops& o, auto& t) { o.add_inplace(t[0], t[1]); });
  compare("cast", {{{n}, x}, {{n}, {}, DType::F32}}, {1},
          [](Ops& o, auto& t) { o.cast(t[1], t[0]); });
}

TEST_P(LowpTest, NormOps) {
  const int n = 6, c = 40;
  auto x = rand_vec(n * c, 9, 2.0f), w = rand_vec(c, 10), b = rand_vec(c, 11),
       g = rand_vec(n * c, 12);
  const Arg mean{{n}, {}, DType::F32}, rstd{{n}, {}, DType::F32};
  compare("layernorm", {{{n, c}, x}, {{c}, w}, {{c}, b}, {{n, c}, {}}, mean, rstd}, {3, 4, 5},
          [](Ops& o, auto& t) { o.layernorm_forward(t[3], t[4], t[5], t[0], t[1], t[2], 1e-5f); });
  compare("layernorm_backward",
          {{{n, c}, x},
           {{c}, w},
           {{c}, b},
           {{n, c}, {}},
           mean,
           rstd,
           {{n, c}, g},
           {{n, c}, {}},
           {{c}, {}},
           {{c}, {}}},
          {7, 8, 9}, [](Ops& o, auto& t) {
            o.layernorm_forward(t[3], t[4], t[5], t[0], t[1], t[2], 1e-5f);
            o.layernorm_backward(t[7], &t[8], &t[9], t[6], t[0], t[1], t[4], t[5], false);
          });
  compare("softmax", {{{n, c}, x}, {{n, c}, {}}}, {1},
          [](Ops& o, auto& t) { o.softmax_forward(t[1], t[0]); });
  std::vector<float> probs(n * c);
  for (int i = 0; i < n * c; ++i) probs[i] = 0.5f + 0.5f * x[i] / 2.0f;  // positive "probabilities"
  compare("softmax_backward", {{{n, c}, probs}, {{n, c}, g}, {{n, c}, {}}}, {2},
          [](Ops& o, auto& t) { o.softmax_backward(t[2], t[1], t[0]); });
}

TEST_P(LowpTest, AttentionOps) {
  const int b = 2, t = 7, c = 8, nh = 2;
  auto qkv = rand_vec(b * t * 3 * c, 13, 1.5f), g = rand_vec(b * t * c, 14);
  auto att = [&] {  // valid causal probabilities to feed backward
    std::vector<float> a(b * nh * t * t, 0.0f);
    for (int r = 0; r < b * nh * t; ++r)
      for (int j = 0; j <= r % t; ++j) a[r * t + j] = 1.0f / (r % t + 1);
    return a;
  }();
  // Attention rounds the scaled scores (here up to ~4), the probabilities, dP and dS to the
  // 16-bit dtype between its GEMMs (ops.h; as CUDA's GEMMs and PyTorch's autocast do), so the
  // error is not relative to each output: forward gets one ulp at 1.0 absolute (a score's
  // rounding moves its probability by ~|score|·eps), backward a quarter ulp (outputs ~0.02).
  compare(
      "attention", {{{b, t, 3 * c}, qkv}, {{b, t, c}, {}}, {{b, nh, t, t}, {}}}, {1, 2},
      [](Ops& o, auto& ts) { o.attention_forward(ts[1], ts[2], ts[0], 2, 2); },
      dtype_eps(GetParam()));
  compare(
      "attention_backward",
      {{{b, t, 3 * c}, qkv}, {{b, t, c}, g}, {{b, nh, t, t}, att}, {{b, t, 3 * c}, {}}}, {3},
      [](Ops& o, auto& ts) { o.attention_backward(ts[3], ts[1], ts[0], ts[2], 2, 2); },
      0.25 * dtype_eps(GetParam()));
}

TEST_P(LowpTest, LlamaOps) {
  const int n = 6, c = 40, nh = 4, nkv = 2, hd = 16, t = 5;
  auto x = rand_vec(n * c, 40, 2.0f), w = rand_vec(c, 41), g = rand_vec(n * c, 42);
  const Arg rstd{{n}, {}, DType::F32};
  // The 16-bit run also rounds x·rstd to the input's dtype before the weight (HF's order):
  // one more rounding of eps/2 relative, within k = 2.
  compare("rmsnorm", {{{n, c}, x}, {{c}, w}, {{n, c}, {}}, rstd}, {2, 3},
          [](Ops& o, auto& ts) { o.rmsnorm_forward(ts[2], ts[3], ts[0], ts[1], 1e-5f); });
  const std::vector<Arg> bwd{{{n, c}, x}, {{n, c}, g},  {{c}, w}, {{n, c}, {}},
                             rstd,        {{n, c}, {}}, {{c}, {}}};
  const OpFn rms_bwd = [](Ops& o, auto& ts) {
    o.rmsnorm_forward(ts[3], ts[4], ts[0], ts[2], 1e-5f);
    o.rmsnorm_backward(ts[5], &ts[6], ts[1], ts[0], ts[2], ts[4], false);
  };
  compare("rmsnorm_backward", bwd, {5}, rms_bwd);
  // dweight sums g·(x·rstd rounded to 16 bits) over the rows: each term carries its rounding
  // (|g| <= 1, |x·rstd| < 2 here), so the error bound is absolute, n terms of eps.
  compare("rmsnorm_backward dweight", bwd, {6}, rms_bwd, n * dtype_eps(GetParam()));
  const int qkv_n = 2 * t * (nh + 2 * nkv) * hd;
  RopeConfig rope;
  rope.theta = 500000.0;
  rope.factor = 32.0;
  compare("rope", {{{2, t, (nh + 2 * nkv) * hd}, rand_vec(qkv_n, 43)}}, {0},
          [rope](Ops& o, auto& ts) { o.rope_forward(ts[0], nh, nkv, rope); });
  compare("rope_backward", {{{2, t, (nh + 2 * nkv) * hd}, rand_vec(qkv_n, 44)}}, {0},
          [rope](Ops& o, auto& ts) { o.rope_backward(ts[0], nh, nkv, rope); });
  auto gate = rand_vec(n * c, 45, 4.0f);
  compare("swiglu", {{{n, c}, gate}, {{n, c}, x}, {{n, c}, {}}}, {2},
          [](Ops& o, auto& ts) { o.swiglu_forward(ts[2], ts[0], ts[1]); });
  compare("swiglu_backward", {{{n, c}, gate}, {{n, c}, x}, {{n, c}, g}, {{n, c}, {}}, {{n, c}, {}}},
          {3, 4}, [](Ops& o, auto& ts) { o.swiglu_backward(ts[3], ts[4], ts[2], ts[0], ts[1]); });
}

TEST_P(LowpTest, EmbeddingAndLoss) {
  const int b = 2, t = 3, c = 5, v = 7;
  const std::vector<float> tok{1, 6, 1, 0, 3, 1};
  const Arg tokens{{b, t}, tok, DType::I32};
  auto e = rand_vec(v * c, 15), p = rand_vec(4 * c, 16), g = rand_vec(b * t * c, 17);
  compare("embedding", {tokens, {{v, c}, e}, {{4, c}, p}, {{b, t, c}, {}}}, {3},
          [](Ops& o, auto& ts) { o.embedding_forward(ts[3], ts[0], ts[1], &ts[2]); });
  compare("embedding_backward", {tokens, {{b, t, c}, g}, {{v, c}, e}, {{4, c}, p}}, {2, 3},
          [](Ops& o, auto& ts) { o.embedding_backward(&ts[2], &ts[3], ts[1], ts[0], true); });
  auto logits = rand_vec(b * t * v, 18, 3.0f);
  const Arg targets{{b * t}, {0, 6, 2, 2, 5, 1}, DType::I32};
  compare("crossentropy",
          {{{b * t, v}, logits}, targets, {{b * t}, {}, DType::F32}, {{b * t, v}, {}}}, {2, 3},
          [](Ops& o, auto& ts) {
            o.crossentropy_forward(ts[2], ts[0], ts[1]);
            o.crossentropy_backward(ts[3], ts[0], ts[1], 1.0f / 6);
          });
}

TEST_P(LowpTest, ConvNetOps) {
  const int n = 2, ci = 3, h = 6, w = 6, co = 4;
  auto x = rand_vec(n * ci * h * w, 19), wt = rand_vec(co * ci * 9, 20), bias = rand_vec(co, 21),
       g = rand_vec(n * co * 3 * 3, 22);
  compare("conv", {{{n, ci, h, w}, x}, {{co, ci, 3, 3}, wt}, {{co}, bias}, {{n, co, 3, 3}, {}}},
          {3}, [](Ops& o, auto& ts) { o.conv2d_forward(ts[3], ts[0], ts[1], &ts[2], 2, 1); });
  compare("conv_backward",
          {{{n, ci, h, w}, x},
           {{co, ci, 3, 3}, wt},
           {{n, co, 3, 3}, g},
           {{n, ci, h, w}, {}},
           {{co, ci, 3, 3}, {}},
           {{co}, {}}},
          {3, 4, 5}, [](Ops& o, auto& ts) {
            o.conv2d_backward(&ts[3], &ts[4], &ts[5], ts[2], ts[0], ts[1], 2, 1, false);
          });
  auto gb = rand_vec(n * ci * h * w, 23);
  compare("batchnorm",
          {{{n, ci, h, w}, x},
           {{ci}, rand_vec(ci, 24)},
           {{ci}, rand_vec(ci, 25)},
           {{n, ci, h, w}, {}},
           {{ci}, {}, DType::F32},
           {{ci}, {}, DType::F32},
           {{n, ci, h, w}, gb},
           {{n, ci, h, w}, {}},
           {{ci}, {}},
           {{ci}, {}}},
          {3, 4, 5, 7, 8, 9}, [](Ops& o, auto& ts) {
            o.batchnorm_forward(ts[3], ts[4], ts[5], ts[0], ts[1], ts[2], nullptr, nullptr, 1e-5f,
                                0.1f);
            o.batchnorm_backward(ts[7], &ts[8], &ts[9], ts[6], ts[0], ts[1], ts[4], ts[5], false);
          });
  compare("pooling",
          {{{n, ci, h, w}, x},
           {{n, ci, 3, 3}, {}},
           {{n, ci, 3, 3}, {}, DType::I32},
           {{n, ci, 3, 3}, rand_vec(n * ci * 9, 26)},
           {{n, ci, h, w}, {}},
           {{n, ci}, {}}},
          {1, 2, 4, 5}, [](Ops& o, auto& ts) {
            o.maxpool2d_forward(ts[1], ts[2], ts[0], 2, 2);
            o.maxpool2d_backward(ts[4], ts[3], ts[2]);
            o.global_avgpool_forward(ts[5], ts[0]);
          });
}

TEST_P(LowpTest, OptimizerPurePrecision) {
  const int n = 1500;
  OptimizerHyper h;
  h.kind = OptimizerKind::adamw;
  h.lr = 1e-2f;
  h.weight_decay = 0.1f;
  h.step = 3;
  auto sq = rand_vec(n, 30, 0.5f);
  for (float& v : sq) v *= v;  // exp_avg_sq is non-negative
  compare("adamw",
          {{{n}, rand_vec(n, 27)}, {{n}, rand_vec(n, 28)}, {{n}, rand_vec(n, 29, 0.1f)}, {{n}, sq}},
          {0, 2}, [h](Ops& o, auto& ts) { o.optimizer_update(h, ts[0], ts[1], &ts[2], &ts[3]); });
}

INSTANTIATE_TEST_SUITE_P(Dtypes, LowpTest, ::testing::Values(DType::BF16, DType::F16),
                         [](const auto& param_info) {
                           return std::string(dtype_name(param_info.param));
                         });

TEST_F(OpsTest, MixedDtypesInOneOp) {
  // inp bf16, weight f32, bias f16, out f16: each read and written in its own dtype.
  const int n = 5, c = 6, oc = 3;
  auto x = quantize(rand_vec(n * c, 31), DType::BF16), w = rand_vec(oc * c, 32),
       b = quantize(rand_vec(oc, 33), DType::F16);
  Tensor tx = make({n, c}, x, DType::BF16), tw = make({oc, c}, w), tb = make({oc}, b, DType::F16);
  Tensor out = zeros({n, oc}, DType::F16), ref = zeros({n, oc});
  Tensor fx = make({n, c}, x), fb = make({oc}, b);
  ops().linear_forward(out, tx, tw, &tb);
  ops().linear_forward(ref, fx, tw, &fb);
  expect_close(get(out), to_d(quantize(get(ref), DType::F16)), 1e-6, 1e-6, "mixed linear");
}

TEST_F(OpsTest, ScratchIsAccountedAndFreed) {
  // 16-bit GEMM operands are converted into workspace; attention backward always needs a
  // (T, T) scratch. Both must show in the peak and be gone afterwards.
  const int b = 1, t = 16, c = 8;
  Tensor qkv = make({b, t, 3 * c}, rand_vec(b * t * 3 * c, 34)), att = zeros({b, 2, t, t}),
         out = zeros({b, t, c}), dq = zeros({b, t, 3 * c});
  ops().attention_forward(out, att, qkv, 2, 2);
  auto before = mem().stats().allocated.current;
  mem().reset_peak();
  ops().attention_backward(dq, out, qkv, att, 2, 2);
  EXPECT_EQ(mem().stats().allocated.current, before);
  EXPECT_GE(mem().stats().allocated.peak - before, t * t * 4);
  EXPECT_GT(mem().stats().by_category_at_peak[static_cast<int>(Category::temporaries)], 0);

  Tensor x = make({64, 32}, rand_vec(64 * 32, 35), DType::BF16),
         w = make({16, 32}, rand_vec(512, 36), DType::BF16);
  Tensor y = zeros({64, 16}, DType::BF16);
  before = mem().stats().allocated.current;
  mem().reset_peak();
  ops().linear_forward(y, x, w, nullptr);
  EXPECT_EQ(mem().stats().allocated.current, before);
  EXPECT_GE(mem().stats().allocated.peak - before, (64 * 32 + 16 * 32 + 64 * 16) * 4);
  // fp32 GEMMs need no scratch at all.
  Tensor xf = make({64, 32}, rand_vec(64 * 32, 35)), wf = make({16, 32}, rand_vec(512, 36)),
         yf = zeros({64, 16});
  before = mem().stats().allocated.current;
  mem().reset_peak();
  ops().linear_forward(yf, xf, wf, nullptr);
  EXPECT_EQ(mem().stats().allocated.peak, before);
}

}  // namespace
}  // namespace memtrade::test
