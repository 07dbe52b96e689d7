"""memtrade's optimizer_impl temporaries against torch.optim's own foreach and for-loop code.

memtrade transcribes the temporaries of torch 2.x's _multi_tensor_* (foreach) and
_single_tensor_* (forloop) update functions (models/train/optimizer.h). Both run on CPU tensors
in the torch 1.13 installed here, so each (model, optimizer, implementation) is measured there:
the parameters of memtrade's model (shapes and order from `memtrade step --dump`), a gradient
each, one step to create the state, then the second step under the profiler's memory events;
its peak of live bytes above the step's start against memtrade's `temporaries` peak in the
optimizer phase of a traced step.

torch 1.13's code differs from 2.x's in two places, both a whole state's worth of extra bytes
(N: every parameter's numel, fp32): its _multi_tensor_adam/_multi_tensor_adamw keep
`denom = _foreach_add(exp_avg_sq_sqrt, eps)` beside the square root (2.x adds eps in place), and
its _multi_tensor_adagrad computes `_foreach_div(_foreach_mul(grads, minus_clr), std)` with the
product alive (2.x keeps std and the numerator only). The test adds exactly that N for those
rows, so every row is an exact comparison.
"""
import json
import pathlib
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "bench" / "peers"))
import memtrade_side  # noqa: E402
import torch_models  # noqa: E402

# torch's own scalar tensors of a step (wrapped Python numbers, a few bytes each, and one
# 288-byte record: 292 B measured for plain SGD, which makes no temporaries); every other byte
# must match.
SCALAR_SLACK = 512
KINDS = ["sgd", "sgd-momentum", "adam", "adamw", "adagrad", "rmsprop"]
TORCH_113_EXTRA = {("adam", "foreach"), ("adamw", "foreach"), ("adagrad", "foreach")}


def memtrade_temporaries(binary, tmp, model, kind, impl):
    """Peak live `temporaries` bytes (requested) in the optimizer phase at the step's end."""
    flags = ["--backend", "cpu", "--model", model, "--batch-size", "2", "--optimizer", kind,
             "--optimizer-impl", impl]
    trace = tmp / "trace.json"
    memtrade_side.run(binary, ["run", *flags, "--warmup", "1", "--steps", "1", "--trace",
                               str(trace), "--out", str(tmp / "r.json")], "run --trace")
    events = json.loads(trace.read_text())["events"]
    last_backward = max(i for i, e in enumerate(events) if e.get("phase") == "backward")
    live = peak = 0
    for e in events[last_backward + 1:]:
        if e.get("category") != "temporaries" or e["kind"] not in ("alloc", "free"):
            continue
        live += e["requested"] if e["kind"] == "alloc" else -e["requested"]
        peak = max(peak, live)
    assert live == 0, "a temporary outlived the step"
    dump = tmp / "dump"
    memtrade_side.run(binary, ["step", *flags, "--dump", str(dump)], "step --dump")
    meta = json.loads((dump / "meta.json").read_text())
    return peak, meta


def torch_peak(meta, kind, impl):
    """Peak live bytes of torch's second optimizer step over memtrade's parameters."""
    from torch.profiler import ProfilerActivity, profile
    torch.manual_seed(0)
    # meta["params"]: the names in memtrade's order (the for-loop's peak depends on it)
    params = [torch.nn.Parameter(torch.randn(*meta["shapes"][n])) for n in meta["params"]]
    opt = torch_models.make_optimizer(meta["optimizer_hyper"], params,
                                      impl=impl)
    for p in params:
        p.grad = torch.randn_like(p)
    opt.step()  # the state
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        opt.step()
    live = peak = 0
    for e in prof.profiler.kineto_results.events():
        if e.name() == "[memory]":
            live += e.nbytes()
            peak = max(peak, live)
    return peak, sum(p.numel() for p in params)


@pytest.mark.parametrize("impl", ["foreach", "forloop"])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("model", ["gpt-tiny", "mlp-tiny", "cnn-tiny"])
def test_temporaries_as_torch_makes_them(memtrade_bin, tmp_path, model, kind, impl):
    torch.set_num_threads(1)
    mem, meta = memtrade_temporaries(memtrade_bin, tmp_path, model, kind, impl)
    peak, numel = torch_peak(meta, kind, impl)
    extra = 4 * numel if (kind, impl) in TORCH_113_EXTRA else 0
    assert mem + extra <= peak <= mem + extra + SCALAR_SLACK, (
        f"{model} {kind} {impl}: torch 1.13 peaks at {peak:,} B above the step's start, memtrade's "
        f"temporaries at {mem:,} B (+ {extra:,} B of torch 1.13's own extra list)")


def test_fused_makes_none(memtrade_bin, tmp_path):
    mem, _ = memtrade_temporaries(memtrade_bin, tmp_path, "gpt-tiny", "adam", "fused")
    assert mem == 0
