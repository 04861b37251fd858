"""The kernel plan: which numeric path every row takes, decided once at load and printed once.

Five inputs decide it (the packed-vs-plain GEMM probe in linear.py, the attention row padding probe
in row_invariance.py, the fused attention kernel check, the ``batch_invariant`` flag, the decode
attention library's status), all read here, once, at load, from the CPU (probes), the weights (which
linear layers are dense) and the options, into one frozen ``KernelPlan`` the engine holds
(``LLMEngine.plan``) and the runner consults each step (the attention kernel decision travels to every
layer in ``AttentionMetadata.use_kernel``: no per-layer re-check).

``hitenter plan --model X`` prints it; the engine logs it at INFO when it starts.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hitenter.kernels.native import DECODE_ATTENTION
from hitenter.models import decode_kernel
from hitenter.models.attention import KEY_TILE, ROW_MULTIPLE
from hitenter.models.kv_dtype import TORCH_KV_DTYPES, cache_head_dim, kv_dtype_name


@dataclass(frozen=True)
class KernelPlan:
    dtype: str                    # compute dtype of the dense weights (activations)
    dense_gemm: str               # "packed" (oneDNN, packed at load) | "plain" (F.linear) | "none" (no dense linears)
    dense_gemm_why: str
    row_multiple: int             # dense GEMM rows padded to this multiple (1: no padding)
    attention_row_multiple: int   # attention's GEMM query rows padded to this multiple
    attention_kernel: bool        # generation rows take the fused paged kernel (csrc/attention/decode_attention.c)
    attention_kernel_why: str
    batch_invariant: bool         # the option as asked
    quant_kernel: str = "none"    # the native quantized-matmul kernel (hitenter/kernels): its ISA, or "none"
    fused_decode: str = "off"     # generation rows through the fused native layers (models/fused_decode.py)
    fused_prompt_max: int = 0     # prompts up to this many tokens run every row fused too (0: none)
    kv_cache_dtype: str = "float32"   # the KV cache's elements (models/kv_dtype.py); "none" without a local cache
    kv_bytes_per_token: int = 0       # K and V of one token over all layers, in those elements (q8_0: its blocks)

    def describe(self) -> str:
        return "\n".join([
            f"dtype              {self.dtype}",
            f"KV cache dtype     {self.kv_cache_dtype} ({self.kv_bytes_per_token} bytes per token)",
            f"dense GEMM         {self.dense_gemm} ({self.dense_gemm_why})",
            f"row padding        {self.row_multiple} (batch_invariant={self.batch_invariant})",
            f"attention padding  {self.attention_row_multiple}",
            f"attention kernel   {'on' if self.attention_kernel else 'off'} ({self.attention_kernel_why})",
            f"quant kernel       {self.quant_kernel}",
            f"fused decode       {self.fused_decode}",
            ("fused prompts      every length" if self.fused_prompt_max >= ANY_LENGTH else
             f"fused prompts      up to {self.fused_prompt_max} tokens" if self.fused_prompt_max else "fused prompts      none"),
        ])


def _attention_kernel(kv_cache_layer: torch.Tensor | None, num_heads: int, dtype: torch.dtype) -> tuple[bool, str]:
    if kv_cache_layer is None:
        return False, "no local KV cache (the workers hold it)"
    if decode_kernel.load() is None:   # off by its variable, or not built (no compiler, a failed build)
        status = DECODE_ATTENTION.status
        return False, (f"{DECODE_ATTENTION.env}=0" if status.startswith("off") else
                       f"not built ({status})" if status.startswith(("failed", "needs")) else "not loaded")
    if not decode_kernel.supports(kv_cache_layer, num_heads, dtype):
        kvh, d = kv_cache_layer.shape[1], cache_head_dim(kv_cache_layer)
        return False, f"unsupported shape or dtype (head_dim {d}, {num_heads} heads / {kvh} KV heads, {dtype})"
    return True, "generation rows read the paged cache in place"


def _dense_gemm(model: torch.nn.Module, dtype: torch.dtype) -> tuple[str, str]:
    from hitenter.models.linear import Linear, packed_rows_invariant

    dense = [m for m in model.modules() if isinstance(m, Linear)]
    if not dense:
        return "none", "no dense linear layers"
    packed = sum(m.packed is not None for m in dense)
    if packed == len(dense):
        return "packed", f"oneDNN packed GEMM, {dtype} rows invariant at multiples of {ROW_MULTIPLE}"
    if packed == 0:
        return "plain", ("F.linear: oneDNN's packed GEMM is unavailable or not row invariant here"
                         if not packed_rows_invariant(dtype) else "F.linear")
    return "mixed", f"{packed} of {len(dense)} layers packed"


def build_plan(model: torch.nn.Module, kv_caches: list[torch.Tensor], dtype: torch.dtype,
               batch_invariant: bool) -> KernelPlan:
    """The plan of a loaded model (probes are cached per dtype: computed once per process)."""
    cfg = getattr(model, "config", None)
    dense, why = _dense_gemm(model, dtype)
    if cfg is None:   # a model without GEMMs of its own (the trigram toy)
        return KernelPlan(str(dtype).removeprefix("torch."), dense, why, 1, 1, False, "no attention",
                          batch_invariant)
    from hitenter.models.row_invariance import attention_row_multiple

    layers = getattr(model, "layers", None)
    heads = cfg.num_heads
    if layers is not None and len(layers) and hasattr(layers[0], "num_heads"):
        heads = layers[0].num_heads    # this rank's heads under tensor parallelism
    use, kwhy = _attention_kernel(kv_caches[0] if kv_caches else None, heads, dtype)
    rows = ROW_MULTIPLE if batch_invariant and getattr(model, "dense_gemms", False) else 1
    kv_dtype = kv_dtype_name(kv_caches[0].dtype) if kv_caches else "none"
    per_token = sum(c[:, :, 0, 0].numel() * c.element_size() for c in kv_caches)
    return KernelPlan(str(dtype).removeprefix("torch."), dense, why, rows,
                      attention_row_multiple(dtype, cfg.head_dim, KEY_TILE), use, kwhy, batch_invariant,
                      _quant_kernel(model), *_fused(model, kv_caches, use), kv_dtype, per_token)


def _quant_kernel(model: torch.nn.Module) -> str:
    from hitenter.kernels import native_isa
    from hitenter.models.block_linear import BlockLinear

    if not any(isinstance(m, BlockLinear) for m in model.modules()):
        return "none (no GGUF block weights)"
    return native_isa() or "torch reference (no native library)"


def _fused(model: torch.nn.Module, kv_caches: list[torch.Tensor], attention_kernel: bool) -> tuple[str, int]:
    """(whether generation rows run fused, the longest prompt whose every row does too).

    Where the fused layers have the tiled prompt kernel (csrc/attention/prompt_attention.c through dl_init_prompt),
    every prompt runs fused at any length: its prompt rows' glue in C, their attention tiled with key reuse
    (prompt_paths). Without it a prompt row's attention in the fused layer is the decode kernel's, per row
    with no key reuse, which costs more than the torch path's batched attention past a crossover. The
    crossover scales with a layer's matmul work per unit of attention width (weights / (heads x head_dim)),
    so it is set to 0.1 x that (the measured crossovers: docs/benchmarks.md). The choice
    depends on the request's prompt length only, so a row's path is still fixed by its request and
    position (batch invariance)."""
    from hitenter.models import fused_decode

    layers = getattr(model, "layers", None)
    if not attention_kernel or not kv_caches or layers is None or not hasattr(layers[0], "forward_torch"):
        return "off (needs the attention kernel and layers with a torch twin)", 0
    n = sum(fused_decode.fused_layer(layer, cache) is not None for layer, cache in zip(layers, kv_caches, strict=True))
    if not n:
        return "off (weights not native GGUF blocks, or disabled)", 0
    if n == len(layers) and fused_decode.prompt_rows_fused():
        return f"on for {n} of {len(layers)} layers, prompt rows with the tiled prompt kernel", ANY_LENGTH
    cfg = model.config
    width = cfg.num_heads * cfg.head_dim
    per_layer = (cfg.hidden_size * (width + 2 * cfg.num_kv_heads * cfg.head_dim) + width * cfg.hidden_size
                 + 3 * cfg.hidden_size * ffn_width(cfg))
    return f"on for {n} of {len(layers)} layers", int(0.1 * per_layer / width) if n == len(layers) else 0


ANY_LENGTH = 1 << 40   # fused_prompt_max where every prompt runs fused


def prompt_paths(model: torch.nn.Module, num_prompt: int) -> tuple[int, int]:
    """(kernel_from, decode_from) of a request's sequence for AttentionMetadata: the first position whose
    row runs the fused layers (0 for a prompt short enough, KernelPlan.fused_prompt_max, else the last
    prompt token's) and the first that takes the decode kernel there (the last prompt token's). A function
    of the prompt length only, so a row's path depends on its request and position alone (batch
    invariance); the runner, the trace and the disaggregated prefill all call this."""
    last = num_prompt - 1
    return (0 if num_prompt <= getattr(model, "fused_prompt_max", 0) else last), last


def ffn_width(cfg: object) -> int:
    """The FFN width a token runs through: the dense FFN's, or its k experts' together."""
    k, ef = getattr(cfg, "num_experts_used", 0), getattr(cfg, "expert_intermediate_size", 0)
    return k * ef if getattr(cfg, "num_experts", 0) else cfg.intermediate_size   # type: ignore[attr-defined]


def apply_plan(model: torch.nn.Module, plan: KernelPlan) -> None:
    """Give the model the plan's fused-prompt length (read by the runner and the playground's trace): the
    one load-time choice that needs the KV cache, so it cannot be a constructor argument. Batch invariance
    is the model's constructor argument (decoder.CausalLM). Also the KV cache's element type, which the
    trace's private cache takes so its logits stay the engine's bits."""
    model.fused_prompt_max = plan.fused_prompt_max
    if plan.kv_cache_dtype != "none":
        model.kv_cache_dtype = TORCH_KV_DTYPES[plan.kv_cache_dtype]
