"""What PyTorch keeps for backward at the end of a training forward, measured three ways.

The twin (torch_models) runs memtrade's checkpoint plan with non-reentrant checkpointing
(torch_models.plan_forward). "End of forward" is the moment `forward` has returned the loss and
the autocast region (if any) has been left, before backward: what is alive then is what a
training loop holds across the forward/backward boundary.

(a) hooks: torch.autograd.graph.saved_tensors_hooks sees every tensor autograd saves outside
    checkpointed regions; unique storages, parameters and buffers excluded. Inside a
    non-reentrant checkpoint (torch 1.13, torch/utils/checkpoint.py:419) the checkpoint pushes
    its own pack hook, which saves a placeholder and no tensor, and "only the inner-most pair of
    hooks will be applied" (torch/autograd/graph.py:63-64): the outer hook never sees those
    tensors, and none is kept. What the checkpoint does keep is `args`, its input: `unpack`
    (checkpoint.py:374-417) closes over it to re-run `function(*args)` (checkpoint.py:408),
    and every SavedVariable of the region holds `unpack`. No pack hook ever sees `args`, so
    method (a) adds each checkpointed segment's input storage (when not already counted).
(b) mallinfo: glibc mallinfo2() (uordblks + hblkhd: bytes in use, heap and mmap) after the
    forward minus before, on a warmed-up model with the garbage collector off. That counts
    every byte the forward left allocated, including what no hook sees, and also things that
    are not saved tensors: the loss, the autograd graph's nodes, malloc's chunk headers and
    page rounding, and each checkpoint's CPU RNG state (torch.get_rng_state(), 5056 B,
    checkpoint.py:344). It misses tensors allocated before the forward that autograd saves (the
    batch): `comparable` adds those (from (a)), subtracts the loss and the cached weight casts.
(c) profiler: torch.profiler with profile_memory=True: the net bytes the c10 CPU allocator
    handed out during the forward (exact tensor sizes, no malloc overhead, no graph nodes);
    `comparable` as for (b).

Autocast (cpu-bf16): torch.autocast("cpu", torch.bfloat16) around the forward. Autocast caches
the bf16 cast of every fp32 leaf that requires grad, i.e. of the parameters (cached_cast in
aten/src/ATen/autocast_mode.cpp), and autograd saves those casts for the weight-side backward.
They are weights, not activations, and are reported apart as `weight_casts`. A saved storage
is a weight cast when the saved tensor's autograd history is, through view ops only, a
ToCopyBackward0 of a parameter's AccumulateGrad: a dtype copy of a parameter, which is what
the cache holds (cached or not, it is a weight copy). Each one is checked to hold exactly
param.to(its dtype) and to be param-sized.
"""
import contextlib
import ctypes
import dataclasses
import gc
import pathlib

import numpy as np
import torch

import cpu_isa
import torch_models

AUTOCAST = ("none", "cpu-bf16")
# autograd nodes of view ops: a saved view of a weight cast still points at the cast's storage.
VIEW_NODES = {"TBackward0", "TransposeBackward0", "ViewBackward0", "UnsafeViewBackward0",
              "PermuteBackward0", "ExpandBackward0", "AsStridedBackward0", "AliasBackward0",
              "SliceBackward0", "SelectBackward0", "SqueezeBackward0", "UnsqueezeBackward0",
              "ReshapeAliasBackward0"}


def checkpoint_rng_state_bytes():
    """What each checkpoint keeps besides its input: the CPU RNG state it stashes
    (torch.get_rng_state(), checkpoint.py:344; 5056 B in 1.13)."""
    return torch.get_rng_state().numel()


def family_of(hyper):
    """The twin family: memtrade writes it into the hyper-parameters."""
    return hyper["family"]


def make_batch(family, hyper, batch, dump_dir=None):
    """(inputs, targets) of one micro-batch: the dump's last micro-batch when there is a dump
    (memtrade's trace ends in the last micro-batch's forward), else random ones of that shape."""
    if dump_dir is not None:
        d = pathlib.Path(dump_dir)
        # clone(): a storage of its own, not a view of all micro-batches (storages are counted)
        x = torch.from_numpy(np.load(d / "inputs.npy"))[-batch:].clone()
        t = torch.from_numpy(np.load(d / "targets.npy"))[-batch:].long()
        return (x.long() if x.dtype == torch.int32 else x.float()), t
    g = torch.Generator().manual_seed(0)
    if family in ("gpt", "llama"):
        T, V = int(hyper["seq_len"]), int(hyper["vocab_size"])
        return (torch.randint(0, V, (batch, T), generator=g),
                torch.randint(0, V, (batch, T), generator=g))
    if family == "mlp":
        return (torch.randn(batch, int(hyper["in_features"]), generator=g),
                torch.randint(0, int(hyper["classes"]), (batch,), generator=g))
    s = int(hyper["image_size"])
    return (torch.randn(batch, int(hyper.get("in_channels", 3)), s, s, generator=g),
            torch.randint(0, int(hyper["classes"]), (batch,), generator=g))


