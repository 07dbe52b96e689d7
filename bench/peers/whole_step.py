#!/usr/bin/env python3
"""The whole training step's peak, as PyTorch shows it: memtrade against PyTorch eager.

    whole_step.py --memtrade BIN [--models gpt-mini,llama-mini,mlp-small,cnn-small] [--batch 8]
                  [--checkpoints 0,1,0.5,selective] [--precisions fp32,bf16]
                  [--optimizers sgd,adam] [--accumulations 1,2] [--zero-grads set_to_none,zero]
                  [--impls forloop] [--foreach-rows] [--warmup 2] [--threads N] [--json OUT]
                  [--markdown FILE]

A user reads torch.cuda.max_memory_allocated(): the peak of the whole step (forward, backward and
the optimizer step), not the bytes kept at the end of forward (saved_bytes.py). Both sides here
report the peak of live bytes above the step's start, once the optimizer state exists (after
--warmup steps):

  PyTorch   the twin (torch_models) with memtrade's resolved point (`run --list --json`: hyper-
            parameters, checkpoint plan, optimizer hyper-parameters), a step as peer_point runs
            it (k micro-batches, each loss / k backward, opt.step(), opt.zero_grad(set_to_none)),
            measured by torch.profiler's allocator records (profile_memory=True): the running sum
            of every allocation's bytes, its maximum, without each op's own scratch (a block
            that one ATen op call, the outermost aten:: op, allocates and frees before it
            returns: oneDNN's reorders of a convolution's operands, the im2col columns of ATen's
            bf16 convolution, the CPU batch-norm backward's buffer). That is what memtrade's side
            leaves out as category `workspace` below: the CPU kernels' library scratch (on CUDA,
            cuDNN's workspace takes its place, modelled apart). It changes nothing on GPT, Llama
            and the MLP; it lowers cnn-tiny's b8 peak without checkpointing from 724,852 to
            624,500 B (fp32) and from 556,068 to 335,140 B (bf16, whose peak was a convolution
            backward's 294,912 B of columns). The micro-batches exist before the step.
            Checkpoints run with preserve_rng_state=False: the CPU RNG state each would stash
            (5056 B) is host memory on CUDA, which max_memory_allocated() does not count, and
            the twins draw no random numbers.
  memtrade  `run --trace` of the same point, the last measured step: the running sum of the
            requested bytes of every alloc and free, its maximum, without categories `io`
            (memtrade stages the batch on the device inside the step; PyTorch's CPU twin reads
            the host batch in place; memtrade's first layer saves that staged batch in place, as
            PyTorch's saves its own) and `workspace` (memtrade's CPU backend stages 16-bit GEMM
            operands and convolution columns in fp32 scratch inside the op, OpenBLAS having
            neither: the op's own scratch, left out on PyTorch's side too).

Precision bf16 is memtrade's torch-cpu autocast policy against torch.autocast("cpu", bfloat16).
A llama-* point runs memtrade with --llama-layers hf-eager, its model of HF's eager layers (the
twin's), and says so in its label (ll-hf-eager).
--impls: memtrade's optimizer_impl against torch.optim's foreach flag (forloop: foreach=False,
PyTorch's default on CPU tensors; foreach: foreach=True; fused has no CPU implementation in torch
1.13). torch 1.13's _multi_tensor_adam keeps one more whole-state list than the 2.x code memtrade
transcribes (`denom`, beside the square root: tests/python/test_optimizer_impl.py), so a foreach
Adam row whose peak is the optimizer step differs by that list; the table says where each peak is.

--foreach-rows adds, per model, SGD and Adam at batch 1 × accumulation 2 (fp32, no checkpoint,
set_to_none) with each implementation: small activations, where the optimizer step is the peak.

Exit: 0 table written, 2 bad input (one line).
"""
import argparse
import contextlib
import itertools
import json
import os
import pathlib
import sys
import tempfile

# oneDNN's convolutions block channels by the vector width they run at, and what they keep
# follows: on an Intel Xeon (family 6 model 167) its AVX-512 kernels keep 68,096 B more in
# cnn-tiny's b8 step (PyTorch 792,948 B) than its AVX2 kernels (724,852 B), which AMD's Zen 3
# and Zen 5 also ran (AVX2 by their CPU, or by oneDNN's own dispatch). So that the PyTorch side
# is the same on every x86 machine CI lands from, oneDNN is capped at AVX2 unless the environment
# caps it already. oneDNN reads the cap when it makes its first primitive, not at `import torch`:
# this runs on import, before any step is measured (pytest imports it at collection).
os.environ.setdefault("DNNL_MAX_CPU_ISA", "AVX2")

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import cpu_isa  # noqa: E402
import memtrade_side  # noqa: E402
import peer_point  # noqa: E402
from memtrade_side import BadInput  # noqa: E402

