"""What PyTorch 1.13's DDP and ZeroRedundancyOptimizer hold per rank, measured on the CPU.

`measure(model, optimizer, mode, world=2)` spawns `world` ranks (torch.multiprocessing, gloo on
127.0.0.1), wraps memtrade's PyTorch twin (bench/peers/torch_models.py) in
DistributedDataParallel, takes one step (forward, backward with DDP's all-reduce, optimizer.step)
on a batch of 4 random inputs per rank, and returns per rank the bytes of the parameters, the
gradients, DDP's bucket buffers and the optimizer state ("zero": ZeroRedundancyOptimizer over
DDP, i.e. ZeRO stage 1, plus which parameter indices the rank owns), and, for comparison, the
buckets DDP rebuilds to for iteration 2 on. Bucket buffers are seen through a DDP comm hook
(GradBucket.buffer()) and checked against torch's own assignment and DDP's logging data. Values
do not matter, only bytes: the twins are built from their constructors with default init,
hyper-parameters from memtrade's size table (models/model.cpp, size_table()).

CLI: /usr/bin/python3 tests/python/ddp_reference.py --model gpt-tiny --optimizer adam --mode ddp
Torch source cited: /usr/lib/python3/dist-packages/torch (1.13), nn/parallel/distributed.py
("ddp.py" below), distributed/optim/zero_redundancy_optimizer.py ("zero.py"), optim/adam.py.
"""
import argparse
import json
import os
import pathlib
import socket
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "bench" / "peers"))
import torch_models  # noqa: E402

# memtrade's tiny sizes (models/model.cpp size_table(); the keys of each model's hyper()).
HYPER = {
    "gpt-tiny": dict(family="gpt", n_layer=2, n_head=2, n_embd=64, vocab_size=256, block_size=32),
    "gpt-small": dict(family="gpt", n_layer=6, n_head=6, n_embd=384, vocab_size=8192,
                      block_size=256),
    "llama-tiny": dict(family="llama", n_layer=2, n_head=4, n_kv_head=2, n_embd=64,
                       intermediate_size=176, vocab_size=256, block_size=32, rope_theta=1e4,
                       norm_eps=1e-5, tie_word_embeddings=False),
    "mlp-tiny": dict(family="mlp", in_features=32, hidden=[64, 64], classes=10),
    "cnn-tiny": dict(family="cnn", image_size=16, in_channels=3, stem_channels=8, widths=[8, 16],
                     strides=[1, 2], classes=10),
}
BATCH = 4  # per rank
_KEEP = []  # see hook() in rank_main
OPTIMIZERS = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}


def nbytes(t):
    return t.numel() * t.element_size()


def batch(h, gen):
    """Random inputs and targets of the shape memtrade feeds the model (values irrelevant)."""
    if h["family"] in ("gpt", "llama"):  # token ids (B, T), T = block_size; next-token targets
        x = torch.randint(h["vocab_size"], (BATCH, h["block_size"]), generator=gen)
        return x, torch.randint(h["vocab_size"], (BATCH, h["block_size"]), generator=gen)
    shape = (BATCH, h["in_features"]) if h["family"] == "mlp" else \
        (BATCH, h["in_channels"], h["image_size"], h["image_size"])
    return torch.randn(shape, generator=gen), torch.randint(h["classes"], (BATCH,), generator=gen)


def expected_initial_buckets(params):
    """DDP's buckets for the first iteration, as ddp.py _ddp_init_helper builds them (l.720-736):
    with find_unused_parameters=False and static_graph=False (the defaults, ddp.py l.540-544)
    the size limits are [sys.maxsize], i.e. ONE bucket of every parameter; the
    [dist._DEFAULT_FIRST_BUCKET_BYTES (1 MiB), bucket_cap_mb=25 MiB] limits only apply under
    find_unused_parameters=True, or when the Reducer rebuilds its buckets in gradient-ready order,
    in forward() of the SECOND iteration (ddp.py l.1026 reducer._rebuild_buckets()). The
    assignment is handed to dist.Reducer reversed (ddp.py l.735: "approximate the order in which
    their gradients are produced"); each bucket's flat buffer is `at::empty({sum of numel})` in the
    params' dtype (PyTorch's reducer.cpp, not shipped here: initialize_buckets, "Allocate the
    bucket's flattened `gradients` tensor"), a copy beside p.grad (gradient_as_bucket_view=False).
    """
    sparse = [False] * len(params)
    indices, _ = dist._compute_bucket_assignment_by_size(params, [sys.maxsize], sparse)
    return [sum(nbytes(params[i]) for i in b) for b in reversed(indices)]


