"""y = x W^T on GGUF blocks: the native kernel where it loads, else the torch reference.

Contract (both paths): x fp32 `[M, K]` (rows contiguous; a row stride is allowed), w a BlockWeight
`[N, K]` -> fp32 `[M, N]` (or written into `out`). Batch invariance: a row's result never depends
on M, on the tiling or on the thread count (the native kernel fixes each output's reduction order;
the reference path is only used when the kernel is absent, for the whole process).

Native library (csrc/qmatmul.c): built on first use (hitenter.kernels.build), loaded once per process.
* HITENTER_QMATMUL=0: never load it (reference path, no warning).
* HITENTER_QMATMUL_ISA=auto|avx512|avx2|generic: force a variant (built with -mno-avx512f, ...), so
  the AVX2 and plain-C paths can be tested on an AVX-512 machine.
Threads: the kernel's OpenMP team uses torch.get_num_threads() threads, read on every call (libgomp
is shared with torch's, so no second thread pool). Zero-copy: x, w.data and `out` are read/written in
place through their data pointers; no alignment is required, only unit stride along K (x, w) and N
(out); `out` may be a column slice of a wider buffer (e.g. fused Q/K/V outputs). Paths: small M
streams each weight row once per 8 activation rows; from M = 6 (32-wide types) / 9 (K types) it packs 16
(AVX2: 8) weight rows at a time per call (a GEMM; all types with AVX512-VNNI, all but Q8_0 with AVX2,
whose microkernels add maddubs pairs in int16 before one madd by the scale: csrc/qm_pack_avx2.h);
a weight repacked at load (`repack`, csrc/qm_repack.h: Q4_0, Q4_1, Q8_0 with VNNI) runs one kernel for
every M; all give the same bits for a row.
Per call: the weight is described to the kernel once (a descriptor cached on the BlockWeight), so a
call costs a few attribute reads on x/out and one 7-argument ctypes call (~3 us with a tiny kernel).
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
from pathlib import Path

import torch

from hitenter.kernels.blocks import BlockWeight
from hitenter.kernels.build import BuildError, load_library

log = logging.getLogger(__name__)

CSRC = Path(__file__).resolve().parent / "csrc"
ISA_FLAGS: dict[str, list[str]] = {
    "auto": [], "avx512": [], "avx2": ["-mno-avx512f"],
    "generic": ["-mno-avx512f", "-mno-avx2", "-DQM_GENERIC"],
}
ISA_NAMES = {0: "generic", 1: "avx2", 2: "avx512vnni"}
# -ffp-contract=off: fused multiply-adds only where the source asks, identically in every inlined copy
FLAGS = ["-ffp-contract=off"]

_lock = threading.Lock()
_fn: ctypes._CFuncPtr | None = None      # qm_matmul, None when not loaded
_fn_desc: ctypes._CFuncPtr | None = None  # qm_matmul_desc
_desc_init: ctypes._CFuncPtr | None = None
_desc_init_repacked: ctypes._CFuncPtr | None = None
_repack: ctypes._CFuncPtr | None = None
_repacked_bytes: ctypes._CFuncPtr | None = None
_desc_size = 0
_gen = 0                                   # bumped on every (re)load: descriptors of an older library are stale
_isa: str | None = None
_lanes = 0                                 # rows per repacked group in the loaded library (0: none)
_supported: frozenset[int] = frozenset()
_tried = False


def _load() -> None:
    global _fn, _fn_desc, _desc_init, _desc_size, _gen, _isa, _supported, _tried
    global _desc_init_repacked, _repack, _repacked_bytes, _lanes
    if _tried:
        return
    with _lock:
        if _tried:
            return
        try:
            if os.environ.get("HITENTER_QMATMUL", "1") == "0":
                log.info("HITENTER_QMATMUL=0: quantized matmuls use the torch reference path")
                return
            isa = os.environ.get("HITENTER_QMATMUL_ISA", "auto")
            if isa not in ISA_FLAGS:
                raise ValueError(f"HITENTER_QMATMUL_ISA={isa!r}: expected one of {sorted(ISA_FLAGS)}")
            try:
                lib = load_library(f"qmatmul-{isa}", CSRC / "qmatmul.c", FLAGS + ISA_FLAGS[isa],
                                   sorted(CSRC.glob("qm_*.h")))
            except BuildError as e:
                log.warning("native quantized matmul unavailable, using the slow torch reference path: %s", e)
                return
            p, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
            fn = lib.qm_matmul
            fn.restype = i32
            fn.argtypes = [i32, p, i64, i64, i64, p, i64, i64, p, i64, i32]
            _fn_desc = lib.qm_matmul_desc
            _fn_desc.restype = i32
            _fn_desc.argtypes = [p, p, i64, i64, p, i64, i32]
            _desc_init = lib.qm_desc_init
            _desc_init.restype = i32
            _desc_init.argtypes = [p, i32, p, i64, i64, i64]
            _desc_init_repacked = lib.qm_desc_init_repacked
            _desc_init_repacked.restype = i32
            _desc_init_repacked.argtypes = [p, i32, p, i64, i64]
            _repack = lib.qm_repack
            _repack.restype = i32
            _repack.argtypes = [i32, p, i64, i64, i64, p, i32]
            _repacked_bytes = lib.qm_repacked_bytes
            _repacked_bytes.restype = i64
            _repacked_bytes.argtypes = [i32, i64, i64]
            lib.qm_repack_lanes.restype = i32
            lib.qm_desc_size.restype = i64
            _desc_size = lib.qm_desc_size()
            lib.qm_isa.restype = i32
            lib.qm_supported.restype = i32
            lib.qm_supported.argtypes = [i32]
            _isa = ISA_NAMES[lib.qm_isa()]
            if isa == "avx512" and _isa != "avx512vnni":
                log.warning("HITENTER_QMATMUL_ISA=avx512 but this CPU/compiler gives %s", _isa)
            _supported = frozenset(t for t in range(64) if lib.qm_supported(t))
            _lanes = lib.qm_repack_lanes()
            _fn = fn
        finally:
            _gen += 1
            _tried = True


def native_available() -> bool:
    """True when the compiled quantized-matmul library is loaded (one warning when it cannot)."""
    _load()
    return _fn is not None


def native_isa() -> str | None:
    """Which variant is loaded: 'avx512vnni', 'avx2', 'generic', or None."""
    _load()
    return _isa


def _reset_for_tests() -> None:
    """Forget the loaded library so the next call re-reads the environment (tests only)."""
    global _fn, _fn_desc, _desc_init, _isa, _supported, _tried, _lanes
    with _lock:
        _fn, _fn_desc, _desc_init, _isa, _supported, _tried, _lanes = None, None, None, None, frozenset(), False, 0


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

    __slots__ = ("addr", "buf", "data", "gen", "k", "keep", "n", "qtype", "shape")

    def __init__(self, w: BlockWeight) -> None:
        self.data, self.shape, self.qtype, self.gen = w.data, w.shape, w.qtype, _gen
        self.n, self.k = w.shape
        self.addr, self.buf, self.keep = 0, None, None
        if _fn_desc is None or w.qtype not in _supported or (w.lanes and w.lanes != _lanes):
            return   # reference path (a weight repacked by another library build also dequantizes)
        buf = ctypes.create_string_buffer(_desc_size)
        if w.lanes:
            data = w.data
            rc = _desc_init_repacked(buf, w.qtype, data.data_ptr(), self.n, self.k)
        else:
            data = w.data if w.data.stride(1) == 1 else w.data.contiguous()
            rc = _desc_init(buf, w.qtype, data.data_ptr(), self.n, self.k, data.stride(0))
        if rc != 0:
            raise RuntimeError(f"qmatmul: the native kernel refuses the {w.type_name} weight {w.shape} (code {rc})")
        self.buf, self.keep, self.addr = buf, data, ctypes.addressof(buf)

    def __reduce__(self) -> tuple:
        """Pickled/deep-copied as None (it holds raw addresses): the copy builds its own on first use."""
        return (type(None), ())


def _describe(w: BlockWeight) -> _Desc:
    if not isinstance(w, BlockWeight):
        raise TypeError(f"qmatmul: w must be a BlockWeight, got {type(w).__name__}")
    d = _Desc(w)
    w._qm_desc = d   # not a dataclass field: no effect on eq/repr/fields
    return d


def qmatmul(x: torch.Tensor, w: BlockWeight, out: torch.Tensor | None = None) -> torch.Tensor:
    """fp32 `[M, N]` = x `[M, K]` @ w^T (into `out` if given: fp32 `[M, N]`, rows contiguous).

    The weight is validated once and described to the kernel by a cached descriptor (`w._qm_desc`);
    each call checks only x and out (a few attribute reads: this runs on every decode-step matmul)."""
    if not _tried:
        _load()
    d = getattr(w, "_qm_desc", None)
    if d is None or d.gen != _gen or d.data is not w.data or d.shape is not w.shape or d.qtype != w.qtype:
        d = _describe(w)
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
    rc = _fn_desc(d.addr, x.data_ptr(), m, sx[0] if m > 1 else k, out.data_ptr(), ldy, torch.get_num_threads())
    if rc != 0:
        raise RuntimeError(f"qmatmul: native kernel failed (code {rc}) on {w.type_name} {w.shape}, x {tuple(x.shape)}")
    return out


def repack_enabled() -> bool:
    """Whether weights get repacked at load: the native library repacks here and HITENTER_REPACK != 0."""
    _load()
    return _lanes > 0 and os.environ.get("HITENTER_REPACK", "1") != "0"


def repacked_nbytes(w: BlockWeight) -> int:
    """Bytes `w` takes repacked (csrc/qm_repack.h), 0 where it stays as the file's rows (its type is not
    repacked in this build, it already is, or repacking is off)."""
    if w.lanes or not repack_enabled() or _repacked_bytes is None:
        return 0
    return int(_repacked_bytes(w.qtype, w.shape[0], w.shape[1]))


def repack(w: BlockWeight, out: torch.Tensor) -> BlockWeight:
    """`w` repacked into `out` (uint8, 1-D, `repacked_nbytes(w)` bytes, e.g. a WeightArena slot): the same
    values, the same qmatmul bits, no per-call unpacking. Q4_0, Q4_1 (and Q8_0 with AVX512-VNNI)."""
    n, k = w.shape
    want = repacked_nbytes(w)
    if not want or _repack is None:
        raise ValueError(f"repack: {w.type_name} {w.shape} is not repacked by this build")
    if out.dtype != torch.uint8 or out.dim() != 1 or out.numel() != want or not out.is_contiguous():
        raise ValueError(f"repack: out must be uint8 [{want}], got {out.dtype} {tuple(out.shape)}")
    data = w.data if w.data.stride(1) == 1 else w.data.contiguous()
    rc = _repack(w.qtype, data.data_ptr(), n, k, data.stride(0), out.data_ptr(), torch.get_num_threads())
    if rc != 0:
        raise RuntimeError(f"repack: native code {rc} on {w.type_name} {w.shape}")
    return BlockWeight(out, w.qtype, w.shape, _lanes)


def native_entry() -> tuple[int, int]:
    """(address of the C function qm_matmul_desc, library generation) for native callers that run the
    kernel themselves (the fused decode layer); (0, generation) when the library is not loaded."""
    _load()
    return (ctypes.cast(_fn_desc, ctypes.c_void_p).value or 0 if _fn_desc is not None else 0), _gen


def native_descriptor(w: BlockWeight) -> int:
    """Address of w's validated C descriptor (cached on w, valid for the current generation), 0 when w
    takes the reference path."""
    if not _tried:
        _load()
    d = getattr(w, "_qm_desc", None)
    if d is None or d.gen != _gen or d.data is not w.data or d.shape is not w.shape or d.qtype != w.qtype:
        d = _describe(w)
    return d.addr
