"""The whole step's peak against PyTorch eager's (bench/peers/whole_step.py), on a subset that
keeps `make test` short; the full table is `make whole-step` (docs/pytorch.md, "The whole step").

Issue 28 asks for every row within 1%. memtrade does not yet model what eager PyTorch holds
through backward (each op's input gradients and backward temporaries, AccumulateGrad's buffers,
checkpoint's recompute), so today's rows miss by a few percent (docs/pytorch.md names the worst
row). BOUND holds them where they are measured, so a change that moves them farther from
PyTorch fails here; tighten it as the backward is modelled.
"""
import pathlib
import sys

import pytest

torch = pytest.importorskip("torch")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "bench" / "peers"))
import whole_step  # noqa: E402

BOUND = {"ck0": 0.05, "ck1": 0.10}  # |gap| per checkpoint setting: measured, not the 1% goal
ROWS = []


@pytest.fixture(scope="module", autouse=True)
def table():
    yield
    if ROWS:
        print("\n" + "\n".join(whole_step.markdown_table(ROWS)))


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
@pytest.mark.parametrize("checkpoint", ["0", "1"])
@pytest.mark.parametrize("model", ["gpt-tiny", "mlp-tiny", "cnn-tiny"])
def test_whole_step_peak_near_pytorch(memtrade_bin, model, checkpoint, optimizer):
    row = whole_step.measure(memtrade_bin, 8, (model, checkpoint, "fp32", optimizer, "1",
                                               "set_to_none", "forloop"), warmup=1, threads=1)
    ROWS.append(row)
    assert abs(row["gap_rel"]) <= BOUND[f"ck{checkpoint}"], row


def test_foreach_adds_the_state_sized_temporary_where_the_step_peaks(memtrade_bin):
    """b1 × a2 on mlp-tiny: activations are small and the optimizer step is the peak, so Adam's
    foreach peak exceeds its for-loop peak by the square roots of every exp_avg_sq (2.x's code)
    minus the for-loop's largest (previous denom + sqrt + quotient); PyTorch 1.13 by one more
    whole state (its `denom` list)."""
    rows = {impl: whole_step.measure(memtrade_bin, 1, ("mlp-tiny", "0", "fp32", "adam", "2",
                                                       "set_to_none", impl), warmup=1, threads=1)
            for impl in ("forloop", "foreach")}
    assert rows["forloop"]["memtrade_peak_phase"] == "optimizer"
    assert rows["foreach"]["memtrade_peak_phase"] == "optimizer"
    mem = rows["foreach"]["memtrade"] - rows["forloop"]["memtrade"]
    ref = rows["foreach"]["pytorch"] - rows["forloop"]["pytorch"]
    n = rows["foreach"]["num_params"]
    assert mem > 0
    # torch's scalar tensors: a few hundred bytes (tests/python/test_optimizer_impl.py)
    assert abs(ref - mem - 4 * n) <= 512, (mem, ref, n)
