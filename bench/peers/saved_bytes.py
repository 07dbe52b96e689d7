#!/usr/bin/env python3
"""What PyTorch keeps for backward vs memtrade's activations, at the end of forward.

    saved_bytes.py --dump DIR [--trace FILE]           (repeatable; paired in order)
    saved_bytes.py --trace FILE                        (config and hyper from the trace)
    saved_bytes.py --memtrade BIN --points gpt-mini:8:1,cnn-small:32:sqrt:bf16:torch-cpu,...
    common: [--autocast auto|none|cpu-bf16] [--profiler] [--no-mallinfo] [--breakdown]
            [--json OUT] [--threads N] [--keep DIR]

A point is a memtrade step dump (`memtrade step ... --dump DIR`: meta.json gives the model,
hyper-parameters, batch and checkpoint plan; inputs.npy the batch) and/or a trace of the same
point (`memtrade run ... --trace FILE`); --points MODEL:BATCH:CHECKPOINT[:PRECISION[:POLICY]]
makes both with BIN (CPU, SGD, one traced step; POLICY is the autocast policy of fp16/bf16,
torch-cuda by default). PyTorch's twin (torch_models) runs the point's batch
(the last micro-batch) with memtrade's checkpoint plan (non-reentrant torch checkpoint on
exactly memtrade's recomputed segments) and torch_saved measures what it keeps:

  torch (a)   saved-tensor hooks, unique storages, parameters/buffers excluded, plus the inputs
              of checkpointed segments (which the checkpoint keeps without a pack hook); all
              without the MLP's or CNN's input batch, which both sides save in place (memtrade
              its staged input, category io)
  hook-only   (a) without those checkpoint inputs (what a hook-only count reports)
  (b) malloc  glibc mallinfo2 delta over the forward, on (a)'s footing (+ saved batch - loss -
              weight casts); also counts graph nodes, malloc overhead, checkpoint RNG states
  (c) prof    torch.profiler c10 allocator net bytes over the forward, same footing (--profiler)
  w-casts     autocast's cached parameter casts saved for backward (excluded from the above)
  memtrade    `activations` bytes live in the trace at the last forward->backward phase change
              (memtrade_side.live_at_end_of_forward), as the tensors requested them
              (PyTorch's storages are exact sizes too); "rounded": as the allocator rounds them
  gap         memtrade - torch (a)
  m-casts     memtrade's `casts` bytes live then (requested), to hold against w-casts

--autocast auto: none for fp32/tf32 points, cpu-bf16 for bf16 points with the torch-cpu autocast
policy (the one PyTorch's CPU autocast follows; torch-cuda's lists differ and need a GPU). --breakdown prints every
saved storage of method (a) (kind, bytes, dtype, shape, layer, producing op).
Exit: 0 ok, 2 bad input.
"""
import argparse
import dataclasses
import json
import pathlib
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import memtrade_side  # noqa: E402
import torch  # noqa: E402
import torch_models  # noqa: E402
import torch_saved  # noqa: E402
import whole_step  # noqa: E402
from memtrade_side import BadInput  # noqa: E402

AUTOCAST_MODES = ("auto",) + torch_saved.AUTOCAST


@dataclasses.dataclass
class Point:
    config: dict      # memtrade's config (model, batch_size, accumulation, checkpoint, ...)
    hyper: dict
    resolved: dict    # what memtrade resolved (checkpoint_plan, ...): meta.json or run --list --json
    dump: pathlib.Path = None
    trace: dict = None

    @property
    def label(self):
        c = self.config
        policy = f"/{c.get('autocast_policy')}" if c["precision"] in ("fp16", "bf16") else ""
        return f"{c['model']}/b{c['batch_size']}/ck{c['checkpoint']}/{c['precision']}{policy}"

    def plan(self, n_blocks):
        """memtrade's checkpoint plan for the point: {"selective", "segments"}."""
        return memtrade_side.checkpoint_plan(self.resolved, n_blocks)


KEYS = ("model", "batch_size", "accumulation", "checkpoint", "precision", "autocast_policy")


def same(a, b):
    """Config values equal as memtrade means them (meta.json writes a checkpoint density as a
    number, a trace as a string)."""
    try:
        return float(a) == float(b)
    except (TypeError, ValueError):
        return str(a) == str(b)