MODELS = ["gpt-mini", "llama-mini", "mlp-small", "cnn-small"]
CHECKPOINTS = ["0", "1", "0.5", "selective"]
PRECISIONS = ["fp32", "bf16"]
OPTIMIZERS = ["sgd", "adam"]
ACCUMULATIONS = ["1", "2"]
ZERO_GRADS = ["set_to_none", "zero"]
BEGIN, END = "<!-- whole-step:begin -->", "<!-- whole-step:end -->"
STEP_MARK = "whole_step: optimizer.step"
# torch 1.13's foreach code keeps one whole fp32 state more than 2.x's (memtrade's transcription):
# tests/python/test_optimizer_impl.py proves it exactly.
EXTRA_LIST_113 = {"adam", "adamw", "adagrad"}


def llama_like(model):
    """The twin of a llama-* model is HF's eager code: memtrade models it with --llama-layers
    hf-eager (its default, liger, keeps what fused kernels keep)."""
    return model.startswith("llama")


def point_flags(model, batch, checkpoint, precision, optimizer, accumulation, zero_grad, impl):
    flags = ["--backend", "cpu", "--model", model, "--batch-size", str(batch),
             "--checkpoint", checkpoint, "--precision", precision, "--optimizer", optimizer,
             "--accumulation", str(accumulation), "--zero-grad", zero_grad,
             "--optimizer-impl", impl]
    if precision == "bf16":
        flags += ["--autocast-policy", "torch-cpu"]
    if llama_like(model):
        flags += ["--llama-layers", "hf-eager"]
    return flags


def memtrade_peak(binary, flags, tmp, warmup):
    """Peak live requested bytes above the traced step's start (io and the CPU backend's
    library scratch, workspace, excluded), and the phase of the event where it is reached."""
    trace = pathlib.Path(tmp) / "trace.json"
    memtrade_side.run(binary, ["run", *flags, "--warmup", str(warmup), "--steps", "1",
                               "--trace", str(trace), "--out", str(pathlib.Path(tmp) / "r.json")],
                      "run --trace")
    doc = memtrade_side.read_trace(trace)
    live = peak = 0
    phase = "start"
    for e in doc["events"]:
        if e["kind"] not in ("alloc", "free") or e.get("category") in ("io", "workspace"):
            continue
        live += e["requested"] if e["kind"] == "alloc" else -e["requested"]
        if live > peak:
            peak, phase = live, e.get("phase", "")
    return peak, phase


def torch_peak(point, impl, warmup, threads=None):
    """PyTorch eager's peak of live bytes above the step's start (profiler memory events), and
    its peaks inside and outside optimizer.step()."""
    import torch
    import torch_models
    from torch.profiler import ProfilerActivity, profile

    if threads:
        torch.set_num_threads(threads)
    cfg, resolved = point["config"], point["resolved"]
    hyper = cfg["hyper"]
    family = torch_models.family_of(cfg)
    B, k = int(cfg["batch_size"]), int(cfg["accumulation"])
    torch.manual_seed(int(cfg["seed"]))
    model = torch_models.build(family, hyper)
    peer_point.init_like_memtrade(torch, model, family, hyper)
    model.train()
    plan = memtrade_side.checkpoint_plan(resolved, len(torch_models.parts(model)[1]))
    segments = [tuple(s) for s in plan["segments"]]
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch_models.make_optimizer(resolved["optimizer_hyper"], params,
                                      impl=impl)
    set_to_none = cfg["zero_grad"] == "set_to_none"
    bf16 = cfg["precision"] == "bf16"
    g = torch.Generator().manual_seed(int(cfg["seed"]))

    def micro_batch():
        if family in ("gpt", "llama"):
            T = int(hyper.get("seq_len", hyper["block_size"]))
            return (torch.randint(0, hyper["vocab_size"], (B, T), generator=g),
                    torch.randint(0, hyper["vocab_size"], (B, T), generator=g))
        if family == "mlp":
            return (torch.randn(B, hyper["in_features"], generator=g),
                    torch.randint(0, hyper["classes"], (B,), generator=g))
        s = hyper["image_size"]
        return (torch.randn(B, hyper["in_channels"], s, s, generator=g),
                torch.randint(0, hyper["classes"], (B,), generator=g))

    batches = [micro_batch() for _ in range(k)]

    def step():
        for x, t in batches:
            with torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else \
                    contextlib.nullcontext():
                loss = torch_models.plan_forward(model, segments, x, t,
                                                 selective=plan["selective"])
            (loss.float() / k).backward()
            del loss
        with torch.profiler.record_function(STEP_MARK):
            opt.step()
        opt.zero_grad(set_to_none=set_to_none)

    # Device memory only: a checkpoint's stashed CPU RNG state is host memory on CUDA.
    torch_models.preserve_rng_state = False
    try:
        with cpu_isa.torch_lowp() if bf16 else contextlib.nullcontext():
            opt.zero_grad(set_to_none=set_to_none)
            for _ in range(warmup):
                step()
            with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
                step()
    finally:
        torch_models.preserve_rng_state = True
    tree = prof.profiler.kineto_results.experimental_event_tree()
    live = in_step = out_step = 0  # peaks inside and outside optimizer.step()
    for size, step_op in allocations(tree):
        live += size
        if step_op:
            in_step = max(in_step, live)
        else:
            out_step = max(out_step, live)
    live = every = 0  # the same with every allocation: what the allocator itself saw
    for size, _ in allocations(tree, keep_scratch=True):
        live += size
        every = max(every, live)
    return max(in_step, out_step), in_step, out_step, every


