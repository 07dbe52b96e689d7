"""The whole step's peak against PyTorch eager's (bench/peers/whole_step.py), on a subset that
keeps `make test` short; the full table is `make whole-step` (docs/pytorch.md, "The whole step").

Issue 28 asks for every row within 1%. These are: the loss backward holds eager's three (N, V)
buffers, the GPT MLP and the CNN's convolutions and batch norms free each saved tensor once the
op that reads it has run its backward, the first layer of the MLP and the CNN saves the staged
batch in place, and both sides leave out each op's own scratch (PyTorch's blocks allocated and
freed inside one ATen op, memtrade's `workspace`). RECORDED holds each row's gap as measured (AMD
EPYC Zen 5, torch 1.13): a change to either side's memory moves it and fails here, and is
recorded again on purpose (as the baselines are), with the goal of 0 for every row.
"""
import pathlib
import sys

import pytest

torch = pytest.importorskip("torch")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "bench" / "peers"))
import whole_step  # noqa: E402

# (model, checkpoint, optimizer) -> memtrade's gap to PyTorch, % of PyTorch's peak.
RECORDED = {
    ("gpt-tiny", "0", "sgd"): +0.02, ("gpt-tiny", "0", "adam"): +0.02,
    ("gpt-tiny", "1", "sgd"): +0.04, ("gpt-tiny", "1", "adam"): +0.04,
    ("mlp-tiny", "0", "sgd"): +0.07, ("mlp-tiny", "0", "adam"): -0.01,
    ("mlp-tiny", "1", "sgd"): +0.07, ("mlp-tiny", "1", "adam"): -0.01,
    ("cnn-tiny", "0", "sgd"): +0.07, ("cnn-tiny", "0", "adam"): +0.07,
    ("cnn-tiny", "1", "sgd"): +0.00, ("cnn-tiny", "1", "adam"): +0.00,
    # --llama-layers hf-eager (whole_step.point_flags): the rest is the twin's own (rotary tables
    # per layer where HF's LlamaModel makes them once, a causal mask per layer) and int64 ids.
    ("llama-tiny", "0", "sgd"): -0.07, ("llama-tiny", "0", "adam"): -0.07,
    ("llama-tiny", "1", "sgd"): +0.04, ("llama-tiny", "1", "adam"): +0.04,
    ("llama-tiny", "0", "sgd", "bf16"): -0.08, ("llama-tiny", "selective", "sgd", "bf16"): -0.03,
}
TOLERANCE = 0.1  # percentage points: both sides are deterministic; this absorbs rounding only
ROWS = []


@pytest.fixture(scope="module", autouse=True)
def table():
    yield
    if ROWS:
        print("\n" + "\n".join(whole_step.markdown_table(ROWS)))


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
@pytest.mark.parametrize("checkpoint", ["0", "1"])
@pytest.mark.parametrize("model", ["gpt-tiny", "llama-tiny", "mlp-tiny", "cnn-tiny"])
def test_whole_step_peak_near_pytorch(memtrade_bin, model, checkpoint, optimizer):
    check_row(memtrade_bin, (model, checkpoint, optimizer), "fp32")


@pytest.mark.parametrize("checkpoint", ["0", "selective"])
def test_llama_bf16_autocast(memtrade_bin, checkpoint):
    """HF's eager layers under torch.autocast("cpu", bfloat16): each projection's own input cast,
    and under selective checkpointing the fp32 rotated q and k that the core's checkpoint keeps."""
    check_row(memtrade_bin, ("llama-tiny", checkpoint, "sgd", "bf16"), "bf16")


def check_row(memtrade_bin, key, precision):
    model, checkpoint, optimizer = key[:3]
    row = whole_step.measure(memtrade_bin, 8, (model, checkpoint, precision, optimizer, "1",
                                               "set_to_none", "forloop"), warmup=1, threads=1)
    ROWS.append(row)
    recorded = RECORDED[key]
    assert abs(100 * row["gap_rel"] - recorded) <= TOLERANCE, (
        f"{row['point']}: memtrade {row['memtrade']:,} B, PyTorch {row['pytorch']:,} B, gap "
        f"{100 * row['gap_rel']:+.2f}% (recorded {recorded:+.2f}%)")