def make_point(dump=None, trace_path=None, binary=None):
    meta = memtrade_side.load_meta(dump) if dump is not None else None
    trace = memtrade_side.read_trace(trace_path) if trace_path is not None else None
    config = dict(meta["config"] if meta is not None else trace["config"])
    hyper = meta["hyper"] if meta is not None else trace["config"]["hyper"]
    if meta is not None and trace is not None:
        tc = trace["config"]
        diff = [k for k in KEYS if not same(tc.get(k), config.get(k))]
        if diff:
            raise BadInput(f"{trace_path} is not a trace of {dump}: "
                           + ", ".join(f"{k} {tc.get(k)!r} vs {config.get(k)!r}" for k in diff))
    if config["mode"] != "train":
        raise BadInput(f"{dump or trace_path}: mode {config.get('mode')!r}: nothing is saved "
                       f"for backward outside training")
    if config["offload"] != "none":
        raise BadInput(f"{dump or trace_path}: offload {config.get('offload')!r} moves what is "
                       f"kept off the device; the twin has no offload (use --offload none)")
    if meta is not None:
        resolved = meta
    elif binary is not None:  # a trace alone: memtrade resolves its config again
        flags = memtrade_side.flags_of(config, memtrade_side.knob_table(binary))
        resolved = memtrade_side.list_points(binary, ["--backend", "cpu", *flags])["points"][0][
            "resolved"]
    else:
        raise BadInput(f"{trace_path}: a trace alone needs --memtrade BIN (the checkpoint plan "
                       f"comes from memtrade) or its --dump")
    return Point(config, hyper, resolved, pathlib.Path(dump) if dump else None, trace)


def points_from_spec(binary, spec, keep_dir):
    out = []
    for item in spec.split(","):
        f = item.split(":")
        if len(f) not in (3, 4, 5):
            raise BadInput(f"--points {item!r}: expected "
                           f"MODEL:BATCH:CHECKPOINT[:PRECISION[:POLICY]]")
        model, batch, ck = f[:3]
        precision = f[3] if len(f) >= 4 else "fp32"
        policy = f[4] if len(f) == 5 else "torch-cuda"
        d = keep_dir / item.replace(":", "_").replace("/", "_")
        d.mkdir(parents=True, exist_ok=True)
        flags = memtrade_side.knob_flags(model, batch, ck, precision, autocast_policy=policy)
        dump = memtrade_side.make_dump(binary, d / "dump", flags)
        trace = memtrade_side.make_trace(binary, d, flags)
        out.append(make_point(dump, trace, binary))
    return out


def autocast_for(point, mode):
    if mode != "auto":
        return mode
    precision = point.config["precision"]
    if precision in ("fp32", "tf32"):
        return "none"
    if precision == "bf16" and point.config.get("autocast_policy") == "torch-cpu":
        return "cpu-bf16"
    raise BadInput(f"{point.label}: no autocast twin for precision {precision!r} on the CPU "
                   f"(bf16 with --autocast-policy torch-cpu has one; or pass --autocast none "
                   f"or cpu-bf16)")


def measure_point(point, autocast, mallinfo=True, profiler=False):
    """One table row (a dict) and the per-storage breakdown of method (a)."""
    c = point.config
    family = torch_saved.family_of(point.hyper)
    if family not in ("gpt", "llama", "mlp", "cnn"):
        raise BadInput(f"{point.label}: no PyTorch twin for model family {family!r}")
    model = torch_saved.build_twin(point.hyper)
    plan = point.plan(len(torch_models.parts(model)[1]))
    x, t = torch_saved.make_batch(family, point.hyper, int(c["batch_size"]), point.dump)
    kept, rec = torch_saved.measure(model, plan, x, t, autocast,
                                    mallinfo=mallinfo, profiler=profiler)
    # The MLP's features and the CNN's images: both sides keep the batch itself where they keep
    # it (PyTorch's exists before the forward; memtrade's first layer saves its staged input,
    # category io, in place), so neither count has it. Token ids stay counted: memtrade's
    # embedding keeps an int32 copy of them.
    saved_x = rec.saved.get(torch_saved.storage_key(x)[0]) if x.is_floating_point() else None
    in_place = saved_x.nbytes if saved_x else 0
    ck_in_place = in_place if saved_x and saved_x.kind == "checkpoint_input" else 0
    minus = lambda v: None if v is None else v - in_place  # noqa: E731
    row = {"point": point.label, "autocast": autocast,
           "segments": plan["segments"], "torch_a": kept.hooks - in_place,
           "torch_hook_only": kept.hooks_only - (in_place - ck_in_place),
           "checkpoint_inputs": kept.checkpoint_inputs - ck_in_place,
           "saved_batch": kept.inputs, "input_in_place": in_place,
           "weight_casts": kept.weight_casts, "checkpoints": kept.checkpoints,
           "rng_states": kept.checkpoints * torch_saved.checkpoint_rng_state_bytes(),
           "mallinfo_raw": kept.mallinfo, "mallinfo": minus(kept.comparable(kept.mallinfo)),
           "profiler_raw": kept.profiler, "profiler": minus(kept.comparable(kept.profiler)),
           "memtrade": None, "memtrade_rounded": None, "gap": None, "gap_rel": None,
           "memtrade_casts": None}
    if point.trace is not None:
        m = memtrade_side.live_at_end_of_forward(point.trace)
        casts = memtrade_side.live_at_end_of_forward(point.trace, "casts")
        if m["requested"] is None or casts["requested"] is None:
            raise BadInput(f"{point.label}: the trace starts with activations or casts live: no "
                           f"requested-bytes count")
        row["memtrade"], row["memtrade_rounded"] = m["requested"], m["bytes"]
        row["memtrade_casts"] = casts["requested"]
        row["gap"] = m["requested"] - row["torch_a"]
        row["gap_rel"] = row["gap"] / row["torch_a"] if row["torch_a"] else None
    row["family"] = family
    row["eager_extra"] = llama_eager_extra(point.hyper, int(c["batch_size"]), plan, autocast)
    breakdown = [dataclasses.asdict(s) for s in rec.saved.values()]
    return row, breakdown


