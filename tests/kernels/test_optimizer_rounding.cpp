// The optimizer update rounds alike on both backends (kernels/optimizer_math.h; kernels/ops.h,
// rounding rules), checked without a GPU:
//   - the CPU update equals torch's formulas evaluated one IEEE rounding per operation, in the
//     documented order, bit for bit: a build that lets the compiler fuse them into FMA
//     (-march=native without -ffp-contract=off) fails here;
//   - the PTX of the CUDA optimizer kernels (kernels/CMakeLists.txt: memtrade_optim_ptx) has no
//     fused, approximate or flush-to-zero fp32 arithmetic, and every add, sub, mul, div and sqrt
//     carries .rn, which ptxas may not contract either. Skipped where CUDA is not built.
#include <cmath>
#include <cstdint>
#include <fstream>
#include <ostream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "tests/kernels/test_cpu_ops_common.h"

namespace memtrade::test {
namespace {

// ---- the CPU update against a separately rounded reference --------------------------------------

// x as a float in memory: whatever computed it was rounded to fp32 there, so the compiler cannot
// fuse it into the next operation.
float r(float x) {
  volatile float v = x;
  return v;
}
double rd(double x) {
  volatile double v = x;
  return v;
}

struct Elem {
  float w, g, s0, s1;
};

// torch.optim's formulas, one rounding per operation, in optimizer_math.h's order.
void reference_step(const OptimizerHyper& h, Elem& e) {
  const double t = static_cast<double>(h.step);
  const auto step_size = static_cast<float>(h.lr / rd(1.0 - std::pow(double{h.beta1}, t)));
  const auto bc2_sqrt = static_cast<float>(std::sqrt(rd(1.0 - std::pow(double{h.beta2}, t))));
  const auto clr = static_cast<float>(h.lr / rd(1.0 + rd((t - 1.0) * h.lr_decay)));
  float w = e.w, g = r(e.g * h.grad_scale);
  if (h.kind == OptimizerKind::adamw)
    w = r(w * r(1.0f - r(h.lr * h.weight_decay)));
  else
    g = r(g + r(h.weight_decay * w));
  switch (h.kind) {
    case OptimizerKind::sgd:
      w = r(w - r(h.lr * g));
      break;
    case OptimizerKind::sgd_momentum:
      e.s0 = h.step == 1 ? g : r(r(h.momentum * e.s0) + r(r(1.0f - h.dampening) * g));
      g = h.nesterov ? r(g + r(h.momentum * e.s0)) : e.s0;
      w = r(w - r(h.lr * g));
      break;
    case OptimizerKind::adam:
    case OptimizerKind::adamw: {
      e.s0 = r(r(h.beta1 * e.s0) + r(r(1.0f - h.beta1) * g));
      e.s1 = r(r(h.beta2 * e.s1) + r(r(r(1.0f - h.beta2) * g) * g));
      const float denom = r(r(std::sqrt(e.s1) / bc2_sqrt) + h.eps);
      w = r(w - r(r(step_size * e.s0) / denom));
      break;
    }
    case OptimizerKind::adagrad:
      e.s0 = r(e.s0 + r(g * g));
      w = r(w - r(r(clr * g) / r(std::sqrt(e.s0) + h.eps)));
      break;
    case OptimizerKind::rmsprop:
      e.s0 = r(r(h.alpha * e.s0) + r(r(r(1.0f - h.alpha) * g) * g));
      w = r(w - r(r(h.lr * g) / r(std::sqrt(e.s0) + h.eps)));
      break;
  }
  e.w = w;
}

struct KindCase {
  OptimizerKind kind;
  bool nesterov;
  const char* name;
};

void PrintTo(const KindCase& k, std::ostream* os) {
  *os << k.name;
}

class OptimizerRounding : public OpsTest, public ::testing::WithParamInterface<KindCase> {};

// Three steps on 100k fp32 elements, with weight decay, dampening and a loss scale: every
// parameter and state bit equals the reference's.
TEST_P(OptimizerRounding, CpuUpdateRoundsEveryOperationOnItsOwn) {
  const KindCase kc = GetParam();
  const std::int64_t n = 100000;
  OptimizerHyper h;
  h.kind = kc.kind;
  h.lr = 0.01f;
  h.weight_decay = 0.01f;
  h.dampening = 0.1f;
  h.nesterov = kc.nesterov;
  h.lr_decay = 0.01f;
  h.grad_scale = 1.0f / 1024.0f;
  const std::vector<float> w0 = rand_vec(n, 1);
  std::vector<Elem> ref(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < ref.size(); ++i)
    ref[i] = {w0[i], 0.0f, kc.kind == OptimizerKind::adagrad ? 0.1f : 0.0f, 0.0f};
  Tensor p = make({n}, w0), s0 = zeros({n}), s1 = zeros({n});
  ops().fill(s0, ref[0].s0);
  const int ns = optimizer_state_count(kc.kind);
  for (int step = 1; step <= 3; ++step) {
    h.step = step;
    const std::vector<float> g = rand_vec(n, 10 + step, 1024.0f);
    Tensor grad = make({n}, g);
    ops().optimizer_update(h, p, grad, ns >= 1 ? &s0 : nullptr, ns >= 2 ? &s1 : nullptr);
    for (std::size_t i = 0; i < ref.size(); ++i) {
      ref[i].g = g[i];
      reference_step(h, ref[i]);
    }
    const std::vector<float> got_p = get(p), got_s0 = get(s0), got_s1 = get(s1);
    std::size_t bad_p = 0, bad_s0 = 0, bad_s1 = 0;
    for (std::size_t i = 0; i < ref.size(); ++i) {
      bad_p += got_p[i] != ref[i].w;
      bad_s0 += ns >= 1 && got_s0[i] != ref[i].s0;
      bad_s1 += ns >= 2 && got_s1[i] != ref[i].s1;
    }
    EXPECT_EQ(bad_p, 0u) << kc.name << " step " << step << ": parameters differ";
    EXPECT_EQ(bad_s0, 0u) << kc.name << " step " << step << ": state0 differs";
    EXPECT_EQ(bad_s1, 0u) << kc.name << " step " << step << ": state1 differs";
  }
}

INSTANTIATE_TEST_SUITE_P(Kinds, OptimizerRounding,
                         ::testing::Values(KindCase{OptimizerKind::sgd, false, "sgd"},
                                           KindCase{OptimizerKind::sgd_momentum, false, "momentum"},
                                           KindCase{OptimizerKind::sgd_momentum, true, "nesterov"},
                                           KindCase{OptimizerKind::adam, false, "adam"},
                                           KindCase{OptimizerKind::adamw, false, "adamw"},
                                           KindCase{OptimizerKind::adagrad, false, "adagrad"},
                                           KindCase{OptimizerKind::rmsprop, false, "rmsprop"}),
                         [](const ::testing::TestParamInfo<KindCase>& i) {
                           return std::string(i.param.name);
                         });

// ---- the CUDA kernels' PTX ---------------------------------------------------------------------

struct PtxFunction {
  std::string name;
  std::vector<std::string> opcodes;  // e.g. "mul.rn.f32", one per instruction
};

// PTX without comments and without directive lines (.reg, .loc, ...: a directive line has no
// instruction, and .loc lines end without a ';').
std::string strip_ptx(const std::string& text) {
  std::string code;
  for (std::size_t i = 0; i < text.size();) {
    if (text.compare(i, 2, "//") == 0) {
      i = text.find('\n', i);
    } else if (text.compare(i, 2, "/*") == 0) {
      i = text.find("*/", i);
      if (i != std::string::npos) i += 2;
    } else {
      code += text[i++];
    }
    if (i == std::string::npos) break;
  }
  std::istringstream lines(code);
  std::string out;
  for (std::string line; std::getline(lines, line);) {
    const std::size_t first = line.find_first_not_of(" \t");
    const bool head =
        line.find(".entry") != std::string::npos || line.find(".func") != std::string::npos;
    if (first != std::string::npos && line[first] == '.' && !head) continue;
    out += line + '\n';
  }
  return out;
}

// The .entry and .func definitions of a PTX file, each as its instructions' opcodes.
std::vector<PtxFunction> parse_ptx(const std::string& ptx) {
  const std::string text = strip_ptx(ptx);
  std::vector<PtxFunction> out;
  const std::regex head(R"(\.(entry|func)\s+(\([^)]*\)\s*)?([A-Za-z_$][\w$]*))");
  const std::regex label(R"(^\s*[A-Za-z_$][\w$]*:)"), pred(R"(^\s*@!?%\w+\s+)");
  for (std::sregex_iterator it(text.begin(), text.end(), head), end; it != end; ++it) {
    // After the parameters, a body or (a declaration) a ';'.
    const std::size_t open = text.find_first_of("{;", static_cast<std::size_t>(it->position()));
    if (open == std::string::npos || text[open] == ';') continue;
    int depth = 0;  // to the matching '}': inline asm and vector operands nest braces
    std::size_t close = open;
    for (; close < text.size(); ++close) {
      if (text[close] == '{') ++depth;
      if (text[close] == '}' && --depth == 0) break;
    }
    PtxFunction f{(*it)[3].str(), {}};
    std::istringstream body(text.substr(open + 1, close - open - 1));
    for (std::string stmt; std::getline(body, stmt, ';');) {
      for (char& ch : stmt)
        if (ch == '{' || ch == '}') ch = ' ';
      while (std::regex_search(stmt, label)) stmt = std::regex_replace(stmt, label, "");
      stmt = std::regex_replace(stmt, pred, "");
      std::istringstream words(stmt);
      if (std::string op; words >> op) f.opcodes.push_back(op);
    }
    out.push_back(std::move(f));
  }
  return out;
}

bool has_part(const std::vector<std::string>& parts, std::string_view p) {
  for (const std::string& s : parts)
    if (s == p) return true;
  return false;
}

// Opcodes that may round otherwise than the CPU's one IEEE rounding per operation.
std::vector<std::string> rounding_violations(const PtxFunction& f) {
  std::vector<std::string> bad;
  for (const std::string& op : f.opcodes) {
    std::vector<std::string> parts;
    std::istringstream ss(op);
    for (std::string p; std::getline(ss, p, '.');) parts.push_back(p);
    bool fp = false;
    for (const char* t : {"f16", "f16x2", "bf16", "bf16x2", "f32", "f64"})
      fp = fp || has_part(parts, t);
    if (!fp) continue;
    const std::string& base = parts[0];
    const bool fused = base == "fma" || base == "mad";
    const bool inexact = has_part(parts, "approx") || has_part(parts, "full") ||
                         has_part(parts, "ftz") || has_part(parts, "sat") || base == "rcp" ||
                         base == "rsqrt" || base == "ex2" || base == "lg2" || base == "sin" ||
                         base == "cos" || base == "tanh";
    // Without a rounding modifier, ptxas may still fuse a mul into the next add.
    const bool arith =
        base == "add" || base == "sub" || base == "mul" || base == "div" || base == "sqrt";
    if (fused || inexact || (arith && !has_part(parts, "rn"))) bad.push_back(op);
  }
  return bad;
}

// The scanner itself, on hand-written PTX: it must see what it is there to see.
TEST(OptimizerPtxScan, FlagsFusedApproximateAndUnroundedArithmetic) {
  const std::string ptx = R"(
.extern .func (.param .b32 func_retval0) vprintf(.param .b64 a, .param .b64 b);
.visible .entry good(
  .param .u64 p
)
.maxntid 256, 1, 1
{
  .reg .f32 %f<9>;  // a directive
  .loc 1 23 5
$L__BB0_1:
  mul.rn.f32 %f1, %f2, %f3;
  add.rn.f32 %f4, %f1, %f5;
  @%p1 bra $L__BB0_1;
  mad.lo.s32 %r1, %r2, %r3, %r4;
  { cvt.rn.bf16.f32 %rs1, %f4; }
  div.rn.f32 %f6, %f4, %f7;
  sqrt.rn.f32 %f8, %f6;
  /* fma.rn.f32 in a comment */
  ret;
}
.func (.param .b32 r) bad(.param .b32 x)
{
  fma.rn.f32 %f1, %f2, %f3, %f4;
  mul.f32 %f1, %f2, %f3;
  @!%p2 sub.f32 %f1, %f2, %f3;
  div.approx.f32 %f1, %f2, %f3;
  div.full.f32 %f1, %f2, %f3;
  sqrt.approx.ftz.f32 %f1, %f2;
  add.rn.ftz.f32 %f1, %f2, %f3;
  rcp.rn.f32 %f1, %f2;
  fma.rn.f16x2 %r1, %r2, %r3, %r4;
  mul.rz.f32 %f1, %f2, %f3;
  ret;
}
)";
  const std::vector<PtxFunction> fs = parse_ptx(ptx);
  ASSERT_EQ(fs.size(), 2u);
  EXPECT_EQ(fs[0].name, "good");
  EXPECT_EQ(fs[0].opcodes.size(), 8u);
  EXPECT_TRUE(rounding_violations(fs[0]).empty()) << rounding_violations(fs[0])[0];
  EXPECT_EQ(fs[1].name, "bad");
  EXPECT_EQ(rounding_violations(fs[1]),
            (std::vector<std::string>{"fma.rn.f32", "mul.f32", "sub.f32", "div.approx.f32",
                                      "div.full.f32", "sqrt.approx.ftz.f32", "add.rn.ftz.f32",
                                      "rcp.rn.f32", "fma.rn.f16x2", "mul.rz.f32"}));
}

// Every kernel of kernels/cuda/cuda_ops_optim.cu (the single- and multi-tensor updates, the
// unscale) rounds each fp32 operation on its own.
TEST(OptimizerPtxScan, CudaOptimizerKernelsRoundEveryOperationOnTheirOwn) {
#ifndef MEMTRADE_OPTIM_PTX
  GTEST_SKIP() << "the CUDA backend is not built (no optimizer PTX to scan)";
#else
  std::ifstream in(MEMTRADE_OPTIM_PTX);
  ASSERT_TRUE(in) << "cannot read " << MEMTRADE_OPTIM_PTX;
  std::stringstream ss;
  ss << in.rdbuf();
  const std::vector<PtxFunction> fs = parse_ptx(ss.str());
  int single = 0, multi = 0, unscale = 0, rounded = 0;
  for (const PtxFunction& f : fs) {
    single += f.name.find("optimizer_kernel") != std::string::npos;
    multi += f.name.find("optimizer_multi_kernel") != std::string::npos;
    unscale += f.name.find("unscale_kernel") != std::string::npos;
    for (const std::string& op : f.opcodes) rounded += op == "mul.rn.f32" || op == "add.rn.f32";
    const std::vector<std::string> bad = rounding_violations(f);
    std::string list;
    for (const std::string& op : bad) list += " " + op;
    EXPECT_TRUE(bad.empty()) << f.name << " has " << bad.size() << " such instructions:" << list;
  }
  // Not vacuous: the kernels are there, with their arithmetic.
  EXPECT_GT(single, 0);
  EXPECT_GT(multi, 0);
  EXPECT_GT(unscale, 0);
  EXPECT_GT(rounded, 100);
#endif
}

}  // namespace
}  // namespace memtrade::test
