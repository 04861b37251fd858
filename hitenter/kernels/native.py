"""Every native library, declared once and loaded one way.

C sources live in a folder per kernel family under kernels/csrc (qmatmul/, attention/, layer/, sampling/,
recurrent/; the headers several families share in common/). A `NativeLibrary` is one C source and all that
using it takes: the headers it includes (followed from its `#include "..."` lines, so the build cache key covers each of them), its
compile flags and ISA variants, the environment switch that turns it off, what runs instead (the one
warning when it cannot be built or loaded), its functions' ctypes signatures, the libraries it calls
into, and the independent second instances it may need, each with its extra flags (tensor
parallelism's fused layer: other C globals; the attention kernels' portable code, for tests).
`LIBRARIES` lists them all; no other module opens a shared library of ours (tests/kernels/test_native.py).

Calling the object returns its handle (the typed CDLL, or what `make` builds from it) or None: switched
off (`HITENTER_...=0`, logged at info), a library it requires is absent (that one warned), or the build
or load failed (one warning: "<what> unavailable: <fallback>. <why>"). Decided once per process, on
the first call. `generation` counts load attempts, so objects built against an older load can tell
they are stale; `reset()` (tests) forgets the decision, and that of every library built on this one.
Building: hitenter/kernels/build.py (system compiler, cached by source, headers, flags and CPU).
"""

from __future__ import annotations

import ctypes
import logging
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from hitenter import envs
from hitenter.kernels.build import BuildError, build_library
from hitenter.kernels.qm_kernels import QmKernels

log = logging.getLogger(__name__)

CSRC = Path(__file__).resolve().parent / "csrc"
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.MULTILINE)

Signature = tuple[Any, Sequence[Any]]   # (restype, argtypes)
p, i64, i32, u64, f32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int32, ctypes.c_uint64, ctypes.c_float


def included_headers(source: Path) -> tuple[Path, ...]:
    """Every header `source` includes with quotes, directly or through another header (sorted)."""
    seen: set[Path] = set()
    todo = [source]
    while todo:
        f = todo.pop()
        for name in INCLUDE.findall(f.read_text()):
            h = (f.parent / name).resolve()   # as the compiler resolves a quoted include: beside the includer
            if h not in seen and h.exists():
                seen.add(h)
                todo.append(h)
    return tuple(sorted(seen))