def allocations(tree, keep_scratch=False):
    """The allocator's records of a profiled step in order, as (bytes, inside optimizer.step()),
    without the ops' own scratch (unless `keep_scratch`): a block that one ATen op call (the
    outermost aten:: op, as the model or an autograd node calls it) allocates and frees before it
    returns. See the module doc."""
    records = []  # (time, id, bytes, ptr, outermost aten op's id or None, in step)

    def walk(node, op, step):
        if op is None and node.name.startswith("aten::"):
            op = node.id
        step = step or node.name == STEP_MARK
        if str(node.tag).endswith("Allocation"):
            f = node.extra_fields
            records.append((node.start_time_ns, node.id, f.alloc_size, f.ptr, op, step))
        for child in node.children:
            walk(child, op, step)

    for root in tree:
        walk(root, None, False)
    records.sort(key=lambda r: (r[0], r[1]))
    scratch, made_in = set(), {}  # ids left out; ptr -> (id, op) of its live allocation
    for _, rid, size, ptr, op, _ in records:
        if size > 0:
            made_in[ptr] = (rid, op)
        elif ptr in made_in:
            alloc_id, alloc_op = made_in.pop(ptr)
            if op is not None and op == alloc_op:
                scratch |= {alloc_id, rid}
    return [(size, step) for _, rid, size, _, _, step in records
            if keep_scratch or rid not in scratch]


def label(model, batch, checkpoint, precision, optimizer, accumulation, zero_grad, impl):
    prec = "bf16/torch-cpu" if precision == "bf16" else precision
    layers = "/ll-hf-eager" if llama_like(model) else ""
    return (f"{model}/b{batch}/a{accumulation}/ck{checkpoint}/{prec}/{optimizer}/{impl}/"
            f"zg-{zero_grad}{layers}")


def measure(binary, batch, combo, warmup, threads=None):
    """One row: memtrade's and PyTorch's whole-step peaks for one combination."""
    model, checkpoint, precision, optimizer, accumulation, zero_grad, impl = combo
    flags = point_flags(model, batch, checkpoint, precision, optimizer, accumulation, zero_grad,
                        impl)
    with tempfile.TemporaryDirectory() as tmp:
        mem, phase = memtrade_peak(binary, flags, tmp, warmup)
    point = memtrade_side.list_points(binary, flags)["points"][0]
    ref, in_step, out_step, every = torch_peak(point, impl, warmup, threads)
    n = point["config"]["hyper"].get("num_params")
    row = {"point": label(model, batch, *combo[1:]), "memtrade": mem, "pytorch": ref,
           "gap": mem - ref, "gap_rel": (mem - ref) / ref if ref else 0.0,
           "memtrade_peak_phase": phase, "num_params": n, "pytorch_2x": None,
           "pytorch_with_scratch": every}
    if impl == "foreach" and optimizer in EXTRA_LIST_113 and precision == "fp32" and n:
        # What 2.x's code would peak at: the optimizer step without 1.13's extra list.
        row["pytorch_2x"] = max(out_step, in_step - 4 * n)
    return row


