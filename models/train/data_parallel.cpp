#include "models/train/data_parallel.h"

namespace memtrade {

std::int64_t first_sample(const TrainConfig& c, std::int64_t step, int rank, std::int64_t micro) {
  return ((step * c.data_parallel + rank) * c.accumulation + micro) * c.batch_size;
}

std::vector<DdpBucket> ddp_buckets(const std::vector<ParamSpec>& specs, DType grad_dtype,
                                   bool experts) {
  std::vector<DdpBucket> out;
  DdpBucket open;
  open.experts = experts;
  std::int64_t limit = kDdpFirstBucketBytes;
  const auto elem = static_cast<std::int64_t>(dtype_size(grad_dtype));
  for (int i = 0; i < static_cast<int>(specs.size()); ++i) {
    if (!specs[static_cast<std::size_t>(i)].trainable) continue;
    if (specs[static_cast<std::size_t>(i)].expert != experts) continue;
    open.params.push_back(i);
    open.numel += shape_numel(specs[static_cast<std::size_t>(i)].shape);
    if (open.numel * elem >= limit) {
      out.push_back(std::move(open));
      open = DdpBucket{};
      open.experts = experts;
      limit = kDdpBucketCapBytes;
    }
  }
  if (!open.params.empty()) out.push_back(std::move(open));
  return out;
}

}  // namespace memtrade
