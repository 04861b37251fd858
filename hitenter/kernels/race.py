"""The sampler's draws: greedy rows' argmax, and the exponential race (gpt-fast's sync-free sampling) with
counter-based draws for the sampling rows.

For a row of processed logits ``x`` (after temperature and the filters; cut tokens are ``-inf``):

    p = softmax(x)                      # the distribution to sample from
    u_i = (2 * (h_i >> 41) + 1) / 2**24    # h_i: output i of SplitMix64 seeded with the row's seed
    q_i = -log(u_i)                     # Exp(1), independent over i
    token = argmax_i p_i / q_i          # the race: token i wins with probability p_i

``P(argmax p_i / q_i = j) = p_j`` for independent Exp(1) ``q`` (the exponential race). The draws are
counter-based: ``u_i`` depends only on the seed and ``i``, so the native kernel makes each draw where
it uses it (no ``[rows, V]`` array of draws, which would cost several times the sampling
itself), and a trace recomputes the ``q`` of any candidate afterwards. ``u`` sits on the
odd multiples of 2**-24 in (0, 1) (exact in fp32), so ``q`` is finite and positive.

:func:`race_reference` states it in torch / numpy, and is the path without a C compiler (or with
``HITENTER_RACE_KERNEL=0``; slower, one warning). The kernel (``csrc/sampling/race.c``) uses its own log and exp
polynomials: tokens agree with the reference except where two candidates' scores tie to ~1e-6
(tested).
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

from hitenter.kernels.native import RACE

__all__ = ["race", "race_reference", "race_q", "race_uniforms"]

log = logging.getLogger(__name__)

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_C1, _C2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)



def greedy_argmax(x: Tensor) -> Tensor:
    """``x.argmax(dim=-1)`` of a CPU float32 tensor (the first maximum; NaN counts as the maximum, as in
    torch) by numpy's vectorized argmax, several times faster than torch's over a vocabulary's logits."""
    if x.dtype != torch.float32 or x.device.type != "cpu" or x.requires_grad or x.dim() == 0:
        return x.argmax(dim=-1)
    return torch.from_numpy(np.asarray(np.ascontiguousarray(x.numpy()).argmax(axis=-1)))


def race_uniforms(seed: int, ids: np.ndarray) -> np.ndarray:
    """fp32 ``u`` of the tokens ``ids`` for one row seed (SplitMix64 output ``i`` -> an odd multiple of
    2**-24)."""
    with np.errstate(over="ignore"):
        z = np.uint64(int(seed) % 2**64) + (np.asarray(ids, dtype=np.uint64) + np.uint64(1)) * _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * _C1
        z = (z ^ (z >> np.uint64(27))) * _C2
        z = z ^ (z >> np.uint64(31))
    k = (z >> np.uint64(41)).astype(np.int32)
    return (k * 2 + 1).astype(np.float32) * np.float32(2.0**-24)


def race_q(seed: int, ids: Sequence[int] | np.ndarray) -> np.ndarray:
    """The race's Exp(1) values ``q`` of the tokens ``ids`` for one row seed (fp32)."""
    return -np.log(race_uniforms(seed, np.asarray(ids, dtype=np.int64)))


def race_reference(x: Tensor, seeds: Sequence[int]) -> Tensor:
    """Tokens ``[n]`` (int64) of the race over the rows of ``x`` ``[n, V]``, in torch and numpy."""
    n, v = x.shape
    probs = torch.softmax(x.to(torch.float32), dim=-1)
    q = torch.from_numpy(np.stack([race_q(s, np.arange(v)) for s in seeds])) if n else torch.empty(0, v)
    return probs.div_(q).nan_to_num_(nan=-1.0).argmax(dim=-1)


# the compiled kernel (native.RACE), or None (HITENTER_RACE_KERNEL=0, no compiler, or a failed build:
# logged once; race() then runs the reference)
load = RACE


def race(x: Tensor, seeds: Sequence[int], num_threads: int | None = None) -> Tensor:
    """Tokens ``[n]`` (int64) of the race over the rows of ``x`` ``[n, V]`` fp32, row ``r`` drawn from
    ``seeds[r]`` (taken mod 2**64): the native kernel when built, else :func:`race_reference`."""
    n, v = x.shape
    if len(seeds) != n:
        raise ValueError(f"seeds: {len(seeds)} for {n} rows")
    lib = load()
    if lib is None or x.dtype != torch.float32 or x.stride(-1) != 1:
        return race_reference(x, seeds)
    tokens = torch.empty(n, dtype=torch.int64)
    s = (ctypes.c_uint64 * max(n, 1))(*[int(sd) % 2**64 for sd in seeds])
    lib.race_argmax(x.data_ptr(), n, v, x.stride(0), ctypes.addressof(s), tokens.data_ptr(),
                    num_threads or torch.get_num_threads())
    return tokens