class NativeLibrary:
    """One native library (see the module doc); `lib()` is its handle or None."""

    def __init__(self, name: str, source: str, *, env: str, what: str, fallback: str,
                 signatures: Mapping[str, Signature], flags: Sequence[str] = (),
                 variants: Mapping[str, Sequence[str]] | None = None, variant_env: str = "",
                 requires: Sequence[NativeLibrary] = (), optional: Sequence[NativeLibrary] = (),
                 make: Callable[[ctypes.CDLL, str], Any] | None = None,
                 instances: Mapping[str, Sequence[str]] | None = None) -> None:
        self.name, self.source = name, CSRC / source
        self.headers = included_headers(self.source)
        self.env, self.what, self.fallback = env, what, fallback
        self.signatures, self.flags = dict(signatures), list(flags)
        self.variants, self.variant_env = dict(variants or {}), variant_env
        self.requires, self.optional = tuple(requires), tuple(optional)
        self.make, self.instances = make, dict(instances or {})
        self.dependents: list[NativeLibrary] = []   # libraries built on this one (reset with it)
        for dep in (*self.requires, *self.optional):
            dep.dependents.append(self)
        self.generation = 0
        self.status = "not loaded yet"
        self.variant = ""
        self._lock = threading.Lock()
        self._tried = False
        self._lib: ctypes.CDLL | None = None
        self._handle: Any = None
        self._copies: dict[str, ctypes.CDLL | None] = {}

    def __call__(self) -> Any:
        if self._tried:            # decided: no lock (this runs per matmul, per layer and step)
            return self._handle
        return self._load()

    def __repr__(self) -> str:
        return f"NativeLibrary({self.name}: {self.status})"

    def _load(self) -> Any:
        missing = [dep.name for dep in self.requires if dep() is None]
        for dep in self.optional:
            dep()
        with self._lock:
            if self._tried:
                return self._handle
            if not self.switched_on():
                self._decide(None, None, f"off ({self.env}=0)")
                log.info("%s=0: %s off, %s", self.env, self.what, self.fallback)
                return None
            if missing:
                return self._decide(None, None, f"needs {', '.join(missing)}")
            variant = self._variant()
            try:
                lib = self._open(variant)
                handle = lib if self.make is None else self.make(lib, variant)
            except BuildError as e:
                log.warning("%s unavailable: %s. %s", self.what, self.fallback, e)
                return self._decide(None, None, f"failed: {e}")
            self.variant = variant
            return self._decide(lib, handle, "loaded" + (f" ({variant})" if variant else ""))

    def switched_on(self) -> bool:
        """False where the library's switch (`env`, hitenter/envs.py) is 0."""
        return envs.flag(self.env)

    def chosen_variant(self) -> str:
        """The variant the environment asks for (`variant_env`; "auto" where unset), not yet validated."""
        return (envs.text(self.variant_env) if self.variant_env else None) or "auto"

    def _variant(self) -> str:
        if not self.variants:
            return ""
        v = self.chosen_variant()
        if v not in self.variants:
            raise ValueError(f"{self.variant_env}={v!r}: expected one of {sorted(self.variants)}")
        return v

    def _decide(self, lib: ctypes.CDLL | None, handle: Any, status: str) -> Any:
        self._lib, self._handle, self.status = lib, handle, status
        self.generation += 1
        self._tried = True
        return handle

    def build(self, variant: str | None = None, tag: str = "") -> Path:
        """The compiled file of `variant` (None: the environment's choice) or of the instance `tag`, built
        where the cache lacks it, not loaded: what a load opens (the test session builds the files it
        will load at its start, several at once). BuildError as a load meets it."""
        variant = self._variant() if variant is None else variant
        if tag and tag not in self.instances:
            raise ValueError(f"{self.name}: no instance {tag!r} declared (declared: {sorted(self.instances)})")
        file_name = f"{self.name}_{tag}" if tag else f"{self.name}-{variant}" if variant else self.name
        flags = [*self.flags, *self.variants.get(variant, ()), *(self.instances[tag] if tag else ())]
        return build_library(file_name, self.source, flags, self.headers)

    def _open(self, variant: str, tag: str = "") -> ctypes.CDLL:
        """Build (or find in the cache) and dlopen, with the declared signatures."""
        path = self.build(variant, tag)
        try:
            lib = ctypes.CDLL(str(path))
            for fn, (restype, argtypes) in self.signatures.items():
                f = getattr(lib, fn)
                f.restype, f.argtypes = restype, list(argtypes)
        except (OSError, AttributeError) as e:
            raise BuildError(f"loading {path} failed: {e}") from e
        return lib

    def address(self, function: str) -> int:
        """The address of one of the library's C functions (for C callers), 0 where it is not loaded."""
        if self() is None or self._lib is None:
            return 0
        return ctypes.cast(getattr(self._lib, function), ctypes.c_void_p).value or 0

    def instance(self, tag: str) -> ctypes.CDLL | None:
        """A second, independent copy of the library, built with the instance's extra flags under its own
        file name (so its own C globals; not wired by `make`: the caller sets it up), or None where the
        library is not loaded or the copy cannot be built (one warning)."""
        if tag not in self.instances:
            raise ValueError(f"{self.name}: no instance {tag!r} declared (declared: {sorted(self.instances)})")
        if self() is None:
            return None
        with self._lock:
            if tag not in self._copies:
                try:
                    self._copies[tag] = self._open(self.variant, tag)
                except BuildError as e:
                    log.warning("%s (%s instance) unavailable: %s. %s", self.what, tag, self.fallback, e)
                    self._copies[tag] = None
            return self._copies[tag]

    def reset(self) -> None:
        """Forget the load (tests: the next call re-reads the environment), and that of every dependent."""
        with self._lock:
            self._tried, self._lib, self._handle, self._copies = False, None, None, {}
            self.status, self.variant = "not loaded yet", ""
            self.generation += 1
        for dep in self.dependents:
            dep.reset()


def _wire_layer(lib: ctypes.CDLL, _variant: str) -> ctypes.CDLL:
    """The fused layer calls the matmul and attention kernels through pointers: set them (the prompt
    kernel's is 0 where it is not built: prompt rows then take the decode kernel)."""
    lib.dl_init(QMATMUL.address("qm_matmul_desc"), DECODE_ATTENTION.address("decode_attention"))
    lib.dl_init_prompt(PROMPT_ATTENTION.address("prompt_attention"))
    return lib