def fmt(v):
    return f"{v:,}"


def markdown_table(rows):
    lines = ["| point | memtrade (B) | PyTorch 1.13 (B) | gap | memtrade's peak in | "
             "PyTorch with 2.x's foreach code (B) | gap | PyTorch, ops' scratch included (B) |",
             "|---|---:|---:|---:|---|---:|---:|---:|"]
    for r in rows:
        p2 = r.get("pytorch_2x")
        extra = (f"{fmt(p2)} | {100 * (r['memtrade'] - p2) / p2:+.2f}%" if p2 else "- | -")
        raw = r.get("pytorch_with_scratch")
        lines.append(f"| {r['point']} | {fmt(r['memtrade'])} | {fmt(r['pytorch'])} | "
                     f"{100 * r['gap_rel']:+.2f}% | {r['memtrade_peak_phase']} | {extra} | "
                     f"{fmt(raw) if raw is not None else '-'} |")
    return lines


def section_of(text):
    """The whole-step section of a page (its markers included), or None."""
    if BEGIN not in text or END not in text:
        return None
    return BEGIN + text.split(BEGIN, 1)[1].split(END, 1)[0] + END


INTRO = """## The whole step

The peak of live bytes above the step's start, through forward, backward and the optimizer step
(what `torch.cuda.max_memory_allocated()` shows after `reset_peak_memory_stats()`), once the
optimizer state exists: PyTorch 1.13 eager on the CPU (the twins of
`bench/peers/torch_models.py`, torch.profiler's allocator records; checkpoints without the CPU RNG
state they would stash, host memory on CUDA) against memtrade's traced step (requested bytes;
left out: the staged input batch, category `io`, since PyTorch's CPU twin reads the host batch
in place, as memtrade's first layer saves the staged batch in place; and on both sides each op's
own scratch: memtrade's category `workspace`, the CPU backend's fp32 staging of 16-bit GEMM
operands and convolution columns, and in PyTorch every block that one ATen op allocates and frees
before it returns: oneDNN's reorders, the bf16 convolution's im2col columns, the CPU batch-norm
backward's buffer; the last column is PyTorch's peak with that scratch, what its allocator saw).
Both run torch.optim's for-loop implementation (PyTorch's default on CPU tensors; memtrade
`--optimizer-impl forloop`) unless the point says foreach; for foreach Adam, AdamW and Adagrad
the last columns take out the one whole fp32 state that torch 1.13's `_multi_tensor_*` keeps and
2.x's (memtrade's transcription) does not, from PyTorch's peak inside `optimizer.step()`
(tests/python/test_optimizer_impl.py proves that difference exactly).

memtrade's backward holds what eager autograd holds where it decides these peaks: the loss
backward holds log_softmax + nll_loss backward's three (N, V) buffers; the GPT MLP frees each
saved tensor once the op that reads it has run its backward; a linear frees its saved weight
cast and its incoming gradient's cast before the weight's gradient goes through ToCopyBackward.
Every gpt-tiny, llama-tiny and mlp-tiny row at b8 is within 1%. The gaps left, by cause:
- mlp-tiny and cnn-tiny at b8: the first layer saves the staged batch in place; each MLP block
  applies its own ReLU's mask with its own output, as ReluBackward does, so that under
  checkpointing the previous block's output is freed before its recompute makes it again (mlp-tiny
  ck1 bf16 SGD with zero_grad(set_to_none=False): +4.06% while the next block masked it, now
  +0.08%); the CNN's backward runs autograd's nodes in its order (the shortcut's first), each op
  freeing its saved tensors and its incoming gradient once it has run, and (as the MLP's linears
  do) before its weight gradient's ToCopyBackward; the CNN's forward adds the shortcut into a new
  tensor, as eager does, which a recompute's peak holds;
- accumulation and zero_grad(set_to_none=False): eager computes each weight gradient into a
  fresh buffer that AccumulateGrad adds into the existing one (a later micro-batch, zeroed
  gradients, a tied weight's second use), and holds a tied head's gradient of wte in its input
  buffer until the embedding's arrives; memtrade holds the same buffers
  (`LayerCtx::accumulate_buffer`) while its ops add in place (without them gpt-tiny b1 × a2 was
  −6.39%, its PyTorch peak holding both 65,536 B buffers in the second micro-batch's
  mlp.c_proj backward, and mlp-tiny b1 × a2 SGD −36.05%);
- llama-tiny: the twin is HF's eager code, which memtrade models with `--llama-layers hf-eager`
  (the Llama section above; the point ids say `ll-hf-eager`); the rest, at most 4,124 B at b8,
  is the twin's own (cos and sin made per layer, where HF's LlamaModel makes them once, and a
  causal mask per layer) and the batch's int64 token ids. Under bf16 with checkpoint 1 or 0.5
  and zero_grad zero or accumulation 2 the peak is in the last block's recompute, where eager's
  CPU add copies its bf16 operand to fp32 inside the op (98,304 B at b8): op scratch, left out
  as above."""