def zero_partition(params, world):
    """zero.py _partition_parameters (l.645-660): the params sorted by numel, largest first
    (stable sort, so ties keep their order), each given greedily to the rank with the fewest
    elements so far (_get_min_index: the first such rank). Returns each rank's indices."""
    owned, sizes = [[] for _ in range(world)], [0] * world
    for i in sorted(range(len(params)), key=lambda i: params[i].numel(), reverse=True):
        r = sizes.index(min(sizes))
        owned[r].append(i)
        sizes[r] += params[i].numel()
    return owned


def rounded(t):
    """What PyTorch's CUDA caching allocator allocates for t: its bytes rounded up to 512
    (c10/cuda/CUDACachingAllocator.cpp round_size, kMinBlockSize), at least 512."""
    return max(1, -(-nbytes(t) // 512)) * 512


def device_state_bytes(state):
    """The optimizer state a GPU holds, as the allocator rounds it: Adam's 'step' is a CPU
    tensor unless capturable/fused (adam.py l.211-214), so only the moments count."""
    return sum(rounded(v) for s in state.values() for k, v in s.items()
               if torch.is_tensor(v) and k != "step")


def state_bytes(state):
    """Every tensor in optimizer.state. Adam/AdamW (adam.py l.211-220): exp_avg and exp_avg_sq
    like p, plus 'step', a 0-dim float32 tensor (4 bytes each); SGD without momentum stores
    momentum_buffer = None (sgd.py l.164-166): 0 bytes."""
    return sum(nbytes(v) for s in state.values() for v in s.values() if torch.is_tensor(v))


def rank_main(rank, world, port, model, optimizer, mode, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        torch.manual_seed(0)  # same init everywhere (DDP broadcasts rank 0's anyway, ddp.py l.658)
        h = HYPER[model]
        net = torch_models.build(h["family"], h)
        ddp = DDP(net)
        # model.parameters() deduplicates the tied lm_head/wte, as DDP's _build_params_for_reducer
        # does; both walk named_modules() in the same order, so these are the Reducer's indices.
        params = list(net.parameters())
        seen = []  # each bucket's flat buffer as the Reducer hands it over (GradBucket.buffer()).

        def hook(state, bucket):  # the built-in all-reduce (sum, then / world), in place
            buf = bucket.buffer()
            seen.append((bucket.index(), nbytes(buf)))
            # Not default_hooks.allreduce_hook, and each buffer kept alive in _KEEP: gloo's worker
            # thread must never need the GIL (to run that hook's fut.then() callback, or to free
            # a tensor whose last owner it is), as the Reducer's teardown joins it holding the
            # GIL (~ProcessGroupGloo): seen to deadlock in 1 of 3 to 1 of 24 runs otherwise.
            _KEEP.append(buf)
            dist.all_reduce(buf)
            fut = torch.futures.Future()
            fut.set_result(buf.div_(world))
            return fut
        ddp.register_comm_hook(None, hook)
        cls = OPTIMIZERS[optimizer]
        opt = cls(ddp.parameters(), lr=1e-3) if mode == "ddp" else \
            ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=cls, lr=1e-3)
        x, y = batch(h, torch.Generator().manual_seed(1 + rank))  # each rank its own data
        ddp(x, y).backward()
        opt.step()
        buckets = [b for _, b in sorted(seen)]
        expected = expected_initial_buckets(params)
        assert buckets == expected, (buckets, expected)
        # The Reducer's own record of them (Logger construction data, bytes, bucket order).
        assert ddp._get_ddp_logging_data()["bucket_sizes"] == ", ".join(map(str, buckets))
        res = {"rank": rank, "params": sum(nbytes(p) for p in params),
               # Every param's full grad on every rank, also under ZeRO (stage 1 shards only the
               # optimizer state; DDP all-reduces and keeps them all).
               "grads": sum(nbytes(p.grad) for p in params if p.grad is not None),
               "buckets": buckets, "bucket_bytes": sum(buckets),
               # The same as the CUDA caching allocator would hold them (each tensor and bucket
               # rounded up to 512 B), what memtrade's allocated figures count.
               "params_512": sum(rounded(p) for p in params),
               # Batch norm's running statistics (F32 buffers, as memtrade's); its
               # num_batches_tracked counters (int64 scalars) apart: memtrade keeps no counter;
               # nor the twins' causal-mask buffers (memtrade's attention masks as it computes).
               "buffers_512": sum(rounded(b) for n, b in net.named_buffers()
                                  if n.endswith(("running_mean", "running_var"))),
               "counters_512": sum(rounded(b) for n, b in net.named_buffers()
                                   if n.endswith("num_batches_tracked")),
               "grads_512": sum(rounded(p.grad) for p in params if p.grad is not None),
               "bucket_bytes_512": sum(max(1, -(-b // 512)) * 512 for b in buckets)}
        if mode == "ddp":
            res["optimizer_state"] = state_bytes(opt.state)
            res["optimizer_state_512"] = device_state_bytes(opt.state)
        else:
            # The local optimizer (zero.py l.1017 self.optim.step) holds state for its shard only.
            res["optimizer_state"] = state_bytes(opt.optim.state)
            res["optimizer_state_512"] = device_state_bytes(opt.optim.state)
            ids = {id(p): i for i, p in enumerate(params)}
            owned = sorted(ids[id(p)] for g in opt.optim.param_groups for p in g["params"])
            assert owned == sorted(zero_partition(params, world)[rank]), owned
            res["owned_params"] = owned
        # For comparison, the buckets from iteration 2 on: its forward rebuilds them (ddp.py
        # l.1026 reducer._rebuild_buckets(); once, as find_unused_parameters=False) by the same
        # assignment over the params in the order their grads became ready in iteration 1 (about
        # reverse definition order, but e.g. a LayerNorm's weight before its bias), now with limits
        # [_DEFAULT_FIRST_BUCKET_BYTES, bucket_cap_mb]. Measured by one more forward/backward,
        # after every number above was taken (no optimizer step: nothing above changes).
        seen.clear()
        ddp(x, y).backward()
        res["rebuilt_buckets"] = [b for _, b in sorted(seen)]
        (pathlib.Path(out) / f"{rank}.json").write_text(json.dumps(res))
    finally:
        dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(model, optimizer, mode, world=2):
    """One dict per rank: {"rank", "params", "grads", "buckets", "bucket_bytes",
    "rebuilt_buckets", "optimizer_state", "owned_params" (zero only)}; bytes throughout."""
    if model not in HYPER or optimizer not in OPTIMIZERS or mode not in ("ddp", "zero"):
        raise ValueError(f"unknown model/optimizer/mode {model!r}/{optimizer!r}/{mode!r}")
    with tempfile.TemporaryDirectory() as out:
        mp.spawn(rank_main, args=(world, free_port(), model, optimizer, mode, out), nprocs=world)
        return [json.loads((pathlib.Path(out) / f"{r}.json").read_text()) for r in range(world)]


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="gpt-tiny", choices=sorted(HYPER))
    ap.add_argument("--optimizer", default="adam", choices=sorted(OPTIMIZERS))
    ap.add_argument("--mode", default="ddp", choices=["ddp", "zero"])
    ap.add_argument("--world", type=int, default=2)
    a = ap.parse_args()
    print(json.dumps(measure(a.model, a.optimizer, a.mode, a.world)))