# y = x W^T on GGUF blocks (kernels/qmatmul.py). -ffp-contract=off: fused multiply-adds only where the
# source asks, identically in every inlined copy. HITENTER_QMATMUL_ISA forces a variant.
QMATMUL = NativeLibrary(
    "qmatmul", "qmatmul/qmatmul.c", env="HITENTER_QMATMUL", what="native quantized matmul",
    fallback=("GGUF weights are dequantized at load to dense fp32 (the same results as dtype='float32', more "
              "memory; HITENTER_GGUF_REFERENCE=1 keeps the blocks on the slow torch reference path)"),
    flags=["-ffp-contract=off"],
    variants={"auto": [], "avx512": [], "avx2": ["-mno-avx512f"],
              "generic": ["-mno-avx512f", "-mno-avx2", "-DQM_GENERIC"]},
    variant_env="HITENTER_QMATMUL_ISA", make=QmKernels,
    signatures={
        "qm_matmul": (ctypes.c_int, [ctypes.c_int, p, i64, i64, i64, p, i64, i64, p, i64, ctypes.c_int]),
        "qm_matmul_desc": (ctypes.c_int, [p, p, i64, i64, p, i64, ctypes.c_int]),
        "qm_desc_init": (ctypes.c_int, [p, ctypes.c_int, p, i64, i64, i64]),
        "qm_desc_init_repacked": (ctypes.c_int, [p, ctypes.c_int, p, i64, i64]),
        "qm_repack": (ctypes.c_int, [ctypes.c_int, p, i64, i64, i64, p, ctypes.c_int]),
        "qm_repacked_bytes": (i64, [ctypes.c_int, i64, i64]),
        "qm_repack_lanes": (ctypes.c_int, []),
        "qm_desc_size": (i64, []),
        "qm_isa": (ctypes.c_int, []),
        "qm_supported": (ctypes.c_int, [ctypes.c_int]),
    })

# paged attention for generation rows (models/decode_kernel.py)
DECODE_ATTENTION = NativeLibrary(
    "decode_attention", "attention/decode_attention.c", env="HITENTER_DECODE_KERNEL", what="decode attention kernel",
    fallback="torch path only", instances={"portable": ["-mno-fma"]},   # the 16-lane code, not attn_avx2.h (tests)
    signatures={"decode_attention": (ctypes.c_int, [p, p, p, ctypes.c_int, i64, p, p, p, ctypes.c_int, ctypes.c_int,
                                                    i64, ctypes.c_int, ctypes.c_int, f32, i64, ctypes.c_int]),
                "q8_0_quantize": (ctypes.c_int, [p, p, i64])})   # the q8_0 KV writers' quantizer (tests)

# tiled paged attention for prompt rows (models/prompt_kernel.py)
PROMPT_ATTENTION = NativeLibrary(
    "prompt_attention", "attention/prompt_attention.c", env="HITENTER_PROMPT_KERNEL", what="prompt attention kernel",
    fallback="GEMM path for prompt rows", instances={"portable": ["-mno-fma"]},
    signatures={"prompt_attention": (ctypes.c_int, [p, p, p, ctypes.c_int, i64, p, p, p, p, p, ctypes.c_int,
                                                    ctypes.c_int, i64, ctypes.c_int, ctypes.c_int, f32, i64,
                                                    ctypes.c_int])})

# the sampler's exponential race (kernels/race.py)
RACE = NativeLibrary(
    "race", "sampling/race.c", env="HITENTER_RACE_KERNEL", what="sampling race kernel", fallback="numpy draws (slower)",
    signatures={"race_argmax": (ctypes.c_int, [p, i64, i64, i64, p, p, ctypes.c_int]),
                "race_q": (None, [u64, p, i64, p])})

# a decoder layer's generation rows in one call (models/fused_decode.py), wired to the kernels above;
# tensor parallelism runs a second instance whose matmul pointer does the collectives (distributed/fused.py)
DECODE_LAYER = NativeLibrary(
    "decode_layer", "layer/decode_layer.c", env="HITENTER_FUSED_DECODE", what="fused decode layer",
    fallback="the torch layer runs instead", flags=["-ffp-contract=off"],
    requires=(QMATMUL, DECODE_ATTENTION), optional=(PROMPT_ATTENTION,), make=_wire_layer, instances={"tp": []},
    signatures={"dl_init": (None, [p, p]), "dl_init_prompt": (None, [p]), "dl_layer": (i32, [p, p, p, p, p]),
                "dl_scratch": (i64, [p, i64]), "dl_forward": (i32, [p, p, i32, p, p, p]),
                "dl_supported": (i32, [i32, i32, i32])})

