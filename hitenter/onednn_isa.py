"""oneDNN's instruction-set cap, set before torch loads oneDNN.

On CPUs with AMX (Intel Sapphire Rapids and later) oneDNN runs bf16 GEMMs on AMX tiles whose blocking
follows the row count, so a row's bf16 result changes with how many rows share the GEMM: the engine's batch
invariance (a row's bits never depend on the batch) would not hold for bf16 weights. Capped at
AVX512_CORE_BF16, oneDNN's bf16 kernels give every row the same bits at every padded row count (the
models' dense-GEMM invariance tests check it). fp32 GEMMs and hitenter's own quantized kernels do not use
oneDNN's AMX path either way. ``ONEDNN_MAX_CPU_ISA`` is read once, when oneDNN initialises, so
``hitenter/__init__.py`` calls :func:`configure` before anything imports torch; a value the user set wins
(``ONEDNN_MAX_CPU_ISA=ALL`` gives bf16 its AMX speed without batch invariance).
"""

from __future__ import annotations

from hitenter import envs

ISA_CAP = "AVX512_CORE_BF16"   # oneDNN caps at what the CPU has: on AVX2-only CPUs this changes nothing


def configure(environ: dict[str, str] | None = None) -> None:
    """Set ONEDNN_MAX_CPU_ISA to ISA_CAP unless the user set it."""
    envs.set_unless(envs.ONEDNN_MAX_CPU_ISA, ISA_CAP, (envs.ONEDNN_MAX_CPU_ISA,), environ)
