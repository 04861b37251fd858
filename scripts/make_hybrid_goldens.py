"""Write llama.cpp's per-position logits on the tiny hybrid GGUFs (hitenter/testing/tiny_hybrids.py) as
goldens: tests/goldens/families/<family>.npz, checked by tests/models/families/test_<family>.py.

The reference is scripts/make_family_goldens.py's (llama-cpp-python 0.3.36 in its own venv, CPU, F32 KV
cache, no flash attention, one `eval` of the 40 tokens, the logits at every position), run by this file's
worker with llama.cpp's extra CPU buffer types off (llama_model_params.use_extra_bufts = false: no
repacked / AMX weight layouts; with them this build crashed on Q8_0 files of these tiny shapes on an
AVX-512 + AMX machine). The arithmetic is then ggml-cpu's plain kernels (Q8_0: activations rounded to
Q8_0 blocks, int8 dot products).

Regenerate (from the repo root, with the project venv):
    .venv/bin/python scripts/make_hybrid_goldens.py [--llama-python PY] [FAMILY ...]
(default /work/venvs/llamacpp/bin/python; no FAMILY: all of tiny_hybrids.HYBRIDS). Deterministic: a rerun
writes the same logits.

Each npz holds: tokens [40] (int32, ids 3.. so no special token), logits [40, V] float32, gguf_sha256 (of
write_tiny_hybrid(family, seed)), llama_cpp_version, n_ctx, seed; and the same for the copy whose layers'
projections are Q8_0 (write_tiny_hybrid(..., quant="Q8_0"); llama.cpp runs its Q8_0 kernels, activations
rounded to Q8_0 blocks): logits_q8_0 [40, V], gguf_q8_0_sha256.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import make_family_goldens  # noqa: E402
from make_family_goldens import N_TOKENS, OUT, golden_tokens  # noqa: E402


def worker() -> None:
    """make_family_goldens.worker with the extra buffer types off (see the module docstring)."""
    import llama_cpp
    import llama_cpp.llama as llama_module

    defaults = llama_cpp.llama_model_default_params

    def params():  # type: ignore[no-untyped-def]
        p = defaults()
        p.use_extra_bufts = False
        return p

    llama_module.llama_cpp.llama_model_default_params = params
    make_family_goldens.worker()


def llama_logits(llama_python: str, model: Path, runs: list[dict]) -> tuple[list[np.ndarray], str]:
    """make_family_goldens.llama_logits, through this file's worker."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.npz"
        req = {"model": str(model), "out": str(out), "runs": runs}
        proc = subprocess.run(["nice", llama_python, __file__, "--worker"], input=json.dumps(req),
                              capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            sys.exit(f"llama.cpp worker failed ({proc.returncode}) on {model.name}:\n{proc.stderr[-3000:]}")
        with np.load(out) as z:
            return [z[f"run{i}"] for i in range(len(runs))], str(z["version"])

N_CTX = 256


def make(family: str, llama_python: str, seed: int = 0) -> Path:
    from hitenter.testing.tiny_hybrids import write_tiny_hybrid
    from hitenter.testing.tiny_model import tiny_vocab

    tokens = golden_tokens(len(tiny_vocab()[0]), seed)
    run = [{"tokens": tokens.tolist(), "n_ctx": N_CTX, "rows": [0, N_TOKENS]}]
    got: dict[str, np.ndarray] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for quant, suffix in ((None, ""), ("Q8_0", "_q8_0")):
            path = write_tiny_hybrid(Path(tmp) / f"{family}{suffix}.gguf", family, seed=seed, quant=quant)
            got[f"gguf{suffix}_sha256"] = np.array(hashlib.sha256(path.read_bytes()).hexdigest())
            (got[f"logits{suffix}"],), version = llama_logits(llama_python, path, run)
    OUT.mkdir(parents=True, exist_ok=True)
    out = OUT / f"{family}.npz"
    logits = got["logits"]
    np.savez_compressed(out, tokens=tokens, llama_cpp_version=np.array(version), n_ctx=np.int32(N_CTX),
                        seed=np.int32(seed), **got)
    print(f"{family:18s} logits std {logits.std():5.2f} max|.| {np.abs(logits).max():6.2f}  "
          f"-> {out.relative_to(ROOT)} ({out.stat().st_size // 1024} KB)")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-python", default="/work/venvs/llamacpp/bin/python")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("families", nargs="*")
    args = ap.parse_args()
    if args.worker:
        return worker()
    from hitenter.testing.tiny_hybrids import HYBRIDS

    for family in args.families or HYBRIDS:
        make(family, args.llama_python)


if __name__ == "__main__":
    main()