# the gated delta rule of Gated DeltaNet layers over a sequence's span (kernels/delta_rule.py); every variant
# gives the same bits (-ffp-contract=off, no horizontal sums). HITENTER_DELTA_RULE_ISA forces a variant.
DELTA_RULE = NativeLibrary(
    "delta_rule", "recurrent/delta_rule.c", env="HITENTER_DELTA_RULE", what="delta rule kernel",
    fallback="the torch reference runs instead (slower)", flags=["-ffp-contract=off"],
    variants={"auto": [], "avx2": ["-mno-avx512f"], "generic": ["-mno-avx512f", "-mno-avx2", "-mno-fma"]},
    variant_env="HITENTER_DELTA_RULE_ISA",
    signatures={"delta_rule": (ctypes.c_int, [p, p, p, p, p, p, p, i64, i64, i64, i64, f32, ctypes.c_int]),
                "delta_rule_rows": (ctypes.c_int, [p, p, i64, p, p, p, p, p, p, i64, i64, i64, i64, f32,
                                                   ctypes.c_int])})

# a Gated DeltaNet layer's recurrent part (conv, silu, l2 norms, gates, delta rule, gated norm) for a step's spans in
# one call (kernels/gated_deltanet.py); the delta rule's code and bits (csrc/recurrent/delta_rule.h), the same ISA
# switch
GATED_DELTANET = NativeLibrary(
    "gated_deltanet", "recurrent/gated_deltanet.c", env="HITENTER_GDN_FUSED", what="fused Gated DeltaNet step",
    fallback="the layer's torch ops and the delta rule kernel run instead", flags=["-ffp-contract=off"],
    variants={"auto": [], "avx2": ["-mno-avx512f"], "generic": ["-mno-avx512f", "-mno-avx2", "-mno-fma"]},
    variant_env="HITENTER_DELTA_RULE_ISA",
    signatures={"gdn_spans": (ctypes.c_int, [p, p, p, p, p, p, p, p, p, p, p, i64, p, i64, p, i64, p,
                                             ctypes.c_int])})

# the causal conv and Mamba2's selective scan over a sequence's span (kernels/ssm_scan.py); -ffp-contract=off:
# the conv and the scan's state bit-equal to the torch reference. HITENTER_SSM_SCAN_ISA forces a variant.
SSM_SCAN = NativeLibrary(
    "ssm_scan", "recurrent/ssm_scan.c", env="HITENTER_SSM_SCAN", what="ssm scan kernel",
    fallback="the torch reference runs instead (slower)", flags=["-ffp-contract=off"],
    variants={"auto": [], "avx2": ["-mno-avx512f"], "generic": ["-mno-avx512f", "-mno-avx2", "-mno-fma"]},
    variant_env="HITENTER_SSM_SCAN_ISA",
    signatures={"causal_conv": (ctypes.c_int, [p, p, p, p, i64, i64, i64]),
                "mamba2_scan": (ctypes.c_int, [p, p, p, p, p, p, p, i64, i64, i64, i64, i64, ctypes.c_int])})

# a Mamba2 layer's recurrent part (conv, gates, scan, gated norm) for a step's spans in one call
# (kernels/mamba2.py); the scan's code and bits (csrc/recurrent/ssm_scan.h), the same ISA switch
MAMBA2 = NativeLibrary(
    "mamba2", "recurrent/mamba2.c", env="HITENTER_MAMBA2_FUSED", what="fused Mamba2 step",
    fallback="the layer's torch ops and the scan kernel run instead", flags=["-ffp-contract=off"],
    variants={"auto": [], "avx2": ["-mno-avx512f"], "generic": ["-mno-avx512f", "-mno-avx2", "-mno-fma"]},
    variant_env="HITENTER_SSM_SCAN_ISA",
    signatures={"mamba2_spans": (ctypes.c_int, [p, p, p, p, p, p, p, p, p, p, p, p, p, i64, p, i64, p,
                                                ctypes.c_int])})

LIBRARIES: tuple[NativeLibrary, ...] = (QMATMUL, DECODE_ATTENTION, PROMPT_ATTENTION, RACE, DECODE_LAYER, DELTA_RULE,
                                        GATED_DELTANET, SSM_SCAN, MAMBA2)