def build_twin(hyper):
    torch.manual_seed(0)
    model = torch_models.build(family_of(hyper), hyper)
    model.train()
    return model


def storage_key(t):
    s = t.storage()
    return s.data_ptr(), s.nbytes()


@dataclasses.dataclass
class Saved:
    """One unique storage kept for backward."""
    kind: str       # activation | input (a saved tensor allocated before the forward: the
                    # batch) | weight_cast | checkpoint_input (kept by a checkpoint, no hook)
    nbytes: int     # the storage's bytes
    dtype: str
    shape: tuple    # of the first tensor seen on it
    layer: str      # innermost module running when it was saved ("after X": none running)
    producer: str   # grad_fn of the saved tensor (the op that made it), "" for leaves
    source: str = ""  # weight_cast: the parameter's name
    pre_existing: bool = False  # allocated before the forward (not in an allocator delta)


def _param_source(t, param_names):
    """The parameter `t` is a dtype copy of (through views only), else None."""
    fn, copied = t.grad_fn, False
    while fn is not None:
        name = type(fn).__name__
        if name == "AccumulateGrad":
            return param_names.get(id(fn.variable)) if copied else None
        if name == "ToCopyBackward0":
            copied = True
        elif name not in VIEW_NODES:
            return None
        nxt = [f for f, _ in fn.next_functions if f is not None]
        if len(nxt) != 1:
            return None
        fn = nxt[0]
    return None


class SavedRecorder:
    """Method (a): records every storage autograd saves during a forward (see module doc)."""

    def __init__(self, model, inputs):
        self.params = dict(model.named_parameters())
        self.param_names = {id(p): n for n, p in self.params.items()}
        self.excluded = {storage_key(p)[0] for p in self.params.values()}
        self.excluded |= {storage_key(b)[0] for b in model.buffers()}
        self.batch = {storage_key(t)[0] for t in inputs}  # allocated before the forward
        self.saved = {}  # storage data_ptr -> Saved
        self.checkpoint_calls = 0  # checkpoints run (segments and selective cores)
        self.excluded_seen = 0  # parameter/buffer saves (not counted)
        self._stack, self._last = [], ""
        self._handles = []
        for name, m in model.named_modules():
            if not name:
                continue
            self._handles.append(m.register_forward_pre_hook(
                lambda mod, inp, name=name: self._stack.append(name)))
            self._handles.append(m.register_forward_hook(
                lambda mod, inp, out, name=name: self._exit(name)))

    def _exit(self, name):
        self._stack.pop()
        self._last = name

    def _layer(self):
        return self._stack[-1] if self._stack else f"after {self._last or 'start'}"

    def _add(self, t, kind):
        ptr, nbytes = storage_key(t)
        if ptr in self.saved:
            return
        source = ""
        if kind == "saved":
            if ptr in self.batch:
                kind = "input"
            else:
                source = _param_source(t, self.param_names) or ""
                kind = "weight_cast" if source else "activation"
        producer = type(t.grad_fn).__name__ if t.grad_fn is not None else ""
        self.saved[ptr] = Saved(kind, nbytes, str(t.dtype).replace("torch.", ""),
                                tuple(t.shape), self._layer(), producer, source,
                                ptr in self.batch)

    def pack(self, t):
        if storage_key(t)[0] in self.excluded:
            self.excluded_seen += 1
        else:
            self._add(t, "saved")
        return t

    def on_checkpoint(self, label, *inputs):
        self.checkpoint_calls += 1
        self._stack.append(label)
        for x in inputs:
            self._add(x, "checkpoint_input")
        self._stack.pop()

    def close(self):
        for h in self._handles:
            h.remove()

    def bytes_of(self, *kinds):
        return sum(s.nbytes for s in self.saved.values() if s.kind in kinds)

    def pre_existing_bytes(self):
        return sum(s.nbytes for s in self.saved.values()
                   if s.pre_existing and s.kind != "weight_cast")

    def check_weight_casts(self, tensors_by_ptr):
        """Each weight cast holds exactly its parameter, cast (the detection's proof)."""
        for ptr, s in self.saved.items():
            if s.kind != "weight_cast":
                continue
            t = tensors_by_ptr[ptr]
            cast = t._base if t._base is not None else t  # the saved tensor may be a view (Wᵀ)
            want = self.params[s.source].detach().to(cast.dtype)
            if s.nbytes != want.numel() * want.element_size() or not torch.equal(cast, want):
                raise AssertionError(f"storage saved as a cast of {s.source} does not hold it")


def autocast_context(mode):
    if mode == "none":
        return contextlib.nullcontext()
    if mode == "cpu-bf16":
        return torch.autocast("cpu", dtype=torch.bfloat16)
    raise ValueError(f"--autocast {mode!r}: expected one of {', '.join(AUTOCAST)}")