def llama_eager_extra(hyper, batch, plan, autocast):
    """Bytes the HF-style eager Llama (the twin) keeps that memtrade's Llama does not, per the
    per-layer accounting of docs/pytorch.md: each RMSNorm keeps x² and the normalised x besides x
    and rstd (2C per token; two per layer and the final norm), repeat_kv's expanded K and V
    (2·(NH − NKV)·hd), and SwiGLU's silu(gate) (I). Only for fp32 points with no block
    recomputed (elsewhere None): what the formula is stated for."""
    if hyper.get("family") != "llama" or autocast != "none" or plan["selective"] or \
            any(seg[2] for seg in plan["segments"]):
        return None
    C, I, L = hyper["n_embd"], hyper["intermediate_size"], hyper["n_layer"]
    nh, nkv, hd = hyper["n_head"], hyper["n_kv_head"], hyper["head_dim"]
    per_token = L * (4 * C + 2 * (nh - nkv) * hd + I) + 2 * C
    return 4 * batch * hyper["seq_len"] * per_token

def fmt(v):
    return "-" if v is None else f"{v:,}"


def print_table(rows, out=sys.stdout):
    cols = [("point", 34), ("autocast", 8), ("torch (a)", 13), ("hook-only", 13),
            ("ck inputs", 11), ("(b) malloc", 13), ("(c) prof", 13), ("w-casts", 11),
            ("memtrade", 13), ("rounded", 13), ("gap", 11), ("gap %", 7), ("m-casts", 11)]
    print(" ".join(f"{n:>{w}}" if i > 1 else f"{n:<{w}}" for i, (n, w) in enumerate(cols)),
          file=out)
    for r in rows:
        gap_pct = "-" if r["gap_rel"] is None else f"{100 * r['gap_rel']:+.2f}"
        vals = [r["point"], r["autocast"], fmt(r["torch_a"]), fmt(r["torch_hook_only"]),
                fmt(r["checkpoint_inputs"]), fmt(r["mallinfo"]), fmt(r["profiler"]),
                fmt(r["weight_casts"]), fmt(r["memtrade"]), fmt(r["memtrade_rounded"]),
                fmt(r["gap"]), gap_pct, fmt(r["memtrade_casts"])]
        print(" ".join(f"{v:>{w}}" if i > 1 else f"{v:<{w}}"
                       for i, (v, (_, w)) in enumerate(zip(vals, cols))), file=out)