# Gradients added into existing ones (LayerCtx::accumulate_buffer): eager computes each weight
# gradient into a fresh buffer that AccumulateGrad adds in, and holds a tied head's gradient of wte
# until the embedding's arrives. (model, batch, accumulation, zero_grad) -> recorded gap, %.
# Before memtrade held those buffers: gpt-tiny b1 a2 -6.39%, mlp-tiny b1 a2 -36.05%.
ACCUMULATION_RECORDED = {
    ("gpt-tiny", 1, "2", "set_to_none"): -0.22,  # the tied head's gradient held (65,536 B)
    ("gpt-tiny", 8, "1", "zero"): +0.02,
    ("mlp-tiny", 1, "2", "set_to_none"): -0.02,  # +0.27 while the stem copied the batch
}


@pytest.mark.parametrize("model,batch,accumulation,zero_grad", list(ACCUMULATION_RECORDED))
def test_accumulating_gradients_hold_eagers_buffers(memtrade_bin, model, batch, accumulation,
                                                    zero_grad):
    row = whole_step.measure(memtrade_bin, batch, (model, "0", "fp32", "sgd", accumulation,
                                                   zero_grad, "forloop"), warmup=1, threads=1)
    ROWS.append(row)
    recorded = ACCUMULATION_RECORDED[(model, batch, accumulation, zero_grad)]
    assert abs(100 * row["gap_rel"] - recorded) <= TOLERANCE, (
        f"{row['point']}: memtrade {row['memtrade']:,} B, PyTorch {row['pytorch']:,} B, gap "
        f"{100 * row['gap_rel']:+.2f}% (recorded {recorded:+.2f}%)")


def test_mlp_block_masks_its_own_relu(memtrade_bin):
    """Each MLP block applies its own ReLU's mask with its own output, as autograd's ReluBackward
    does (models/families/mlp.h): under checkpoint 1 the previous block's output is freed once
    the next block's linear backward has run, and its recompute makes it again. Under bf16 with
    zero_grad(set_to_none=False) the peak is there: +4.06% (1,044 B) while the next block held
    that output for the mask; now +0.08% (20 B, as in every mlp-tiny row at b8)."""
    row = whole_step.measure(memtrade_bin, 8, ("mlp-tiny", "1", "bf16", "sgd", "1", "zero",
                                               "forloop"), warmup=1, threads=1)
    ROWS.append(row)
    assert abs(100 * row["gap_rel"] - 0.08) <= TOLERANCE, (
        f"{row['point']}: memtrade {row['memtrade']:,} B, PyTorch {row['pytorch']:,} B, gap "
        f"{100 * row['gap_rel']:+.2f}% (recorded +0.08%)")


def test_foreach_adds_the_state_sized_temporary_where_the_step_peaks(memtrade_bin):
    """b1 × a2 on mlp-tiny: activations are small and the optimizer step is the peak on both
    sides, so foreach's peak minus the for-loop's is the square roots of every exp_avg_sq (2.x's
    code) minus the for-loop's largest (previous denom + sqrt + quotient) in memtrade, and in
    PyTorch 1.13 exactly one whole fp32 state more (its `denom` list): the optimizer step's
    temporaries, seen through the whole step on both sides."""
    rows = {impl: whole_step.measure(memtrade_bin, 1, ("mlp-tiny", "0", "fp32", "adam", "2",
                                                       "set_to_none", impl), warmup=1, threads=1)
            for impl in ("forloop", "foreach")}
    assert rows["forloop"]["memtrade_peak_phase"] == "optimizer"
    assert rows["foreach"]["memtrade_peak_phase"] == "optimizer"
    mem = rows["foreach"]["memtrade"] - rows["forloop"]["memtrade"]
    ref = rows["foreach"]["pytorch"] - rows["forloop"]["pytorch"]
    n = rows["foreach"]["num_params"]
    # torch's scalar tensors: a few hundred bytes (tests/python/test_optimizer_impl.py)
    assert abs(ref - mem - 4 * n) <= 512, (mem, ref, n)
