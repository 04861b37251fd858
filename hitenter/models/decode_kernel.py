"""The fused paged-attention kernel for generation rows (csrc/decode_attention.c), built on first use.

Why: the torch path (attention.py) gathers each sequence's K/V blocks into a contiguous copy and then
runs GEMMs on it, so a decode step reads the cache, writes the copy and reads it again; at 64
sequences x 300 tokens that is half of a bf16 decode step. The kernel reads the blocks in place.

Which rows: a row at position >= its request's prompt length - 1 (the last prompt token, every
generated token and every drafted token) is a *generation row* and goes to the kernel; prompt rows
stay on the GEMM path. The class of a row depends on its position only, never on the schedule, so a
row gets the same bits however prompts are chunked, batched, cached or recomputed after preemption
(attention.py's batch-invariance contract).

Build: `cc -O3 -march=native -fopenmp -shared` into $HITENTER_HOME/kernels (~/.cache/hitenter), keyed by the source, the flags and this CPU's flags; about a second, once per machine.
Where no C compiler is found, or HITENTER_DECODE_KERNEL=0, `load()` returns None and every row takes
the torch path (the whole engine then consistently uses it).
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import torch

from hitenter.models.registry import hitenter_home

log = logging.getLogger(__name__)

SOURCE = Path(__file__).resolve().parent / "csrc" / "decode_attention.c"
FLAGS = ["-O3", "-march=native", "-fopenmp", "-shared", "-fPIC"]
MAX_GROUP = 16      # query heads per KV head the kernel supports
MAX_HEAD_DIM = 256

_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_tried = False


def _cpu_key() -> str:
    try:
        flags = next((ln for ln in Path("/proc/cpuinfo").read_text().splitlines() if ln.startswith("flags")), "")
    except OSError:
        flags = ""
    return hashlib.sha256(flags.encode()).hexdigest()[:12]


def _build(cc: str) -> Path:
    src = SOURCE.read_bytes()
    key = hashlib.sha256(src + " ".join([cc] + FLAGS).encode() + _cpu_key().encode()).hexdigest()[:16]
    out = hitenter_home() / "kernels" / f"decode_attention-{key}.so"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)   # build aside, then rename: safe across processes
    os.close(fd)
    try:
        subprocess.run([cc, *FLAGS, "-o", tmp, str(SOURCE), "-lm"], check=True, capture_output=True, timeout=120)
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out


def load() -> ctypes.CDLL | None:
    """The compiled kernel library, or None (disabled, no compiler, or the build failed: logged once)."""
    global _lib, _tried
    with _lock:
        if _tried:
            return _lib
        _tried = True
        if os.environ.get("HITENTER_DECODE_KERNEL", "1") == "0":
            return None
        cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
        if cc is None:
            log.warning("no C compiler found: attention runs on the torch path only")
            return None
        try:
            lib = ctypes.CDLL(str(_build(cc)))
        except (OSError, subprocess.SubprocessError) as e:
            detail = getattr(e, "stderr", b"") or b""
            log.warning("decode attention kernel unavailable (%s): torch path only. %s", e, detail.decode()[-500:])
            return None
        p, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
        lib.decode_attention.restype = i32
        lib.decode_attention.argtypes = [p, p, p, i32, i64, p, p, p, i32, i32, i64, i32, i32, ctypes.c_float, i64,
                                         i32]
        _lib = lib
        return _lib


def supports(kv_cache_layer: torch.Tensor, num_heads: int, q_dtype: torch.dtype) -> bool:
    """True if the kernel is loaded and handles this cache (dtype, head_dim, GQA group) and query dtype."""
    _, kvh, _, _, d = kv_cache_layer.shape
    return (kv_cache_layer.dtype in (torch.float32, torch.bfloat16) and q_dtype == kv_cache_layer.dtype
            and kv_cache_layer.device.type == "cpu" and kv_cache_layer.is_contiguous()
            and d % 16 == 0 and d <= MAX_HEAD_DIM and num_heads % kvh == 0 and num_heads // kvh <= MAX_GROUP
            and load() is not None)


def decode_attention(q: torch.Tensor, kv_cache_layer: torch.Tensor, ctx_lens: torch.Tensor,
                     table_starts: torch.Tensor, tables: torch.Tensor, scale: float,
                     window: int | None = None) -> torch.Tensor:
    """Attention of rows q `[R, H, D]` (row r sees keys 0..ctx_lens[r]-1 of the blocks
    tables[table_starts[r]:], only the last `window` of them when given) against the paged cache;
    returns `[R, H, D]`. Check `supports` first.

    ctx_lens, table_starts, tables: int64 CPU tensors (kept alive by the caller during the call)."""
    lib = load()
    if lib is None:
        raise RuntimeError("decode attention kernel is not available")
    q = q.contiguous()
    r, h, d = q.shape
    _, kvh, nb, bs, _ = kv_cache_layer.shape
    out = torch.empty_like(q)
    rc = lib.decode_attention(q.data_ptr(), out.data_ptr(), kv_cache_layer.data_ptr(),
                              int(kv_cache_layer.dtype == torch.bfloat16), r, ctx_lens.data_ptr(),
                              table_starts.data_ptr(), tables.data_ptr(), h, kvh, nb, bs, d, scale,
                              int(window or 0), torch.get_num_threads())
    if rc != 0:
        raise ValueError(f"decode_attention: unsupported shape (heads {h}, kv heads {kvh}, head_dim {d})")
    return out