def markdown_page(rows, cpu, torch_version):
    """docs/pytorch.md: the comparison as a page (make docs writes it). The example of a
    hook-only count's shortfall is a whole-block checkpoint (ck1) where there is one."""
    llama = [r for r in rows if r.get("family") == "llama"]
    rows = [r for r in rows if r.get("family") != "llama"]
    worst = max(rows, key=lambda r: abs(r["gap_rel"] or 0))
    big = max(rows, key=lambda r: ("/ck1/" in r["point"], r["checkpoint_inputs"]))
    out = ["# How memtrade's memory compares with PyTorch", "",
           "What each point keeps for backward at the end of forward, in memtrade (`activations` "
           "bytes live in an allocator trace, as the tensors requested them) and in PyTorch "
           f"{torch_version} (the nanoGPT/MLP/CNN twins of `bench/peers/torch_models.py` on the "
           "same batch, same checkpoint plan: saved-tensor hooks over unique storages, parameters "
           "excluded, plus the inputs a non-reentrant `torch.utils.checkpoint` keeps through its "
           "closure, which no hook sees; without the MLP's and CNN's input batch, which both "
           "keep in place: PyTorch's exists before the forward, memtrade's first layer saves "
           "its staged input, category `io`). Written by `bench/peers/saved_bytes.py --markdown` "
           f"on {cpu}; `tests/python/test_saved_bytes.py` holds every row within 1%.", "",
           "How each knob is done in PyTorch:", "",
           "- checkpoint `d`, `sqrt`: `torch.utils.checkpoint(..., use_reentrant=False)` around "
           "exactly memtrade's recomputed segments (meta.json `checkpoint_plan`);",
           "- checkpoint `selective`: Megatron's selective recompute — a checkpoint around the "
           "attention core (q, k, v → softmax(qkᵀ)·v) of every block; for the CNN around "
           "bn1 → relu → conv2 of every block;",
           "- precision `bf16` with `--autocast-policy torch-cpu`: `torch.autocast(\"cpu\", "
           "bfloat16)` (memtrade's default policy, torch-cuda, follows PyTorch's CUDA lists and "
           "needs a GPU to compare); autocast's cached 16-bit weight casts are counted apart "
           "(w-casts, against memtrade's `casts` category). `bf16-o2` (16-bit weights and "
           "activations with an fp32 master, Apex O2) has no PyTorch eager counterpart.", "",
           "| point | PyTorch kept (B) | of which checkpoint inputs | memtrade (B) | gap | "
           "weight casts PyTorch / memtrade |",
           "|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        out.append(f"| {r['point']} | {r['torch_a']:,} | {r['checkpoint_inputs']:,} | "
                   f"{r['memtrade']:,} | {100 * r['gap_rel']:+.2f}% | "
                   f"{r['weight_casts']:,} / {r['memtrade_casts']:,} |")
    out += ["", f"Worst row: {worst['point']}, {100 * worst['gap_rel']:+.2f}%. The remaining "
            "gap is what memtrade does not model: PyTorch's int64 token ids and targets, position "
            "ids, the causal mask, a scale scalar per block and nll_loss's total_weight (memtrade "
            "keeps int32 ids and a per-row loss vector instead).", "",
            "A hook-only count (saved-tensor hooks without the checkpoint inputs) reports less "
            f"under checkpointing — for {big['point']}, {big['torch_hook_only']:,} B instead of "
            f"{big['torch_a']:,} B — because non-reentrant checkpointing keeps each segment's "
            "input through its closure (torch/utils/checkpoint.py), where no pack hook sees it; "
            "glibc's allocation counters and torch.profiler's allocator records (`saved_bytes.py "
            "--profiler`) both confirm the larger figure.", ""]
    if llama:
        out += ["## Llama: fused kernels' layers, or HF's eager code's (`llama_layers`)", "",
                "memtrade's Llama layers keep, by default (`--llama-layers liger`), what fused "
                "implementations keep (Liger-Kernel-style fused RMSNorm and SwiGLU, RoPE applied "
                "in place, grouped-query attention without materialising repeated K/V, as "
                "FlashAttention-2 and SDPA with enable_gqa do). The HF-style eager twin "
                "(`bench/peers/torch_models.py`, torch 1.13, `repeat_kv` + math attention) keeps "
                "more, per layer and token: x² (kept by torch 1.13's mean) and the normalised x "
                "of each RMSNorm (2·C each, two norms per layer and the final one), the expanded "
                "K and V (2·(NH − NKV)·hd) and silu(gate) (I). The formula column is 4 B × B·T × "
                "(L·(4C + 2(NH − NKV)·hd + I) + 2C) for fp32 points with every block kept; the "
                "rest of the gap is the cos/sin tables, the mask, int64 token ids and the loss "
                "scalars. The table below is the default's.", "",
                "`--llama-layers hf-eager` keeps those too, op by op as HF transformers 4.46.3's "
                "eager modeling code allocates them, and frees each when autograd frees it "
                "(models/layers/{rmsnorm,attention,llama_mlp}.h); also the rotary tables cos and "
                "sin (once per forward for Llama, Qwen2 and Qwen3, per layer for Mistral, Phi-3 "
                "and Gemma 2), under bf16 autocast each projection's own input cast (autocast "
                "casts an op's inputs on every call: q_proj, k_proj and v_proj keep three bf16 "
                "copies of the norm's output, gate_proj and up_proj two) and, under selective "
                "checkpointing, the fp32 rotated q and k that the core's checkpoint keeps (HF's "
                "cos and sin are fp32, made once from the fp32 hidden states). The arithmetic is "
                "the fused ops', bit for bit. With it, the whole step's llama-tiny rows below "
                "are within 0.15% of PyTorch's, and the bytes kept at the end of forward are "
                "those of HF's own code (tests/python/test_hf_models.py, fp32, every dense "
                "Llama-like family) but for 212 B of int64 token ids and loss scalars.", "",
                "| point | PyTorch eager kept (B) | memtrade (B) | gap | formula |",
                "|---|---:|---:|---:|---:|"]
        for r in llama:
            f = "-" if r["eager_extra"] is None else f"{-r['eager_extra']:,}"
            out.append(f"| {r['point']} | {r['torch_a']:,} | {r['memtrade']:,} | "
                       f"{100 * r['gap_rel']:+.1f}% | {f} |")
        out.append("")
    return "\n".join(out)


