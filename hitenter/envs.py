"""Every environment variable hitenter reads, declared once: its name, type, default and effect.

- Each variable is a module-level ``Env``: ``Flag`` (a switch: ``0`` turns a default-on one off, ``1``
  turns a default-off one on), ``Int``, ``Float``, ``Text`` or ``CachePath``. ``.get()`` reads the
  environment each time it is called, so a test that sets a variable sees it at once; the part that
  uses a switch decides when to read it (a native library when it first loads, the engine when it
  starts). ``flag(name)`` / ``text(name)`` read one whose name a caller holds (a native library's).
- ``ENVS`` holds them all in declaration order, grouped as docs/envs.md documents them (a test checks
  the two agree); ``hitenter envs`` prints them with their values (``describe``). Variables of other
  tools that hitenter reads or sets (``CC``, ``GOMP_SPINCOUNT``, ``OMP_WAIT_POLICY``, ``PYTHONPATH``)
  are declared too.
- Nothing else in the package touches ``os.environ``: ``child_env`` is the environment of a process
  hitenter starts, ``set_unless`` sets a variable for this process and the libraries it loads later.

This module imports the standard library only: ``hitenter/__init__.py`` uses it before torch loads.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

T = TypeVar("T")

ENVS: dict[str, Env[Any]] = {}


@dataclass(frozen=True)
class Env(Generic[T]):
    """One environment variable: its value when unset, what it does, its section of docs/envs.md."""

    name: str
    default: T
    help: str
    group: str

    def __post_init__(self) -> None:
        if self.name in ENVS:
            raise ValueError(f"{self.name} is declared twice")
        ENVS[self.name] = self

    def raw(self) -> str | None:
        """The variable's text in this process's environment; None when it is unset."""
        return os.environ.get(self.name)

    def get(self) -> T:
        """The value now: the default when unset, else the text parsed."""
        text = self.raw()
        return self.default if text is None else self.parse(text)

    def parse(self, text: str) -> T:
        raise NotImplementedError

    def shown_default(self) -> str:
        return "unset" if self.default is None else str(self.default)


class Flag(Env[bool]):
    """A switch: on by default unless set to ``0``, or off by default unless set to ``1``."""

    def parse(self, text: str) -> bool:
        return text != "0" if self.default else text == "1"

    def shown_default(self) -> str:
        return "1" if self.default else "0"


class Int(Env[int]):
    def parse(self, text: str) -> int:
        try:
            return int(text)
        except ValueError:
            raise ValueError(f"{self.name}={text!r}: expected an integer") from None


class Float(Env[float]):
    def parse(self, text: str) -> float:
        try:
            return float(text)
        except ValueError:
            raise ValueError(f"{self.name}={text!r}: expected a number") from None


class Text(Env["str | None"]):
    def parse(self, text: str) -> str | None:
        return text


class CachePath(Env[Path]):
    """A directory: the text (the default where unset or empty) with ``~`` expanded."""

    def get(self) -> Path:
        return Path(self.raw() or self.default).expanduser()


_WHERE, _KERNELS, _ENGINE, _TESTS, _OTHER = ("Where things live", "Native kernels", "Engine", "Tests",
                                              "Variables of other tools")

HITENTER_HOME = CachePath("HITENTER_HOME", Path("~/.cache/hitenter"), "the cache directory: pulled models in "
                          "models/, compiled kernels in kernels/", _WHERE)

HITENTER_QMATMUL = Flag("HITENTER_QMATMUL", True, "0: never load the quantized-matmul library; GGUF blocks are "
                        "dequantized at load to the dense fp32 path (or, with HITENTER_GGUF_REFERENCE=1, kept on "
                        "the torch reference matmul)", _KERNELS)
HITENTER_QMATMUL_ISA = Text("HITENTER_QMATMUL_ISA", "auto", "force a variant of the quantized matmul: auto, "
                            "avx512, avx2 (built with -mno-avx512f) or generic (plain C)", _KERNELS)
HITENTER_GGUF_REFERENCE = Flag("HITENTER_GGUF_REFERENCE", False, "1: keep GGUF blocks on the slow torch "
                               "reference matmul where the native kernels are absent, instead of dequantizing "
                               "at load", _KERNELS)
HITENTER_REPACK = Flag("HITENTER_REPACK", True, "0: keep Q4_0 / Q4_1 / Q8_0 weights in the file's row layout "
                       "instead of repacking them at load", _KERNELS)
HITENTER_HUGEPAGES = Flag("HITENTER_HUGEPAGES", True, "0: do not ask for 2 MB pages for the weight arena",
                          _KERNELS)
HITENTER_WEIGHT_CACHE = Flag("HITENTER_WEIGHT_CACHE", True, "0: build a GGUF's weight arena at every load "
                             "instead of mapping the copy kept in weights/ (hitenter/models/weight_cache.py), "
                             "and its tokenizer from the header instead of the copy kept in tokenizers/ "
                             "(hitenter/tokenizer/vocab_cache.py)",
                             _KERNELS)
HITENTER_DECODE_KERNEL = Flag("HITENTER_DECODE_KERNEL", True, "0: generation rows' attention on the torch GEMM "
                              "path instead of the paged decode kernel", _KERNELS)
HITENTER_PROMPT_KERNEL = Flag("HITENTER_PROMPT_KERNEL", True, "0: prompt rows' attention on the torch GEMM path "
                              "instead of the paged prompt kernel", _KERNELS)
HITENTER_FUSED_DECODE = Flag("HITENTER_FUSED_DECODE", True, "0: no fused native decode layer; every row through "
                             "the torch layers", _KERNELS)
HITENTER_RACE_KERNEL = Flag("HITENTER_RACE_KERNEL", True, "0: the sampler's exponential race in numpy instead "
                            "of the native pass", _KERNELS)
HITENTER_DELTA_RULE = Flag("HITENTER_DELTA_RULE", True, "0: Gated DeltaNet layers' delta rule on the torch "
                           "reference instead of the native kernel", _KERNELS)
HITENTER_DELTA_RULE_ISA = Text("HITENTER_DELTA_RULE_ISA", "auto", "force a variant of the delta-rule kernels "
                               "(the delta rule and the fused Gated DeltaNet step): auto, avx2 or generic", _KERNELS)
HITENTER_GDN_FUSED = Flag("HITENTER_GDN_FUSED", True, "0: Gated DeltaNet layers' conv, norms, gates, delta rule and "
                          "gated norm as separate torch ops and kernel calls instead of one fused native call per "
                          "layer", _KERNELS)
HITENTER_SSM_SCAN = Flag("HITENTER_SSM_SCAN", True, "0: the causal conv and Mamba2's scan on the torch "
                         "reference instead of the native kernel", _KERNELS)
HITENTER_SSM_SCAN_ISA = Text("HITENTER_SSM_SCAN_ISA", "auto", "force a variant of the SSM scan kernels (the "
                             "causal conv and scan, and the fused Mamba2 step): auto, avx2 or generic", _KERNELS)
HITENTER_MAMBA2_FUSED = Flag("HITENTER_MAMBA2_FUSED", True, "0: Mamba2 layers' conv, gates, scan and gated norm as "
                             "separate torch ops and kernel calls instead of one fused native call per layer",
                             _KERNELS)

HITENTER_WINDOW_RELEASE = Flag("HITENTER_WINDOW_RELEASE", True, "0: one block table for all layers; "
                               "sliding-window layers keep the blocks their window left (masked, not released)",
                               _ENGINE)
HITENTER_SPEC_ADAPTIVE = Flag("HITENTER_SPEC_ADAPTIVE", True, "0: always draft num_speculative_tokens, no "
                              "adaptive draft length", _ENGINE)
HITENTER_DRAFT_VOCAB = Int("HITENTER_DRAFT_VOCAB", 32768, "the vocabulary ids a draft model's LM head scores "
                           "(the first N); 0: all", _ENGINE)
HITENTER_DRAFT_LOOKUP = Flag("HITENTER_DRAFT_LOOKUP", True, "0: never skip the draft model where prompt lookup "
                             "finds the last 4+ tokens earlier", _ENGINE)
HITENTER_TP_TIMEOUT_S = Float("HITENTER_TP_TIMEOUT_S", 120.0, "seconds a tensor-parallel collective may take "
                              "before the group is torn down with TensorParallelError", _ENGINE)
HITENTER_DISAGG_TIMEOUT_S = Float("HITENTER_DISAGG_TIMEOUT_S", 300.0, "seconds a disaggregated-prefill job may "
                                  "wait at the head of the queue before DisaggregationError", _ENGINE)
HITENTER_POOLING_SHARE = Float("HITENTER_POOLING_SHARE", 0.2, "the most of the wall time embedding and rerank "
                               "work takes (over a 1 s window) while any engine of the process generates; "
                               "1: no limit", _ENGINE)

_CLIENT = "Command line"
HITENTER_HOST = Text("HITENTER_HOST", "127.0.0.1:8000", "where hitenter run / chat look for a running hitenter "
                     "serve (host:port or http://host:port); one that answers is used (hitenter/remote.py)", _CLIENT)
HITENTER_API_KEY = Text("HITENTER_API_KEY", None, "the --api-key of that server, sent by hitenter run / chat",
                        _CLIENT)

HITENTER_TEST_PREBUILD = Text("HITENTER_TEST_PREBUILD", None, "1 / 0: force on / off the compilation of the "
                              "native libraries before a test session's first test (tests/conftest.py; unset: "
                              "automatic)", _TESTS)

CC = Text("CC", None, "the C compiler for the native kernels (unset: cc, then gcc, on PATH)", _OTHER)
GOMP_SPINCOUNT = Text("GOMP_SPINCOUNT", None, "libgomp's spin count; hitenter sets 1000 for itself unless this "
                      "or OMP_WAIT_POLICY is set (hitenter/omp_wait.py)", _OTHER)
OMP_WAIT_POLICY = Text("OMP_WAIT_POLICY", None, "OpenMP's wait policy; when set, hitenter leaves GOMP_SPINCOUNT "
                       "alone", _OTHER)
ONEDNN_MAX_CPU_ISA = Text("ONEDNN_MAX_CPU_ISA", None, "oneDNN's instruction-set cap; hitenter sets AVX512_CORE_BF16 "
                           "for itself unless this is set, so bf16 GEMMs stay batch invariant on AMX CPUs "
                           "(hitenter/onednn_isa.py)", _OTHER)
PYTHONPATH = Text("PYTHONPATH", None, "kept, with hitenter's source tree first, for the processes hitenter "
                  "starts (tensor-parallel workers, the body-check worker)", _OTHER)


def _declared(name: str, kind: type[Env[Any]]) -> Env[Any]:
    var = ENVS.get(name)
    if not isinstance(var, kind):
        raise KeyError(f"{name} is not a {kind.__name__} declared in hitenter/envs.py")
    return var


def flag(name: str) -> bool:
    """The value of the Flag declared as `name` (for a caller that holds a switch by name)."""
    return bool(_declared(name, Flag).get())


def text(name: str) -> str | None:
    """The value of the Text declared as `name`."""
    value = _declared(name, Text).get()
    return None if value is None else str(value)


def child_env(pythonpath_first: str | None = None) -> dict[str, str]:
    """This process's environment for a process it starts, `pythonpath_first` (if given) first on PYTHONPATH."""
    env = dict(os.environ)
    if pythonpath_first is not None:
        env[PYTHONPATH.name] = os.pathsep.join(filter(None, [pythonpath_first, env.get(PYTHONPATH.name)]))
    return env


def set_unless(var: Env[Any], value: str, unless: Sequence[Env[Any]],
               environ: MutableMapping[str, str] | None = None) -> None:
    """Set `var` to `value` in this process's environment (or `environ`) unless one of `unless` is set."""
    env = os.environ if environ is None else environ
    if not any(u.name in env for u in unless):
        env[var.name] = value


def describe() -> list[tuple[str, str, str, str, str]]:
    """(group, name, default, value now or "", effect) of every declared variable, in declaration order."""
    return [(v.group, v.name, v.shown_default(), v.raw() or "", v.help) for v in ENVS.values()]