def write_markdown(path, rows, command):
    """Replaces the whole-step section of `path` (between its markers) with the table."""
    worst = max(rows, key=lambda r: abs(r["gap_rel"]))
    within = sum(abs(r["gap_rel"]) <= 0.01 for r in rows)
    # Against the code memtrade transcribes: 2.x's foreach where the row has that column.
    def gap(r):
        return (r["memtrade"] - r["pytorch_2x"]) / r["pytorch_2x"] if r.get("pytorch_2x") \
            else r["gap_rel"]
    worst_2x = max(rows, key=lambda r: abs(gap(r)))
    within_2x = sum(abs(gap(r)) <= 0.01 for r in rows)
    n_2x = sum(bool(r.get("pytorch_2x")) for r in rows)
    body = [BEGIN, INTRO, "", f"Written by `{command}`.", ""] + markdown_table(rows) + [
        "", f"{within} of {len(rows)} rows within 1% of PyTorch 1.13's peak (worst: "
        f"{worst['point']}, {100 * worst['gap_rel']:+.2f}%); with the {n_2x} foreach rows "
        f"against 2.x's code, {within_2x} of {len(rows)} (worst: {worst_2x['point']}, "
        f"{100 * gap(worst_2x):+.2f}%).", END]
    path = pathlib.Path(path)
    text = path.read_text() if path.exists() else ""
    old = section_of(text)
    if old:
        text = text.replace(old, "\n".join(body))
    else:
        text = text.rstrip("\n") + "\n\n" + "\n".join(body) + "\n"
    path.write_text(text)


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--memtrade", required=True, help="the memtrade binary")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--checkpoints", default=",".join(CHECKPOINTS))
    ap.add_argument("--precisions", default=",".join(PRECISIONS))
    ap.add_argument("--optimizers", default=",".join(OPTIMIZERS))
    ap.add_argument("--accumulations", default=",".join(ACCUMULATIONS))
    ap.add_argument("--zero-grads", default=",".join(ZERO_GRADS))
    ap.add_argument("--impls", default="forloop", help="forloop and/or foreach")
    ap.add_argument("--foreach-rows", action="store_true",
                    help="also SGD and Adam, foreach and forloop, at b1 x a2 per model")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", help="write the rows as JSON")
    ap.add_argument("--markdown", help="replace the whole-step section of this Markdown file")
    return ap.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    split = lambda s: [v for v in s.split(",") if v]  # noqa: E731
    try:
        for impl in split(args.impls):
            if impl not in ("forloop", "foreach"):
                raise BadInput(f"--impls: {impl!r} has no CPU implementation in torch "
                               f"(forloop, foreach)")
        combos = list(itertools.product(split(args.models), split(args.checkpoints),
                                        split(args.precisions), split(args.optimizers),
                                        split(args.accumulations), split(args.zero_grads),
                                        split(args.impls)))
        runs = [(args.batch, c) for c in combos]
        if args.foreach_rows:
            runs += [(1, (m, "0", "fp32", o, "2", "set_to_none", impl))
                     for m in split(args.models) for o in ("sgd", "adam")
                     for impl in ("forloop", "foreach")]
        rows = []
        for batch, combo in runs:
            row = measure(args.memtrade, batch, combo, args.warmup, args.threads)
            rows.append(row)
            print(f"{row['point']:<72} {fmt(row['memtrade']):>13} {fmt(row['pytorch']):>13} "
                  f"{100 * row['gap_rel']:+7.2f}%  {row['memtrade_peak_phase']}", flush=True)
    except BadInput as e:
        print(f"whole_step.py: {e}", file=sys.stderr)
        return 2
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    if args.markdown:
        command = "bench/peers/whole_step.py " + " ".join(
            a for a in (argv if argv is not None else sys.argv[1:]))
        write_markdown(args.markdown, rows, command)
    return 0


if __name__ == "__main__":
    sys.exit(main())
