"""The loaded quantized-matmul library's entry points and what its build does (native.QMATMUL's handle,
made by `native` at load; used by qmatmul.py)."""

from __future__ import annotations

import ctypes
import logging

log = logging.getLogger("hitenter.kernels.qmatmul")

ISA_NAMES = {0: "generic", 1: "avx2", 2: "avx512vnni"}


class QmKernels:
    """The loaded library (native.QMATMUL's handle): its entry points and what this build does, read
    once at load."""

    def __init__(self, lib: ctypes.CDLL, variant: str) -> None:
        self.matmul_desc = lib.qm_matmul_desc
        self.desc_init, self.desc_init_repacked = lib.qm_desc_init, lib.qm_desc_init_repacked
        self.repack, self.repacked_bytes = lib.qm_repack, lib.qm_repacked_bytes
        self.desc_size = int(lib.qm_desc_size())
        self.isa = ISA_NAMES[lib.qm_isa()]
        self.supported = frozenset(t for t in range(64) if lib.qm_supported(t))
        self.lanes = int(lib.qm_repack_lanes())    # rows per repacked group (0: this build repacks nothing)
        if variant == "avx512" and self.isa != "avx512vnni":
            log.warning("HITENTER_QMATMUL_ISA=avx512 but this CPU/compiler gives %s", self.isa)
