// SavedTensors: what a training forward keeps for backward, and the policies that decide where
// it lives (device, pinned host) or whether it is kept at all (checkpointing).
//
// Layers save the tensors their backward needs under (segment, key): segment is the block index,
// -1 for the stem (embedding / first conv / input copy) and num_blocks for the head (final norm,
// logits, targets). Everything saved is Category::activations; buffers a forward frees before it
// returns are Category::temporaries, and so are activation gradients in backward.
//
// Policies:
//   - keep (default): the device tensor stays where it is until its segment is released;
//   - offload: save() copies the tensor to pinned host memory on the copy stream (after the
//     compute stream has produced it) and frees the device copy at the next flush(). The model
//     flushes after every block: copies overlap the rest of the block, and the compute stream
//     (not the host) waits for them before anything can reuse the freed bytes. In backward,
//     prefetch(segment) issues a segment's host-to-device copies early (the model does it one
//     segment ahead, so they overlap the current block's backward, at the price of that
//     segment's activations being resident one block sooner) and fetch(segment) makes the
//     compute stream wait for them, issuing them first if nobody did;
//   - checkpointing is decided by CheckpointPlan (below): a recomputed segment saves only its
//     input in forward and re-runs its blocks (saving everything) right before their backward.
#pragma once

#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "kernels/device.h"
#include "models/config/config.h"

namespace memtrade {

class SavedTensors {
 public:
  explicit SavedTensors(Device& dev);
  ~SavedTensors();
  SavedTensors(const SavedTensors&) = delete;
  SavedTensors& operator=(const SavedTensors&) = delete;

  // Offload applies to save() calls made while it is on (the main forward, not recompute).
  void set_offload(bool on) { offload_ = on; }
  bool offload() const { return offload_; }

  // Keep `t` (a device tensor) for the backward of `segment`. Keys are unique per segment. A
  // view is kept as it is, never offloaded.
  void save(int segment, std::string_view key, Tensor t);
  // Keep `t`, which another owner shares (autocast's weight-cast cache, ParamStore::weight_cast),
  // for the backward of `segment`: its bytes live until both have let go. Never offloaded (a
  // weight copy, not an activation); get() reads it, take() refuses it.
  void share(int segment, std::string_view key, std::shared_ptr<Tensor> t);
  bool has(int segment, std::string_view key) const;
  // The saved tensor, on the device (fetch() first if it was offloaded). Throws std::logic_error
  // when absent or still on the host.
  Tensor& get(int segment, std::string_view key);
  Tensor take(int segment, std::string_view key);  // moves it out of the store
  // Lets go of a share()d tensor (its bytes are freed when the other owner has let go too):
  // what autograd does with a node's saved variables once the node has run.
  void unshare(int segment, std::string_view key);

  // Waits for the offload copies issued so far and frees their device sources.
  void flush();
  // Starts bringing the offloaded tensors of `segment` back to the device on the copy stream
  // (idempotent; a no-op when nothing of it is on the host).
  void prefetch(int segment);
  // prefetch(segment), then the compute stream waits for those copies.
  void fetch(int segment);
  // Frees everything saved for `segment` (device and host copies).
  void release(int segment);
  void clear();

  bool empty() const { return segments_.empty() && pending_.empty(); }
  std::int64_t device_bytes() const;  // bytes of saved tensors now on the device (not shared)
  std::int64_t host_bytes() const;    // bytes in pinned host memory

 private:
  struct Entry {
    int segment;
    std::string key;
    Tensor dev;   // defined while on the device
    Tensor host;  // defined while offloaded (kept until release: the copy stream may use it)
    std::shared_ptr<Tensor> shared;  // share(): held with another owner, on the device
  };
  // One segment's entries in the order they were saved (prefetch copies them in that order; a
  // list keeps get()'s references valid), indexed by key: a whole model's blocks may be one
  // segment, thousands of entries (Llama-3-8B: 32 layers × ~20 keys plus weight casts), and the
  // estimator steps thousands of models per `advise`, where a linear search was 40% of its time.
  struct StringHash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  struct Segment {
    std::list<Entry> entries;
    std::unordered_map<std::string, std::list<Entry>::iterator, StringHash, std::equal_to<>> index;
  };
  Entry* find(int segment, std::string_view key);
  const Entry* find(int segment, std::string_view key) const;
  void add(Entry e);
  void erase(int segment, std::string_view key);  // the entry, and its segment once empty

  Device& dev_;
  bool offload_ = false;
  std::map<int, Segment> segments_;  // no segment without entries
  std::vector<Tensor> pending_;      // device sources of D2H copies in flight
  std::unique_ptr<Event> produced_;  // compute stream -> copy stream ordering
  std::unique_ptr<Event> copied_;    // copy stream -> compute stream ordering (flush)
  // Per segment being fetched: recorded on the copy stream after its host-to-device copies.
  std::map<int, std::unique_ptr<Event>> arrivals_;
};

// Which blocks a training forward drops and recomputes.
//
// The n blocks are cut into consecutive segments; a recomputed segment keeps only its input in
// forward, and in backward re-runs all its blocks (saving everything) before backpropagating
// through them in reverse. Rules:
//   - density d: k = round(d·n) (half away from zero) blocks are recomputed, each its own
//     segment, evenly spaced: block i is recomputed iff floor((i+1)·k/n) > floor(i·k/n)
//     (n = 4, k = 2: blocks 1 and 3; k = n: all; k = 0: none);
//   - first<d>: the same k = round(d·n) blocks, each its own segment, but the first k (n = 4,
//     k = 2: blocks 0 and 1). The first blocks' activations are held longest (from their forward
//     until the end of backward), so dropping them lowers the backward peak most per recomputed
//     block; the evenly spaced rule's last recomputed block is recomputed when little else is
//     live;
//   - sqrt: segments of s = ⌈√n⌉ consecutive blocks, all recomputed (only every s-th block
//     boundary is kept);
//   - selective: every block kept (one segment each), but `selective` is set: layers skip saving
//     what is cheap to recompute. GPT and Llama: Megatron's selective recompute, the attention
//     core (the (B, NH, T, T) probabilities; PyTorch: torch.utils.checkpoint around q,k,v ->
//     softmax·V); CNN: the ReLU output after a block's first batch-norm (PyTorch: a checkpoint
//     around bn1 -> relu -> conv2); MLP: nothing.
struct CheckpointPlan {
  struct Segment {
    int begin = 0;  // first block
    int end = 0;    // one past the last block
    bool recompute = false;
  };
  std::vector<Segment> segments;
  bool selective = false;

  static CheckpointPlan make(const Checkpoint& c, int num_blocks);
  static CheckpointPlan none(int num_blocks);  // every block kept, nothing recomputed
  bool recomputed(int block) const;
  int num_recomputed() const;
};

}  // namespace memtrade
