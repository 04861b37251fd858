"""y = x W^T on GGUF blocks: the native kernel where it loads, else the torch reference.

Contract (both paths): x fp32 `[M, K]` (rows contiguous; a row stride is allowed), w a BlockWeight
`[N, K]` -> fp32 `[M, N]` (or written into `out`). Batch invariance: a row's result never depends
on M, on the tiling or on the thread count (the native kernel fixes each output's reduction order;
the reference path is only used when the kernel is absent, for the whole process).

Native library (csrc/qmatmul/qmatmul.c): `native.QMATMUL`, built on first use and loaded once per process.
* HITENTER_QMATMUL=0: never load it (reference path, no warning).
* HITENTER_QMATMUL_ISA=auto|avx512|avx2|generic: force a variant (built with -mno-avx512f, ...), so
  the AVX2 and plain-C paths can be tested on an AVX-512 machine.
Threads: the kernel's OpenMP team uses torch.get_num_threads() threads, read on every call (libgomp
is shared with torch's, so no second thread pool). Zero-copy: x, w.data and `out` are read/written in
place through their data pointers; no alignment is required, only unit stride along K (x, w) and N
(out); `out` may be a column slice of a wider buffer (e.g. fused Q/K/V outputs). Paths: small M
streams each weight row once per 8 activation rows; from M = 6 (32-wide types) / 9 (K types; Q4_K on AVX2: 6) it packs 16
(AVX2: 8) weight rows at a time per call (a GEMM; all types with AVX512-VNNI, all but Q8_0 with AVX2,
whose microkernels add maddubs pairs in int16 before one madd by the scale: csrc/qmatmul/qm_pack_avx2.h);
a weight repacked at load (`repack`, csrc/qmatmul/qm_repack.h: Q4_0, Q4_1, Q8_0) runs one kernel for
every M; all give the same bits for a row.
Per call: the weight is described to the kernel once (a descriptor cached on the BlockWeight), so a
call costs a few attribute reads on x/out and one 7-argument ctypes call.
"""

from __future__ import annotations

import ctypes

import torch

from hitenter import envs
from hitenter.kernels.blocks import BlockWeight
from hitenter.kernels.native import QMATMUL
from hitenter.kernels.qm_kernels import QmKernels


def native_available() -> bool:
    """True when the compiled quantized-matmul library is loaded (one warning when it cannot)."""
    return QMATMUL() is not None


def native_isa() -> str | None:
    """Which variant is loaded: 'avx512vnni', 'avx2', 'generic', or None."""
    k = QMATMUL()
    return None if k is None else k.isa


def _check(x: torch.Tensor, w: BlockWeight, out: torch.Tensor | None) -> None:
    """Raise a clear error for anything the kernel (or the reference) cannot take. A few attribute reads:
    this runs on every decode-step matmul."""
    if not isinstance(w, BlockWeight):
        raise TypeError(f"qmatmul: w must be a BlockWeight, got {type(w).__name__}")
    if x.dtype is not torch.float32 or x.dim() != 2 or not x.is_cpu:
        raise ValueError(f"qmatmul: x must be a 2-D fp32 CPU tensor, got {x.dtype} {tuple(x.shape)} on {x.device}")
    if x.shape[1] != w.shape[1]:
        raise ValueError(f"qmatmul: x has K={x.shape[1]} but the {w.type_name} weight {w.shape} expects {w.shape[1]}")
    if out is not None and (out.dtype is not torch.float32 or out.shape != (x.shape[0], w.shape[0])):
        raise ValueError(f"qmatmul: out must be fp32 {(x.shape[0], w.shape[0])}, got {out.dtype} {tuple(out.shape)}")


def reference_qmatmul(x: torch.Tensor, w: BlockWeight) -> torch.Tensor:
    """Dequantize to fp32, then a plain matmul (slow; the kernels' test reference)."""
    return x.float() @ w.dequantize().t()


class _Desc:
    """A BlockWeight as the native call sees it, validated once and cached on the weight (`_qm_desc`):
    the C descriptor (pointer, N, K, row stride, type) in `buf`, passed by address. Stale (rebuilt)
    when the weight's data, shape or type object changes, or when the library is reloaded."""

    __slots__ = ("addr", "buf", "data", "fn", "gen", "k", "keep", "n", "qtype", "shape")

    def __init__(self, w: BlockWeight) -> None:
        kern: QmKernels | None = QMATMUL()
        self.data, self.shape, self.qtype, self.gen = w.data, w.shape, w.qtype, QMATMUL.generation
        self.n, self.k = w.shape
        self.addr, self.buf, self.keep, self.fn = 0, None, None, None
        if kern is None or w.qtype not in kern.supported or (w.lanes and w.lanes != kern.lanes):
            return   # reference path (a weight repacked by another library build also dequantizes)
        buf = ctypes.create_string_buffer(kern.desc_size)
        if w.lanes:
            data = w.data
            rc = kern.desc_init_repacked(buf, w.qtype, data.data_ptr(), self.n, self.k)
        else:
            data = w.data if w.data.stride(1) == 1 else w.data.contiguous()
            rc = kern.desc_init(buf, w.qtype, data.data_ptr(), self.n, self.k, data.stride(0))
        if rc != 0:
            raise RuntimeError(f"qmatmul: the native kernel refuses the {w.type_name} weight {w.shape} (code {rc})")
        self.buf, self.keep, self.addr, self.fn = buf, data, ctypes.addressof(buf), kern.matmul_desc

    def __reduce__(self) -> tuple:
        """Pickled/deep-copied as None (it holds raw addresses): the copy builds its own on first use."""
        return (type(None), ())


