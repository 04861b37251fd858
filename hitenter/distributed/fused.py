"""The fused native decode layer (models/fused_decode.py) on a tensor-parallel shard.

The C layer (kernels/csrc/layer/decode_layer.c) runs a whole layer and calls its matmuls through one function
pointer that `dl_init` sets. A TP group loads a second instance of that library (native.DECODE_LAYER's
"tp" instance: another file name, so its own pointer) and sets the pointer to `FusedCollectives.matmul`,
a ctypes callback: a projection whose descriptor is an ordinary kernel descriptor (Q/K/V, gate/up:
this rank's output rows; replicated experts) goes straight to the native kernel; the row-parallel
projections' descriptors are replaced (`wire`) by tokens that name a GatheredBlockLinear
(models/shard.py), whose forward all-gathers the ranks' inputs, runs this rank's output rows and all-gathers the outputs. Everything else in the layer
(norms, RoPE, the cache write, attention over this rank's heads, SiLU, residuals) is the C code TP=1
runs, on the same inputs, so the ranks' fused rows get TP=1's fused bits, not the torch layer's.

Every rank runs the same layers on the same rows in the same order, so the collectives inside the
callback line up. A failure inside the callback is logged and returned as a kernel error code (the
layer then raises, and the runner tears the group down).
"""

from __future__ import annotations

import ctypes
import logging
from typing import Any

import torch
from torch import nn

from hitenter.kernels.native import DECODE_ATTENTION, DECODE_LAYER, PROMPT_ATTENTION, QMATMUL
from hitenter.models.shard import GatheredBlockLinear

log = logging.getLogger(__name__)

QM_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                         ctypes.c_void_p, ctypes.c_int64, ctypes.c_int)
CALLBACK_FAILED = -70


def _floats(addr: int, n: int) -> torch.Tensor:
    return torch.frombuffer((ctypes.c_float * n).from_address(addr), dtype=torch.float32)


class FusedCollectives:
    """A fused-layer library instance whose matmuls go through this object (see the module doc)."""

    def __init__(self, lib: ctypes.CDLL, base: ctypes.CDLL, qm: int) -> None:
        self.lib, self.base = lib, base
        self.native = QM_FN(qm)
        self.tokens: dict[int, tuple[Any, GatheredBlockLinear]] = {}   # token address -> (buffer, module)
        self.callback = QM_FN(self.matmul)     # kept alive as long as the library points at it

    @classmethod
    def create(cls, base: ctypes.CDLL) -> FusedCollectives | None:
        """The instance for the current kernels (`base`: the process's own fused library, wired to them),
        or None (the instance cannot be built: one warning)."""
        qm, attn = QMATMUL.address("qm_matmul_desc"), DECODE_ATTENTION.address("decode_attention")
        lib = DECODE_LAYER.instance("tp") if qm and attn else None
        if lib is None:
            return None
        me = cls(lib, base, qm)
        lib.dl_init(ctypes.cast(me.callback, ctypes.c_void_p).value, attn)
        lib.dl_init_prompt(PROMPT_ATTENTION.address("prompt_attention"))   # prompt rows: the tiled kernel, as at TP=1
        return me

    def current(self, base: ctypes.CDLL) -> bool:
        """Whether this instance belongs to `base`, the process's fused library as now loaded (reloading it,
        or a kernel it calls, gives a new one)."""
        return self.base is base

    def wire(self, fused: Any, layer: nn.Module) -> None:
        """Replace the fused layer's row-parallel projections (o, down) by tokens for their modules."""
        for name, module in (("o", layer.o_proj), ("down", getattr(layer, "down", None))):
            if isinstance(module, GatheredBlockLinear):
                proj = getattr(fused.struct, name)
                if proj.nparts != 1:
                    raise ValueError("a row-parallel projection of more than one part")
                buf = ctypes.create_string_buffer(8)
                self.tokens[ctypes.addressof(buf)] = (buf, module)
                proj.desc[0] = ctypes.addressof(buf)

    def matmul(self, desc: int, x: int, m: int, ldx: int, y: int, ldy: int, nthreads: int) -> int:
        """The C layer's matmul: y `[m, N]` (row stride ldy) = x `[m, K]` (row stride ldx) @ W^T."""
        got = self.tokens.get(desc)
        if got is None:
            return self.native(desc, x, m, ldx, y, ldy, nthreads)
        module = got[1]
        try:
            k = module.in_counts[module.tp.rank]
            xt = _floats(x, m * ldx).view(m, ldx)[:, :k]
            out = module(xt)
            n = out.shape[1]
            _floats(y, m * ldy).view(m, ldy)[:, :n].copy_(out)
            return 0
        except BaseException:
            log.exception("tensor-parallel fused layer: a row-parallel projection failed")
            return CALLBACK_FAILED