def _forward(model, plan, x, t, autocast, on_checkpoint=None):
    """The twin's forward under memtrade's plan ({"selective", "plan"})."""
    with autocast_context(autocast):
        return torch_models.plan_forward(model, plan["segments"], x, t, on_checkpoint,
                                         plan["selective"])


def measure_hooks(model, plan, x, t, autocast="none"):
    """Method (a). Returns the SavedRecorder (its `saved` dict is the per-storage breakdown)."""
    rec = SavedRecorder(model, [x, t])
    keep = {}  # data_ptr -> one tensor on it (for the weight-cast check)

    def pack(tensor):
        keep.setdefault(storage_key(tensor)[0], tensor)
        return rec.pack(tensor)

    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda p: p):
            loss = _forward(model, plan, x, t, autocast, rec.on_checkpoint)
        rec.check_weight_casts(keep)
        keep.clear()
        loss.backward()  # the hooks' unpack runs here: the saved graph was whole
    finally:
        rec.close()
    model.zero_grad(set_to_none=True)
    return rec


class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd",
                                               "usmblks", "fsmblks", "uordblks", "fordblks",
                                               "keepcost")]


_libc = None


def malloc_in_use():
    """glibc's bytes in use, all arenas: uordblks (heap chunks) + hblkhd (mmapped chunks)."""
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL("libc.so.6")
        _libc.mallinfo2.restype = _MallInfo2
    m = _libc.mallinfo2()
    return m.uordblks + m.hblkhd


def _train_steps(model, plan, x, t, autocast, n):
    for _ in range(n):
        _forward(model, plan, x, t, autocast).backward()
        model.zero_grad(set_to_none=True)


def measure_mallinfo(model, plan, x, t, autocast="none", warmup=2):
    """Method (b): raw bytes the forward left allocated (see module doc) and the loss bytes."""
    _train_steps(model, plan, x, t, autocast, warmup)
    gc.collect()
    gc.disable()
    try:
        before = malloc_in_use()
        loss = _forward(model, plan, x, t, autocast)
        after = malloc_in_use()
        loss_bytes = storage_key(loss)[1]
        loss.backward()
        del loss
    finally:
        gc.enable()
    model.zero_grad(set_to_none=True)
    return after - before, loss_bytes


def measure_profiler(model, plan, x, t, autocast="none", warmup=1):
    """Method (c): net c10 CPU allocator bytes over the forward, and the loss bytes."""
    from torch.profiler import ProfilerActivity, profile

    _train_steps(model, plan, x, t, autocast, warmup)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        loss = _forward(model, plan, x, t, autocast)
    # The raw allocator records, not the per-op attribution (which varies from run to run).
    net = sum(e.nbytes() for e in prof.profiler.kineto_results.events() if e.name() == "[memory]")
    loss_bytes = storage_key(loss)[1]
    loss.backward()
    model.zero_grad(set_to_none=True)
    return net, loss_bytes


@dataclasses.dataclass
class TorchKept:
    hooks: int            # (a): activations + saved inputs + checkpoint inputs not seen by hooks
    hooks_only: int       # (a) without the checkpoint inputs: what a hook-only count reports
    checkpoint_inputs: int
    inputs: int           # kept storages that existed before the forward (the batch)
    weight_casts: int     # autocast's parameter casts kept for backward (not in `hooks`)
    mallinfo: int = None  # (b) raw
    profiler: int = None  # (c) raw
    loss: int = 0
    checkpoints: int = 0  # checkpoints run (each keeps an RNG state)

    def comparable(self, raw):
        """(b)/(c) on (a)'s footing: plus the saved batch, minus the loss and weight casts."""
        return None if raw is None else raw + self.inputs - self.loss - self.weight_casts


def measure(model, plan, x, t, autocast="none", mallinfo=True, profiler=False):
    """All methods on one point; returns (TorchKept, SavedRecorder of method (a))."""
    # 16-bit work on the kernels of the CPU PyTorch believes it has (cpu_isa.torch_lowp).
    with cpu_isa.torch_lowp() if autocast != "none" else contextlib.nullcontext():
        return _measure(model, plan, x, t, autocast, mallinfo, profiler)


def _measure(model, plan, x, t, autocast, mallinfo, profiler):
    rec = measure_hooks(model, plan, x, t, autocast)
    kept = TorchKept(
        hooks=rec.bytes_of("activation", "input", "checkpoint_input"),
        hooks_only=rec.bytes_of("activation", "input"),
        checkpoint_inputs=rec.bytes_of("checkpoint_input"),
        inputs=rec.pre_existing_bytes(),
        weight_casts=rec.bytes_of("weight_cast"),
        checkpoints=rec.checkpoint_calls)
    if mallinfo:
        kept.mallinfo, kept.loss = measure_mallinfo(model, plan, x, t, autocast)
    if profiler:
        kept.profiler, kept.loss = measure_profiler(model, plan, x, t, autocast)
    return kept, rec
