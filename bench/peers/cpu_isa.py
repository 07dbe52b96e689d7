"""What a CPU without AVX-512 runs, on one that has it: the one home of the emulation.

Each `--isa` level is an environment for memtrade's processes and one for PyTorch's
(ENV[isa] = (memtrade's, PyTorch's)); PyTorch's must be set before torch is imported:
- memtrade: MEMTRADE_ISA caps its vector loops and its own GEMM (`memtrade --version` names them);
- PyTorch: ATEN_CPU_CAPABILITY caps ATen's own vectorised kernels, DNNL_MAX_CPU_ISA oneDNN's JIT.

One more step is needed for 16-bit work. PyTorch 1.13 sends bf16 matmuls and convolutions to
oneDNN only where `mkldnn_bf16_device_check()` holds (ATen's native/mkldnn/Utils.h: the CPU has
AVX-512 BW, VL and DQ, read by cpuinfo from the CPU itself). A real AVX2 CPU fails that check, so
its bf16 GEMMs and convolutions run ATen's native kernels; an AVX-512 CPU capped by
DNNL_MAX_CPU_ISA passes it and oneDNN then refuses ("could not create a primitive descriptor
iterator"). `torch_lowp()` takes the real AVX2 CPU's route: oneDNN off for the 16-bit work it
wraps. Forward and backward both: the flag is read when each op runs, and the CPU's backward runs
on the calling thread. fp32 work keeps oneDNN (a real AVX2 CPU runs its fp32 convolutions there,
with `jit:avx2`).
"""
import contextlib
import os

ENV = {
    "native": ({}, {}),
    "avx2": ({"MEMTRADE_ISA": "avx2"}, {"ATEN_CPU_CAPABILITY": "avx2", "DNNL_MAX_CPU_ISA": "AVX2"}),
}
# OpenBLAS (memtrade's blas path, PyTorch's fp32 matmuls) picks its kernels by core type: on an
# AVX2 CPU, Haswell's. Where the environment does not pin it already, the avx2 level does, for
# both sides (an Intel AVX-512 core otherwise runs OpenBLAS's 512-bit SkylakeX kernels: measured
# 153 against 100 GFLOP/s on one core for gpt-small's 1024x8192x384).
if "OPENBLAS_CORETYPE" not in os.environ:
    for side in ENV["avx2"]:
        side["OPENBLAS_CORETYPE"] = "Haswell"

# oneDNN's ISA names (dnnl_cpu_isa_t, as DNNL_MAX_CPU_ISA spells them) below avx512_core: those
# of the CPUs that fail PyTorch's bf16 device check.
_BELOW_AVX512 = {"SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2"}


def torch_without_avx512():
    """True when this process's PyTorch is capped below AVX-512 (ATEN_CPU_CAPABILITY or
    DNNL_MAX_CPU_ISA), i.e. it emulates a CPU without it."""
    aten = os.environ.get("ATEN_CPU_CAPABILITY", "").lower()
    dnnl = os.environ.get("DNNL_MAX_CPU_ISA", "").upper()
    return aten in ("default", "avx2") or dnnl in _BELOW_AVX512


def describe():
    """What PyTorch's kernels are capped to, for tables and test messages."""
    if not torch_without_avx512():
        return "PyTorch: the CPU's own kernels"
    return (f"PyTorch: ATEN_CPU_CAPABILITY={os.environ.get('ATEN_CPU_CAPABILITY', '(unset)')}, "
            f"DNNL_MAX_CPU_ISA={os.environ.get('DNNL_MAX_CPU_ISA', '(unset)')}, "
            f"bf16 GEMMs and convolutions on ATen's native kernels")


def torch_lowp():
    """Around 16-bit PyTorch work (forward and backward): the kernels a CPU without AVX-512 runs
    it on. Nothing changes on a CPU that is not capped."""
    if not torch_without_avx512():
        return contextlib.nullcontext()
    import torch
    return torch.backends.mkldnn.flags(enabled=False)


def fp32_accumulating_gemms():
    """A torch dispatch mode under which every bf16/fp16 GEMM and convolution (forward and
    backward: mm, addmm, bmm, baddbmm, addbmm, convolution, convolution_backward) is computed from
    its 16-bit operands in fp32 and rounded to 16 bits once, at its output: what oneDNN's bf16
    kernels (AVX-512), cuBLAS and memtrade do on every CPU. Stock PyTorch 1.13 does so only on an
    AVX-512 CPU: elsewhere its native bf16 GEMM rounds more (measured: the gradients of gpt-tiny
    13-15·eps from fp64 on AVX2, 1-2·eps on AVX-512). Everything else (the casts autocast makes, the
    ops it leaves in 16 bits, their kernels) is stock PyTorch's. What remains CPU-dependent is of
    fp32's size (summation order), 2^-16 of a bf16 eps."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    aten = torch.ops.aten
    gemms = {aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default,
             aten.addbmm.default, aten.convolution.default, aten.convolution_backward.default}
    low = (torch.bfloat16, torch.float16)

    def widen(a):
        return a.float() if isinstance(a, torch.Tensor) and a.dtype in low else a

    class Fp32Accumulating(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            dtypes = {a.dtype for a in args if isinstance(a, torch.Tensor)} & set(low)
            if func not in gemms or not dtypes:
                return func(*args, **kwargs)
            (dtype,) = dtypes  # autocast casts every operand of one op to the same dtype
            out = func(*[widen(a) for a in args], **{k: widen(v) for k, v in kwargs.items()})
            if isinstance(out, tuple):  # convolution_backward: (dinput, dweight, dbias), some None
                return tuple(o.to(dtype) if isinstance(o, torch.Tensor) else o for o in out)
            return out.to(dtype)

    return Fp32Accumulating()
