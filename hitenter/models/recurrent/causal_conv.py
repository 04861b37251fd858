"""The depthwise causal convolution of the recurrent mixers (LFM2's short convolution, Mamba2's conv over
x, B, C), as ggml_ssm_conv computes it, with its state: the last K - 1 input rows of the sequence (the
"conv tail").

For one sequence's span of n new rows x [n, C] and its tail [K - 1, C] (zeros at the sequence's start),
with the window u = [tail ; x] ([K - 1 + n, C]) and the taps w [C, K]:

    y[t, c] = sum over k = 0 .. K-1, in that order, of u[t + k, c] * w[c, k]

(w[:, K - 1] weighs the current row), and the tail becomes the window's last K - 1 rows. Bit invariance:
every op is elementwise over [n, C] in a fixed tap order, so a row's bits depend only on its own window,
never on n or on how a prompt was cut into spans (no F.conv1d, whose summation can change with n).
"""

from __future__ import annotations

import torch


def causal_conv(tail: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """y [n, C] (float32) for the span x [n, C] after `tail` [K - 1, C] (float32, updated in place to the
    last K - 1 rows of [tail ; x]); w [C, K] float32 (see the module docstring)."""
    n, k = x.shape[0], w.shape[1]
    u = torch.cat([tail, x.float()])
    y = u[0:n] * w[:, 0]
    for j in range(1, k):
        y = y + u[j:j + n] * w[:, j]
    tail.copy_(u[n:])
    return y
