// Autocast (fp16/bf16 precision): the engine runs each op in the dtype the policy table gives it
// (models/config/autocast_policy.h), keeps what autograd keeps, in those dtypes, and holds
// autocast's weight casts in their own category for exactly as long as PyTorch does.
#include <set>
#include <string>

#include "models/families/block_model.h"
#include "models/layers/context.h"
#include "tests/models/test_store.h"
#include "tests/models/test_trainer_util.h"

namespace memtrade::testing {
namespace {

using autocast::Policy;
constexpr DType F32 = DType::F32, BF16 = DType::BF16;

// ---- LayerCtx: dtypes from the table, casts, weight casts, 16-bit weight gradients ----------

struct CtxFixture {
  std::unique_ptr<Device> dev = cpu_device();
  std::unique_ptr<Model> model = make_model("mlp-tiny");
  TestStore store{*dev, *model, F32};
  SavedTensors saved{*dev};
  LayerCtx ctx(std::optional<AutocastSpec> amp, DType act = F32) {
    LayerCtx c{*dev, store, saved, act, amp};
    c.segment = 0;
    c.save = true;
    return c;
  }
};

TEST(AutocastCtx, DtypesComeFromThePolicyTable) {
  CtxFixture f;
  const LayerCtx o2 = f.ctx(std::nullopt, BF16);  // outside autocast: every op in `act`
  for (Op op : {Op::linear, Op::layernorm, Op::softmax, Op::crossentropy, Op::add}) {
    EXPECT_EQ(o2.in_dtype(op, F32, F32), BF16);
    EXPECT_EQ(o2.out_dtype(op, F32, F32), BF16);
  }
  const LayerCtx cuda = f.ctx(AutocastSpec{BF16, Policy::torch_cuda});
  EXPECT_EQ(cuda.in_dtype(Op::linear, F32, F32), BF16);  // lower: cast to 16 bits
  EXPECT_EQ(cuda.out_dtype(Op::linear, F32, F32), BF16);
  EXPECT_EQ(cuda.in_dtype(Op::layernorm, BF16, BF16), F32);  // fp32: cast up
  EXPECT_EQ(cuda.out_dtype(Op::softmax, BF16, BF16), F32);   // fp32_set_opt_dtype
  EXPECT_EQ(cuda.in_dtype(Op::crossentropy, BF16, BF16), F32);
  EXPECT_EQ(cuda.out_dtype(Op::add, F32, BF16), F32);  // promotes to the widest
  EXPECT_EQ(cuda.out_dtype(Op::add, BF16, BF16), BF16);
  EXPECT_EQ(cuda.out_dtype(Op::gelu, BF16, BF16), BF16);  // not listed: its input's dtype
  EXPECT_EQ(cuda.out_dtype(Op::embedding, F32, F32), F32);
  const LayerCtx cpu = f.ctx(AutocastSpec{BF16, Policy::torch_cpu});
  EXPECT_EQ(cpu.in_dtype(Op::linear, F32, F32), BF16);
  EXPECT_EQ(cpu.in_dtype(Op::layernorm, BF16, BF16), BF16);  // not on 1.13's CPU lists
  EXPECT_EQ(cpu.out_dtype(Op::softmax, BF16, BF16), BF16);
  EXPECT_EQ(cpu.in_dtype(Op::crossentropy, BF16, BF16), F32);
  EXPECT_THROW(cpu.in_dtype(Op::optimizer, F32, F32), std::logic_error);
}

TEST(AutocastCtx, CastInputMakesAKeptCastOnlyWhereTheOpNeedsOne) {
  CtxFixture f;
  LayerCtx c = f.ctx(AutocastSpec{BF16, Policy::torch_cuda});
  Tensor x = f.dev->empty({4, 8}, F32, Category::activations);
  f.dev->from_host_f32(x, std::vector<float>(32, 1.0f + 1.0f / 1024));  // not a bf16 value
  const void* p = x.data();
  Tensor same = c.cast_input(Op::layernorm, std::move(x));  // fp32 op, fp32 input: no cast
  EXPECT_EQ(same.data(), p);
  Tensor cast = c.cast_input(Op::linear, std::move(same));
  EXPECT_EQ(cast.dtype(), BF16);
  EXPECT_EQ(cast.category(), Category::activations);  // a saving forward keeps the cast
  EXPECT_EQ(f.dev->to_host_f32(cast)[0], 1.0f);       // rounded to bf16
  EXPECT_FALSE(same.defined());
  EXPECT_EQ(f.dev->memory().stats().by_category[static_cast<int>(Category::activations)],
            static_cast<std::int64_t>(CachingAllocator::round_size(32 * 2)))
      << "the fp32 source is freed";
  EXPECT_THROW(c.expect_input(Op::layernorm, cast), std::logic_error);
  Tensor holder;
  const Tensor& back = c.grad_as(cast, F32, holder);  // ToCopyBackward: a temporary
  EXPECT_EQ(&back, &holder);
  EXPECT_EQ(holder.category(), Category::temporaries);
}

TEST(AutocastCtx, WeightCastsAreCachedPerRegionAndKeptForBackward) {
  CtxFixture f;
  LayerCtx c = f.ctx(AutocastSpec{BF16, Policy::torch_cuda});
  const int w = f.store.index("layers.0.weight"), b = f.store.index("layers.0.bias");
  const Tensor& w16 = c.op_weight(Op::linear, w);
  EXPECT_EQ(w16.dtype(), BF16);
  EXPECT_EQ(w16.category(), Category::casts);
  EXPECT_EQ(f.dev->to_host_f32(w16)[3], bf16_to_float(float_to_bf16(f.store.weight_host(w)[3])));
  EXPECT_EQ(&c.op_weight(Op::linear, w), &w16);  // kept with the segment: found again
  const Tensor& b16 = c.op_weight(Op::linear, b, false);
  EXPECT_EQ(&c.op_weight(Op::linear, b, false), &b16);  // the cache's
  EXPECT_EQ(f.store.cached_casts(), 2u);
  EXPECT_FALSE(f.saved.has(0, "cast." + std::to_string(b)));  // a bias cast is not kept
  auto casts = [&] {
    return f.dev->memory().stats().by_category[static_cast<int>(Category::casts)];
  };
  const std::int64_t both = casts();
  f.store.clear_casts();  // the region ends: the bias cast goes, the kept weight cast stays
  EXPECT_EQ(casts(), static_cast<std::int64_t>(CachingAllocator::round_size(w16.nbytes())));
  EXPECT_LT(casts(), both);
  EXPECT_EQ(&c.op_weight(Op::linear, w), &w16);
  c.backward = true;  // backward reads kept casts and never makes one
  LayerCtx other = f.ctx(AutocastSpec{BF16, Policy::torch_cuda});
  other.segment = 1;
  other.backward = true;
  EXPECT_THROW(other.op_weight(Op::linear, w), std::logic_error);
  f.saved.release(0);
  EXPECT_EQ(casts(), 0);
  // An fp32 op reads the weight itself; outside autocast every op does.
  EXPECT_EQ(&c.op_weight(Op::layernorm, w), &f.store.weight(w));
  LayerCtx plain = f.ctx(std::nullopt);
  EXPECT_EQ(&plain.op_weight(Op::linear, w), &f.store.weight(w));
}

TEST(AutocastCtx, SixteenBitWeightGradsAreCastThenAssignedOrAdded) {
  CtxFixture f;
  LayerCtx c = f.ctx(AutocastSpec{BF16, Policy::torch_cuda});
  const int w = f.store.index("layers.1.bias");  // (64)
  const float v = 1.0f + 3.0f / 128;             // a bf16 value
  for (int round = 0; round < 2; ++round) {
    ParamGrad g(c, w, BF16);
    EXPECT_EQ(g.t().dtype(), BF16);
    EXPECT_FALSE(g.accumulate());  // the 16-bit gradient is always fresh
    f.dev->ops().fill(g.t(), v);
    g.finish();
    EXPECT_EQ(f.store.grad_host(w)[5], (round + 1) * v) << "round " << round;
  }
  EXPECT_EQ(f.dev->memory().stats().by_category[static_cast<int>(Category::temporaries)], 0);
  ParamGrad direct(c, w, F32);  // an op that read the fp32 weight writes the gradient itself
  EXPECT_TRUE(direct.accumulate());
  f.dev->ops().fill(direct.t(), 0.5f);
  direct.finish();
  EXPECT_EQ(f.store.grad_host(w)[5], 0.5f);
}

// ---- what each model keeps, in which dtype --------------------------------------------------

// A training forward of `name` under autocast (weights fp32), returning the model to inspect.
struct Kept {
  std::unique_ptr<Device> dev = cpu_device();
  std::unique_ptr<Model> model;
  std::unique_ptr<TestStore> store;
  Tensor losses;
  Kept(const std::string& name, Policy policy, const char* checkpoint = "0") {
    model = make_model(name);
    store = std::make_unique<TestStore>(*dev, *model, F32);
    auto b = make_device_batch(*dev, *model, 5, 0, 4, F32);
    RunOptions o;
    o.checkpoint = *Checkpoint::parse(checkpoint);
    o.amp = AutocastSpec{BF16, policy};
    losses = model->forward(*dev, *store, b.input, b.targets, o);
  }
  const SavedTensors& saved() const { return *static_cast<BlockModel&>(*model).saved(); }
  DType dtype(int segment, const std::string& key) const {
    return const_cast<SavedTensors&>(saved()).get(segment, key).dtype();
  }
  std::string cast_of(const char* param) const {
    return "cast." + std::to_string(static_cast<BlockModel&>(*model).param_index(param));
  }
};

TEST(AutocastKeeps, GptResidualFp32SixteenBitInsideFp32Loss) {
  for (Policy p : {Policy::torch_cuda, Policy::torch_cpu}) {
    SCOPED_TRACE(std::string(autocast::policy_name(p)));
    const Kept k("gpt-tiny", p);
    const int head = k.model->num_blocks();
    for (int i = 0; i < head; ++i) {
      EXPECT_EQ(k.dtype(i, "x"), F32);   // the residual stream: fp32 embedding, promoting adds
      EXPECT_EQ(k.dtype(i, "x1"), F32);  // ln_2's input
      for (const char* key : {"attn.inp", "attn.qkv", "attn.y", "mlp.inp", "mlp.h", "mlp.g"})
        EXPECT_EQ(k.dtype(i, key), BF16) << key;
      // softmax: fp32 on CUDA (and ·V's 16-bit cast kept too), in its input's dtype on the CPU
      EXPECT_EQ(k.dtype(i, "attn.att"), p == Policy::torch_cuda ? F32 : BF16);
      EXPECT_EQ(k.saved().has(i, "attn.att_mm"), p == Policy::torch_cuda);
      const std::string w = "transformer.h." + std::to_string(i) + ".attn.c_attn.";
      EXPECT_EQ(k.dtype(i, k.cast_of((w + "weight").c_str())), BF16);
      EXPECT_FALSE(k.saved().has(i, k.cast_of((w + "bias").c_str())));
    }
    EXPECT_EQ(k.dtype(head, "x"), F32);
    EXPECT_EQ(k.dtype(head, "lnf"), BF16);
    EXPECT_EQ(k.dtype(head, "logits"), F32);  // the loss is fp32: log-probs' bytes
    EXPECT_EQ(k.dtype(head, k.cast_of("transformer.wte.weight")), BF16);
    EXPECT_EQ(k.store->cached_casts(), 0u) << "the cache is cleared when forward ends";
  }
}

// Llama as the GPT: fp32 residual (and RMSNorm, which casts to fp32 itself), 16-bit linears,
// SwiGLU and RoPE in the linears' dtype, the stacked q/k/v projection's three weight casts kept.
TEST(AutocastKeeps, LlamaResidualFp32SixteenBitInsideFp32Loss) {
  for (Policy p : {Policy::torch_cuda, Policy::torch_cpu}) {
    SCOPED_TRACE(std::string(autocast::policy_name(p)));
    const Kept k("llama-tiny", p);
    const int head = k.model->num_blocks();
    for (int i = 0; i < head; ++i) {
      EXPECT_EQ(k.dtype(i, "x"), F32);
      EXPECT_EQ(k.dtype(i, "x1"), F32);
      EXPECT_EQ(k.dtype(i, "input_layernorm.rstd"), F32);
      for (const char* key :
           {"attn.inp", "attn.qkv", "attn.y", "mlp.inp", "mlp.gate", "mlp.up", "mlp.h"})
        EXPECT_EQ(k.dtype(i, key), BF16) << key;
      // HF's softmax(..., dtype=torch.float32) under either policy, and its .to(bf16) for ·V.
      EXPECT_EQ(k.dtype(i, "attn.att"), F32);
      EXPECT_EQ(k.dtype(i, "attn.att_mm"), BF16);
      const std::string w = "model.layers." + std::to_string(i) + ".";
      for (const char* proj : {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                               "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"})
        EXPECT_EQ(k.dtype(i, k.cast_of((w + proj + ".weight").c_str())), BF16) << proj;
    }
    EXPECT_EQ(k.dtype(head, "x"), F32);
    EXPECT_EQ(k.dtype(head, "lnf"), BF16);
    EXPECT_EQ(k.dtype(head, "logits"), F32);
    EXPECT_EQ(k.dtype(head, k.cast_of("lm_head.weight")), BF16);
    EXPECT_FALSE(k.saved().has(-1, k.cast_of("model.embed_tokens.weight")));  // untied: fp32
    EXPECT_EQ(k.store->cached_casts(), 0u);
  }
}

TEST(AutocastKeeps, MlpKeepsTheInputCastOrTheCheckpointedInput) {
  const Kept kept("mlp-tiny", Policy::torch_cuda);
  EXPECT_EQ(kept.dtype(0, "x"), BF16);  // block 0's linear keeps its cast of the fp32 input
  EXPECT_EQ(kept.dtype(1, "x"), BF16);
  EXPECT_EQ(kept.dtype(2, "logits"), F32);
  const Kept ck("mlp-tiny", Policy::torch_cuda, "1");
  EXPECT_EQ(ck.dtype(0, "x"), F32);  // a checkpoint keeps the segment's input itself
  EXPECT_FALSE(ck.saved().has(0, ck.cast_of("layers.0.weight")));
}

TEST(AutocastKeeps, CnnKeepsTheImageCastAndSixteenBitBatchNormInputs) {
  const Kept k("cnn-tiny", Policy::torch_cpu);
  EXPECT_EQ(k.dtype(-1, "img"), BF16);
  EXPECT_EQ(k.dtype(-1, "stem.conv"), BF16);
  EXPECT_EQ(k.dtype(-1, "stem.mean"), F32);
  EXPECT_EQ(k.dtype(0, "c1.conv"), BF16);
  EXPECT_EQ(k.dtype(0, k.cast_of("blocks.0.conv1.weight")), BF16);
  EXPECT_EQ(k.dtype(2, "pooled"), BF16);
  EXPECT_EQ(k.dtype(2, "logits"), F32);
}

// ---- memory, measured in a Trainer ----------------------------------------------------------

std::int64_t bytes_at(const std::array<std::int64_t, kNumCategories>& a, Category c) {
  return a[static_cast<std::size_t>(c)];
}

// Per category: the bytes live when the step's (last) forward ends, and each one's peak.
struct StepMemory {
  std::array<std::int64_t, kNumCategories> end_of_forward{}, own_peak{}, after{};
};

StepMemory step_memory(const TrainConfig& cfg) {
  auto dev = cpu_device();
  auto model = make_model(cfg.model);
  Trainer trainer(*dev, *model, cfg);
  trainer.step();
  dev->memory().enable_trace(true);
  std::array<std::int64_t, kNumCategories> now = dev->memory().stats().by_category;
  trainer.step();
  StepMemory m;
  m.own_peak = now;
  const auto& trace = dev->memory().trace();
  for (std::size_t i = 0; i < trace.size(); ++i) {
    const auto c = static_cast<std::size_t>(trace[i].category);
    const auto b = static_cast<std::int64_t>(trace[i].bytes);
    if (trace[i].kind == TraceEvent::Kind::alloc) now[c] += b;
    if (trace[i].kind == TraceEvent::Kind::free) now[c] -= b;
    m.own_peak[c] = std::max(m.own_peak[c], now[c]);
    if (trace[i].phase == "forward" && i + 1 < trace.size() && trace[i + 1].phase == "backward")
      m.end_of_forward = now;
  }
  m.after = dev->memory().stats().by_category;
  return m;
}

// The parameters autocast reads through 16-bit casts: every linear and conv weight and bias (the
// tied GPT head once), not the norms' parameters nor the position embedding, nor an untied
// Llama's token embedding. With `kept`, only those whose casts backward keeps: no biases, and
// not the MLP's first linear weight (its input needs no gradient; the CNN's stem conv keeps its
// weight all the same).
std::int64_t cast_bytes(const Model& m, bool kept) {
  std::int64_t total = 0;
  for (const auto& s : m.params()) {
    const std::string& n = s.name;
    const bool norm = n.find("ln_") != std::string::npos || n.find("bn") != std::string::npos ||
                      n.find("downsample.1") != std::string::npos ||
                      n.find("layernorm") != std::string::npos || n == "model.norm.weight";
    const bool bias = n.size() > 5 && n.compare(n.size() - 5, 5, ".bias") == 0;
    const bool untied_embedding =
        n == "model.embed_tokens.weight" && m.params().back().name == "lm_head.weight";
    if (!s.trainable || norm || n == "transformer.wpe.weight" || untied_embedding) continue;
    if (kept && (bias || n == "layers.0.weight")) continue;
    total += static_cast<std::int64_t>(
        CachingAllocator::round_size(static_cast<std::size_t>(shape_numel(s.shape) * 2)));
  }
  return total;
}

TEST(AutocastMemory, EveryComputeWeightIsCastOncePerForwardAndFreedByItsBackward) {
  for (const char* name :
       {"gpt-tiny", "llama-tiny", "llama-tiny:tie_word_embeddings=true", "mlp-tiny", "cnn-tiny"}) {
    for (const char* ck : {"0", "1"}) {
      SCOPED_TRACE(std::string(name) + " checkpoint=" + ck);
      TrainConfig cfg = base_config(name, 4);
      cfg.precision = Precision::bf16;
      cfg.checkpoint = *Checkpoint::parse(ck);
      auto model = make_model(name);
      const StepMemory m = step_memory(cfg);
      EXPECT_EQ(bytes_at(m.own_peak, Category::casts), cast_bytes(*model, false));
      // When forward ends, the casts backward reads stay, the others go; checkpointed blocks
      // keep none of theirs (their recompute casts again).
      if (std::string(ck) == "0")
        EXPECT_EQ(bytes_at(m.end_of_forward, Category::casts), cast_bytes(*model, true));
      else
        EXPECT_LT(bytes_at(m.end_of_forward, Category::casts), cast_bytes(*model, true));
      EXPECT_EQ(bytes_at(m.after, Category::casts), 0);
      cfg.precision = Precision::bf16_o2;
      EXPECT_EQ(bytes_at(step_memory(cfg).own_peak, Category::casts), 0);
    }
  }
}

// The policies differ, for memtrade's ops, only in GPT's attention probabilities: CUDA's fp32
// softmax output is kept next to ·V's 16-bit cast (4 more bytes per probability than the CPU's
// one 16-bit copy); layer norm's fp32 rule changes nothing (its inputs are fp32 already). Llama's
// (HF's code) are fp32 plus the cast under both: softmax(..., dtype=torch.float32) asks for it.
TEST(AutocastMemory, CudaPolicyKeepsFp32AttentionProbabilitiesOnTopOfTheCpuOnes) {
  for (const char* name : {"gpt-tiny", "llama-tiny", "mlp-tiny", "cnn-tiny"}) {
    SCOPED_TRACE(name);
    TrainConfig cfg = base_config(name, 8);
    cfg.precision = Precision::bf16;
    cfg.autocast_policy = Policy::torch_cpu;
    const std::int64_t on_cpu = bytes_at(step_memory(cfg).end_of_forward, Category::activations);
    cfg.autocast_policy = Policy::torch_cuda;
    const std::int64_t on_cuda = bytes_at(step_memory(cfg).end_of_forward, Category::activations);
    std::int64_t probs = 0;
    const auto h = make_model(name)->hyper();
    if (h["family"] == "gpt") {
      const std::int64_t T = h["block_size"], NH = h["n_head"], L = h["n_layer"];
      probs = L * static_cast<std::int64_t>(
                      CachingAllocator::round_size(static_cast<std::size_t>(8 * NH * T * T * 4)));
    }
    EXPECT_EQ(on_cuda - on_cpu, probs);
  }
}

TEST(AutocastMemory, KeepsMoreThanO2LessThanFp32WhereTheResidualStaysFp32) {
  TrainConfig cfg = base_config("gpt-tiny", 8);
  const std::int64_t fp32 = bytes_at(step_memory(cfg).end_of_forward, Category::activations);
  cfg.precision = Precision::bf16_o2;
  const std::int64_t o2 = bytes_at(step_memory(cfg).end_of_forward, Category::activations);
  cfg.precision = Precision::bf16;
  cfg.autocast_policy = Policy::torch_cpu;
  const std::int64_t amp = bytes_at(step_memory(cfg).end_of_forward, Category::activations);
  EXPECT_GT(amp, o2);
  EXPECT_LT(amp, fp32);
}

}  // namespace
}  // namespace memtrade::testing