def print_breakdown(label, autocast, breakdown, out=sys.stdout):
    print(f"\n{label} autocast={autocast}: storages kept for backward", file=out)
    for s in breakdown:
        src = f" <- {s['source']}" if s["source"] else ""
        print(f"  {s['kind']:<16} {s['nbytes']:>12,} {s['dtype']:<9} {str(s['shape']):<20} "
              f"{s['layer']:<34} {s['producer']}{src}", file=out)


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dump", action="append", default=[], help="memtrade step dump directory")
    ap.add_argument("--trace", action="append", default=[], help="memtrade trace (one point)")
    ap.add_argument("--memtrade", help="memtrade binary, to make dumps and traces (--points)")
    ap.add_argument("--points", help="MODEL:BATCH:CHECKPOINT[:PRECISION],... (needs --memtrade)")
    ap.add_argument("--keep", help="directory for the dumps and traces --points makes")
    ap.add_argument("--autocast", default="auto",
                    help="auto, none, cpu-bf16, or a comma list (one row per mode)")
    ap.add_argument("--profiler", action="store_true", help="also method (c)")
    ap.add_argument("--no-mallinfo", action="store_true", help="skip method (b)")
    ap.add_argument("--breakdown", action="store_true", help="print every saved storage")
    ap.add_argument("--json", help="write the rows (and breakdowns) here")
    ap.add_argument("--markdown", help="write the table as a docs page here (docs/pytorch.md)")
    ap.add_argument("--threads", type=int, default=1)
    return ap.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    try:
        modes = args.autocast.split(",")
        for m in modes:
            if m not in AUTOCAST_MODES:
                raise BadInput(f"--autocast {m!r}: expected one of {', '.join(AUTOCAST_MODES)}")
        if args.points and not args.memtrade:
            raise BadInput("--points needs --memtrade BIN")
        if args.dump and args.trace and len(args.dump) != len(args.trace):
            raise BadInput(f"{len(args.dump)} --dump but {len(args.trace)} --trace: they pair "
                           f"in order")
        if not (args.dump or args.trace or args.points):
            raise BadInput("nothing to compare: give --dump/--trace or --memtrade with --points")
        with tempfile.TemporaryDirectory() as tmp:
            points = [make_point(d, tr, args.memtrade) for d, tr in
                      zip(args.dump or [None] * len(args.trace),
                          args.trace or [None] * len(args.dump))]
            if args.points:
                keep = pathlib.Path(args.keep) if args.keep else pathlib.Path(tmp)
                points += points_from_spec(args.memtrade, args.points, keep)
            torch.set_num_threads(args.threads)
            rows, details = [], []
            for p in points:
                for mode in modes:
                    ac = autocast_for(p, mode)
                    row, breakdown = measure_point(p, ac, not args.no_mallinfo, args.profiler)
                    rows.append(row)
                    details.append({**row, "breakdown": breakdown})
    except BadInput as e:
        print(f"saved_bytes: {e}", file=sys.stderr)
        return 2
    print_table(rows)
    if args.breakdown:
        for d in details:
            print_breakdown(d["point"], d["autocast"], d["breakdown"])
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(details, indent=1) + "\n")
    if args.markdown:
        import platform
        cpu = next((l.split(":", 1)[1].strip() for l in
                    pathlib.Path("/proc/cpuinfo").read_text().splitlines()
                    if l.startswith("model name")), platform.processor() or "this machine")
        page = pathlib.Path(args.markdown)
        text = markdown_page(rows, cpu, torch.__version__)
        # The whole step's section (bench/peers/whole_step.py writes it) stays as it was.
        section = whole_step.section_of(page.read_text()) if page.exists() else None
        if section:
            text = text.rstrip("\n") + "\n\n" + section + "\n"
        page.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