def _describe(w: BlockWeight) -> _Desc:
    """w's cached descriptor, rebuilt where it is stale (the weight changed, or the library was reloaded)."""
    d = getattr(w, "_qm_desc", None)
    if d is None or d.gen != QMATMUL.generation or d.data is not w.data or d.shape is not w.shape or d.qtype != w.qtype:
        if not isinstance(w, BlockWeight):
            raise TypeError(f"qmatmul: w must be a BlockWeight, got {type(w).__name__}")
        d = _Desc(w)
        w._qm_desc = d   # not a dataclass field: no effect on eq/repr/fields
    return d


def qmatmul(x: torch.Tensor, w: BlockWeight, out: torch.Tensor | None = None) -> torch.Tensor:
    """fp32 `[M, N]` = x `[M, K]` @ w^T (into `out` if given: fp32 `[M, N]`, rows contiguous).

    The weight is validated once and described to the kernel by a cached descriptor (`w._qm_desc`);
    each call checks only x and out (a few attribute reads: this runs on every decode-step matmul)."""
    d = getattr(w, "_qm_desc", None)
    if d is None or d.gen != QMATMUL.generation or d.data is not w.data or d.shape is not w.shape or d.qtype != w.qtype:
        d = _describe(w)   # the hot path above: a few attribute reads
    if not d.addr:
        _check(x, w, out)
        y = reference_qmatmul(x, w)
        return y if out is None else out.copy_(y)
    if x.dtype is not torch.float32 or x.ndim != 2 or not x.is_cpu:
        raise ValueError(f"qmatmul: x must be a 2-D fp32 CPU tensor, got {x.dtype} {tuple(x.shape)} on {x.device}")
    m, k = x.shape
    if k != d.k:
        raise ValueError(f"qmatmul: x has K={k} but the {w.type_name} weight {w.shape} expects {d.k}")
    sx = x.stride()
    if sx[1] != 1:
        x = x.contiguous()
        sx = x.stride()
    if out is None:
        out = torch.empty(m, d.n, dtype=torch.float32)
        ldy = d.n
    else:
        if out.dtype is not torch.float32 or out.shape != (m, d.n):
            raise ValueError(f"qmatmul: out must be fp32 {(m, d.n)}, got {out.dtype} {tuple(out.shape)}")
        sy = out.stride()
        if sy[1] != 1 and d.n > 1:
            raise ValueError("qmatmul: out rows must be contiguous (out.stride(1) == 1)")
        ldy = sy[0] if m > 1 else d.n     # a single row's stride(0) is arbitrary in torch
    rc = d.fn(d.addr, x.data_ptr(), m, sx[0] if m > 1 else k, out.data_ptr(), ldy, torch.get_num_threads())
    if rc != 0:
        raise RuntimeError(f"qmatmul: native kernel failed (code {rc}) on {w.type_name} {w.shape}, x {tuple(x.shape)}")
    return out


def repack_enabled() -> bool:
    """Whether weights get repacked at load: the native library repacks here and HITENTER_REPACK != 0."""
    kern: QmKernels | None = QMATMUL()
    return kern is not None and kern.lanes > 0 and envs.HITENTER_REPACK.get()


def repack_lanes() -> int:
    """Rows per group of a repacked weight in this build (0 where nothing is repacked)."""
    return int(QMATMUL().lanes) if repack_enabled() else 0


def repacked_nbytes(w: BlockWeight) -> int:
    """Bytes `w` takes repacked (csrc/qmatmul/qm_repack.h), 0 where it stays as the file's rows (its type is not
    repacked in this build, it already is, or repacking is off)."""
    if w.lanes or not repack_enabled():
        return 0
    return int(QMATMUL().repacked_bytes(w.qtype, w.shape[0], w.shape[1]))


def repack(w: BlockWeight, out: torch.Tensor) -> BlockWeight:
    """`w` repacked into `out` (uint8, 1-D, `repacked_nbytes(w)` bytes, e.g. a WeightArena slot): the same
    values, the same qmatmul bits, no per-call unpacking. Q4_0, Q4_1 and Q8_0."""
    n, k = w.shape
    want = repacked_nbytes(w)
    if not want:
        raise ValueError(f"repack: {w.type_name} {w.shape} is not repacked by this build")
    if out.dtype != torch.uint8 or out.dim() != 1 or out.numel() != want or not out.is_contiguous():
        raise ValueError(f"repack: out must be uint8 [{want}], got {out.dtype} {tuple(out.shape)}")
    kern: QmKernels = QMATMUL()
    data = w.data if w.data.stride(1) == 1 else w.data.contiguous()
    rc = kern.repack(w.qtype, data.data_ptr(), n, k, data.stride(0), out.data_ptr(), torch.get_num_threads())
    if rc != 0:
        raise RuntimeError(f"repack: native code {rc} on {w.type_name} {w.shape}")
    return BlockWeight(out, w.qtype, w.shape, kern.lanes)


def native_descriptor(w: BlockWeight) -> int:
    """Address of w's validated C descriptor (cached on w, valid for the current load of the library), 0
    when w takes the reference path. For native callers that run the kernel themselves (the fused decode
    layer, through native.QMATMUL.address("qm_matmul_desc"))."""
    return _describe(w).addr
