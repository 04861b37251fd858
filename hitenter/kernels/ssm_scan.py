"""The per-sequence recurrences of the Mamba2 and short-convolution mixers (models/recurrent/mamba2.py,
short_conv.py) over one sequence's span of n tokens, as llama.cpp's ggml_ssm_conv / ggml_ssm_scan compute
them.

`causal_conv(tail, x, w)`: the depthwise causal convolution. For the window u = [tail ; x] ([K - 1 + n, C];
the tail is zeros at the sequence's start) and the taps w [C, K] (w[:, K - 1] weighs the current row):
y[t, c] = sum over k = 0 .. K-1, in that order, of u[t + k, c] * w[c, k]; the tail becomes u's last
K - 1 rows (in place).

`mamba2_scan(state, x, dt, da, b, c)`: per token in order, per head h reading group g = h // (H / G):
S_h = S_h * da[h] + b_g (outer) (x_h * dt[h]);  y_h = c_g S_h  (state [H, N, P] in place; x [n, H, P],
dt, da [n, H], b, c [n, G, N]; returns y [n, H, P]).

The `*_reference` functions state them in torch with op shapes that never depend on n (each row's bits
depend only on its own window / the state before it, never on how a prompt was cut into spans: no
F.conv1d, whose summation can change with n). The public functions run the native kernel
(csrc/recurrent/ssm_scan.c, compiled -ffp-contract=off) where it is built, else the reference: the convolution and
the scan's state are bit-equal to the reference, the scan's y agrees to float rounding (its N-long sum in
index order), and either path alone gives a row the same bits however its sequence was cut.
"""

from __future__ import annotations

import torch
from torch import Tensor

from hitenter.kernels.native import SSM_SCAN

__all__ = ["causal_conv", "causal_conv_reference", "mamba2_scan", "mamba2_scan_reference"]

load = SSM_SCAN


def causal_conv_reference(tail: Tensor, x: Tensor, w: Tensor) -> Tensor:
    """y [n, C] float32 for the span x [n, C] after `tail` [K - 1, C] (float32, updated in place); w [C, K]."""
    n, k = x.shape[0], w.shape[1]
    u = torch.cat([tail, x.float()])
    y = u[0:n] * w[:, 0]
    for j in range(1, k):
        y = y + u[j:j + n] * w[:, j]
    tail.copy_(u[n:])
    return y


def causal_conv(tail: Tensor, x: Tensor, w: Tensor) -> Tensor:
    """causal_conv_reference's contract, on the native kernel where it is built."""
    lib = load()
    k = w.shape[1]
    if lib is None or not tail.is_contiguous() or tail.shape != (k - 1, x.shape[1]):
        return causal_conv_reference(tail, x, w)
    x, w = x.float().contiguous(), w.float().contiguous()
    y = torch.empty(x.shape, dtype=torch.float32)
    rc = lib.causal_conv(tail.data_ptr(), x.data_ptr(), w.data_ptr(), y.data_ptr(), x.shape[0], x.shape[1], k)
    if rc != 0:
        raise RuntimeError(f"causal_conv kernel failed ({rc})")
    return y


def mamba2_scan_reference(state: Tensor, x: Tensor, dt: Tensor, da: Tensor, b: Tensor, c: Tensor) -> Tensor:
    """y [n, H, P] of the span (module docstring); state [H, N, P] updated in place."""
    per = state.shape[0] // b.shape[1]
    b, c = b.repeat_interleave(per, dim=1), c.repeat_interleave(per, dim=1)
    s = state.clone()
    ys = []
    for i in range(x.shape[0]):
        xdt = x[i] * dt[i, :, None]
        s = s * da[i, :, None, None] + b[i, :, :, None] * xdt[:, None, :]
        ys.append((s * c[i, :, :, None]).sum(1))
    state.copy_(s)
    return torch.stack(ys) if ys else x.new_zeros(x.shape)


def mamba2_scan(state: Tensor, x: Tensor, dt: Tensor, da: Tensor, b: Tensor, c: Tensor,
                num_threads: int | None = None) -> Tensor:
    """mamba2_scan_reference's contract, on the native kernel where it is built (heads split over
    ``num_threads``, default torch's; a head's arithmetic is the same on any thread)."""
    lib = load()
    if lib is None or not state.is_contiguous():
        return mamba2_scan_reference(state, x, dt, da, b, c)
    h, n_state, p = state.shape
    x, dt, da, b, c = (t.float().contiguous() for t in (x, dt, da, b, c))
    y = torch.empty(x.shape, dtype=torch.float32)
    rc = lib.mamba2_scan(state.data_ptr(), x.data_ptr(), dt.data_ptr(), da.data_ptr(), b.data_ptr(), c.data_ptr(),
                         y.data_ptr(), x.shape[0], h, p, n_state, b.shape[1], num_threads or torch.get_num_threads())
    if rc != 0:
        raise RuntimeError(f"mamba2_scan kernel failed ({rc})")
    return y
