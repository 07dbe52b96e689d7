// The autocast policy tables (models/config/autocast_policy.h) are complete and self-consistent:
// every op kind has exactly one rule per policy, in Op order, and each rule's dtypes agree with its
// compute rule. (Whether the rows match PyTorch is bench/peers/autocast_probe.py's job.)
#include "models/config/autocast_policy.h"

#include <set>
#include <string>

#include <gtest/gtest.h>

namespace memtrade::autocast {
namespace {

constexpr Policy kPolicies[] = {Policy::torch_cuda, Policy::torch_cpu};

TEST(AutocastPolicy, EveryOpHasOneRulePerPolicyInOrder) {
  for (Policy p : kPolicies) {
    SCOPED_TRACE(std::string(policy_name(p)));
    ASSERT_EQ(rules(p).size(), kNumOps);
    for (std::size_t i = 0; i < kNumOps; ++i) {
      const Op op = static_cast<Op>(i);
      EXPECT_EQ(rules(p)[i].op, op) << "row " << i << " is " << op_name(rules(p)[i].op);
      EXPECT_EQ(&rule(p, op), &rules(p)[i]);
      EXPECT_FALSE(rule(p, op).source.empty()) << op_name(op) << ": no source";
    }
  }
}

TEST(AutocastPolicy, OpAndPolicyNamesAreDistinct) {
  std::set<std::string_view> names;
  for (std::size_t i = 0; i < kNumOps; ++i) names.insert(op_name(static_cast<Op>(i)));
  EXPECT_EQ(names.size(), kNumOps);
  EXPECT_NE(policy_name(Policy::torch_cuda), policy_name(Policy::torch_cpu));
}

// The output dtype a compute rule implies (embedding computes in its fp32 weight's dtype).
bool output_fits(const Rule& r) {
  switch (r.compute) {
    case Compute::lower:
      return r.output == Dtype::lower;
    case Compute::fp32:
      return r.output == Dtype::fp32;
    case Compute::promote:
      return r.output == Dtype::widest;
    case Compute::input:
      return r.output == Dtype::input || (r.op == Op::embedding && r.output == Dtype::fp32);
    case Compute::outside:
      return r.output == Dtype::none && r.num_saved == 0;
  }
  return false;
}

TEST(AutocastPolicy, DtypesAgreeWithTheComputeRule) {
  for (Policy p : kPolicies) {
    for (const Rule& r : rules(p)) {
      SCOPED_TRACE(std::string(policy_name(p)) + " " + std::string(op_name(r.op)));
      EXPECT_TRUE(output_fits(r));
      for (const SavedTensor& s : r.kept()) {
        EXPECT_FALSE(s.what.empty());
        switch (s.kind) {
          case Kept::input_cast:  // the input in the compute dtype
            EXPECT_TRUE((r.compute == Compute::lower && s.dtype == Dtype::lower) ||
                        (r.compute == Compute::fp32 && s.dtype == Dtype::fp32));
            break;
          case Kept::weight_cast:  // only lower-precision ops cast weights
            EXPECT_EQ(r.compute, Compute::lower);
            EXPECT_EQ(s.dtype, Dtype::lower);
            break;
          case Kept::input:  // as it arrived: only where autocast does not cast it
            EXPECT_EQ(s.dtype, Dtype::input);
            EXPECT_EQ(r.compute, Compute::input);
            break;
          case Kept::output:
            EXPECT_EQ(s.dtype, r.output);
            break;
          case Kept::indices:
            EXPECT_EQ(s.dtype, Dtype::i64);
            break;
          case Kept::mask:
            EXPECT_EQ(s.dtype, Dtype::boolean);
            break;
          case Kept::stats:
          case Kept::intermediate:
            EXPECT_NE(s.dtype, Dtype::none);
            break;
        }
      }
    }
  }
}

// Spot checks of the rows the engine's memory depends on most (the difference between the two
// policies is where a CUDA run keeps more than the CPU reference shows).
TEST(AutocastPolicy, CudaKeepsAttentionProbabilitiesTwiceTheCpuOnce) {
  auto count = [](Policy p, Dtype d) {
    int n = 0;
    for (const SavedTensor& s : rule(p, Op::attention).kept())
      n += s.kind == Kept::intermediate && s.dtype == d;
    return n;
  };
  EXPECT_EQ(count(Policy::torch_cuda, Dtype::fp32), 1);
  EXPECT_EQ(count(Policy::torch_cuda, Dtype::lower), 1);
  EXPECT_EQ(count(Policy::torch_cpu, Dtype::fp32), 0);
  EXPECT_EQ(count(Policy::torch_cpu, Dtype::lower), 1);
  EXPECT_EQ(rule(Policy::torch_cuda, Op::layernorm).compute, Compute::fp32);
  EXPECT_EQ(rule(Policy::torch_cpu, Op::layernorm).compute, Compute::input);
}

}  // namespace
}  // namespace memtrade::autocast
