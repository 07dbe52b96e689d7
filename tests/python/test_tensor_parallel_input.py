"""Tensor parallelism's bad input: one line on stderr and exit 2, naming what the split cannot
take, before any rank starts (`estimate` runs no MPI; `step` refuses the same way at config time).
The 2-rank runs themselves are in test_data_parallel.py and tests/mpi."""
import subprocess

import pytest

CASES = [
    # gpt-tiny has 4 heads: 3 ranks cannot share them
    (["--model", "gpt-tiny", "--tp", "3"], "n_head"),
    # the split is a decoder's
    (["--model", "mlp-tiny", "--tp", "2"], "tensor parallelism"),
    # Qwen3's per-head q/k norms: replicated weights whose gradients differ per rank
    (["--model", "llama-tiny:qk_norm=true", "--tp", "2"], "q/k norms"),
    # Phi-3's fused projections interleave what the split separates
    (["--model", "llama-tiny:fused_qkv=true,fused_gate_up=true", "--tp", "2"], "fused"),
    # sequence parallelism splits a micro-batch's tokens: 1 × 15 over 2 ranks
    (["--model", "gpt-tiny", "--tp", "2", "--sequence-parallel", "on", "--batch-size", "1",
      "--seq-len", "15"], "multiple"),
]


@pytest.mark.parametrize("args,needle", CASES, ids=[c[1] for c in CASES])
def test_a_split_the_model_cannot_take_is_one_line_and_exit_2(memtrade_bin, args, needle):
    r = subprocess.run([memtrade_bin, "estimate", *args], capture_output=True, text=True,
                       timeout=120)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, (r.returncode, r.stderr)
    assert needle in lines[0], lines[0]


def test_a_split_it_can_take_is_estimated(memtrade_bin):
    r = subprocess.run([memtrade_bin, "estimate", "--model", "llama-tiny", "--tp", "2",
                        "--sequence-parallel", "on"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
