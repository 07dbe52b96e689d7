"""bench/peers/compare_cpu.py (`make peer`): bad input is exit 2, and a short run names what each
side's CPU kernels ran (--isa avx2 keeps both off AVX-512) next to a finite ratio."""
import json
import math
import subprocess
import sys

from conftest import ROOT

SCRIPT = ROOT / "bench" / "peers" / "compare_cpu.py"


def run(args):
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True)


def test_bad_points_and_isa_are_exit_2(memtrade_bin):
    r = run(["--memtrade", memtrade_bin, "--points", "gpt-tiny"])
    assert r.returncode == 2 and "MODEL:BATCH" in r.stderr
    r = run(["--memtrade", memtrade_bin, "--isa", "avx9"])
    assert r.returncode == 2


def cpu_flags():
    for line in open("/proc/cpuinfo"):
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


# What MEMTRADE_ISA=avx2 runs: memtrade's own AVX2 GEMM where the CPU has AVX2 with FMA.
AVX2_KERNELS = ("GEMM memtrade avx2, vector loops avx2" if {"avx2", "fma"} <= cpu_flags()
                else "GEMM BLAS, vector loops sse2")


def test_avx2_run_names_each_sides_kernels(memtrade_bin, tmp_path):
    out = tmp_path / "peer.json"
    r = run(["--memtrade", memtrade_bin, "--points", "gpt-tiny:2", "--rounds", "1", "--steps", "2",
             "--isa", "avx2", "--json", str(out)])
    assert r.returncode == 0, r.stderr
    assert f"--isa avx2: memtrade {AVX2_KERNELS}; PyTorch oneDNN ISA AVX2" in r.stdout
    doc = json.loads(out.read_text())
    assert doc["isa"] == "avx2" and doc["memtrade_kernels"] == AVX2_KERNELS
    (row,) = doc["rows"]
    assert row["model"] == "gpt-tiny" and row["batch"] == 2
    assert math.isfinite(row["ratio"]) and row["ratio"] > 0


def kernels(memtrade_bin, **env):
    """memtrade's CPU kernels under env alone (this process's own MEMTRADE_ISA and MEMTRADE_GEMM,
    as the ISA reruns of make test set them, are not inherited)."""
    import os
    base = {k: v for k, v in os.environ.items() if k not in ("MEMTRADE_ISA", "MEMTRADE_GEMM")}
    r = subprocess.run([memtrade_bin, "--version"], capture_output=True, text=True,
                       env=dict(base, **env))
    line = next(l for l in r.stdout.splitlines() if l.startswith("CPU kernels"))
    return line.split(None, 2)[2], r.stderr


def test_memtrade_isa_and_gemm_env_narrow_the_cpu_kernels(memtrade_bin):
    assert kernels(memtrade_bin, MEMTRADE_ISA="sse2")[0] == "GEMM BLAS, vector loops sse2"
    assert kernels(memtrade_bin, MEMTRADE_ISA="avx2")[0] == AVX2_KERNELS
    assert kernels(memtrade_bin, MEMTRADE_ISA="avx2", MEMTRADE_GEMM="blas")[0] == \
        "GEMM BLAS, vector loops avx2"
    line, err = kernels(memtrade_bin, MEMTRADE_ISA="avx9")
    assert "MEMTRADE_ISA=avx9 ignored (sse2, avx2 or avx512)" in err
    assert line == kernels(memtrade_bin)[0]  # the default: the CPU's best


def test_the_isa_caps_of_this_run_are_in_effect(memtrade_bin):
    """What the environment caps (the ISA rerun of make test sets MEMTRADE_ISA, ATEN_CPU_CAPABILITY
    and DNNL_MAX_CPU_ISA) is what runs: memtrade's kernels say so, and PyTorch's 16-bit work runs
    on the kernels of a CPU without AVX-512 (oneDNN, capped, would refuse it)."""
    import os
    import torch
    sys.path.insert(0, str(ROOT / "bench" / "peers"))
    import cpu_isa
    cap = os.environ.get("MEMTRADE_ISA")
    line = kernels(memtrade_bin, **({"MEMTRADE_ISA": cap} if cap else {}))[0]
    print(f"memtrade: {line}; {cpu_isa.describe()}")
    if cap == "avx2":
        assert line == AVX2_KERNELS
    if os.environ.get("DNNL_MAX_CPU_ISA", "").upper() == "AVX2":
        assert cpu_isa.torch_without_avx512()
    x = torch.randn(4, 8).bfloat16()
    with cpu_isa.torch_lowp():
        y = torch.nn.functional.linear(x, torch.randn(3, 8).bfloat16())
    assert y.dtype == torch.bfloat16 and y.shape == (4, 3)
