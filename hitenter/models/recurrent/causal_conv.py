"""The depthwise causal convolution the recurrent mixers share (LFM2's short convolution, Mamba2's and Gated
DeltaNet's conv), with its state, the last K - 1 input rows of the sequence (the "conv tail"): the one of
kernels/ssm_scan.py (its contract there), on the native kernel where it is built, else its torch reference,
which is the same bits (each row's window summed in tap order, products rounded then added)."""

from __future__ import annotations

from hitenter.kernels.ssm_scan import causal_conv

__all__ = ["causal_conv"]
