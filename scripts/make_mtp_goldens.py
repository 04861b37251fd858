"""Write llama.cpp's MTP-head outputs on the tiny Qwen3.5 files with an MTP block
(hitenter/testing/tiny_qwen35.py MTP_HYBRIDS) as goldens: tests/goldens/families/mtp_<family>.npz, checked
by tests/models/test_mtp.py.

The reference: llama-cpp-python 0.3.36 in its own venv (CPU, F32 KV cache, extra buffer types off as in
scripts/make_hybrid_goldens.py), driven through llama.cpp's C API by ctypes, as common/speculative.cpp's
draft-mtp drives it:

1. the target (model loaded with ``load_mtp``) decodes the 40 tokens in one batch with
   ``llama_set_embeddings_nextn(ctx, true, false)``; per position: its logits and ``h_nextn`` (the trunk's
   hidden state after output_norm, llama_get_embeddings_nextn_ith);
2. an MTP context (``ctx_type`` LLAMA_CONTEXT_TYPE_MTP, ``ctx_other`` the target) decodes one llama_batch_ext
   of the 40 tokens at positions 0..39, row p carrying ``h_nextn`` of position p - 1 as its embedding row
   (llama_batch_ext_set_embd_token on a token entry, as common_batch::set_embd does)
   (zeros at p = 0: common/speculative.cpp's pending_h), every row output; per position: its logits and its
   own ``h_nextn`` (the block's output after shared_head_norm).

Regenerate (from the repo root, with the project venv):
    .venv/bin/python scripts/make_mtp_goldens.py [--llama-python PY] [FAMILY ...]

Each npz holds: tokens [40] int32, target_logits [40, V], target_h [40, H], mtp_h_in [40, H] (the rows fed),
mtp_logits [40, V], mtp_h [40, H] (float32), gguf_sha256, llama_cpp_version; and the same with a _q8_0
suffix for the copy whose projections are Q8_0.
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

from make_family_goldens import OUT, golden_tokens  # noqa: E402

N_CTX = 256


def _mangled(lib, name, restype, argtypes):  # type: ignore[no-untyped-def]

    fn = getattr(lib, name)
    fn.restype, fn.argtypes = restype, argtypes
    return fn


def worker() -> None:
    """Run in llama-cpp-python's venv: read {model, out, tokens} from stdin, write the arrays to out."""
    import ctypes

    import llama_cpp as L

    req = json.loads(sys.stdin.read())
    tokens = [int(t) for t in req["tokens"]]
    lib = L.llama_cpp._lib
    vp, c_bool, c_int = ctypes.c_void_p, ctypes.c_bool, ctypes.c_int
    fptr = ctypes.POINTER(ctypes.c_float)
    # llama-ext.h's staging API (C++ linkage)
    set_nextn = _mangled(lib, "_Z26llama_set_embeddings_nextnP13llama_contextbb", None, [vp, c_bool, c_bool])
    get_nextn_ith = _mangled(lib, "_Z30llama_get_embeddings_nextn_ithP13llama_contexti", fptr, [vp, c_int])

    class Embd(ctypes.Structure):
        _fields_ = [("data", fptr), ("n_rows", ctypes.c_size_t), ("n_embd", ctypes.c_size_t)]

    b_init = _mangled(lib, "llama_batch_ext_init", vp, [vp])
    b_add_token = _mangled(lib, "llama_batch_ext_add_token", ctypes.c_int32, [vp, ctypes.c_int32, ctypes.c_int32])
    b_set_state = _mangled(lib, "llama_batch_ext_set_embd_token", c_bool, [vp, ctypes.c_int32, Embd])
    b_set_pos = _mangled(lib, "llama_batch_ext_set_pos", c_bool, [vp, ctypes.c_int32, ctypes.POINTER(ctypes.c_int32)])
    b_set_out = _mangled(lib, "llama_batch_ext_set_output_logits", c_bool, [vp, ctypes.c_int32, c_bool])
    process = _mangled(lib, "llama_process", ctypes.c_int32, [vp, c_int, vp])

    L.llama_backend_init()
    mp = L.llama_model_default_params()
    mp.use_extra_bufts = False
    mp.load_mtp = True
    model = L.llama_model_load_from_file(req["model"].encode(), mp)
    assert model, "model load failed"
    n_embd, n_vocab = L.llama_model_n_embd(model), L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))

    def params(mtp: bool, other=None):  # type: ignore[no-untyped-def]
        cp = L.llama_context_default_params()
        cp.n_ctx, cp.n_batch, cp.n_ubatch = N_CTX, N_CTX, N_CTX
        cp.n_threads = cp.n_threads_batch = 2
        cp.type_k = cp.type_v = 0   # F32 KV
        cp.flash_attn_type = 0      # disabled
        if mtp:
            cp.ctx_type, cp.n_rs_seq, cp.ctx_other = 1, 0, other
        return cp

    tgt = L.llama_init_from_model(model, params(False))
    set_nextn(tgt, True, False)
    n = len(tokens)
    batch = L.llama_batch_init(n, 0, 1)
    for i, t in enumerate(tokens):
        batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = t, i, 1, 1
        batch.seq_id[i][0] = 0
    batch.n_tokens = n
    assert L.llama_decode(tgt, batch) == 0, "target decode failed"
    t_logits = np.array([np.ctypeslib.as_array(L.llama_get_logits_ith(tgt, i), (n_vocab,)) for i in range(n)])
    t_h = np.array([np.ctypeslib.as_array(get_nextn_ith(tgt, i), (n_embd,)) for i in range(n)], dtype=np.float32)

    dft = L.llama_init_from_model(model, params(True, tgt))
    assert dft, "MTP context failed"
    set_nextn(dft, True, True)
    h_in = np.concatenate([np.zeros((1, n_embd), np.float32), t_h[:-1]]).astype(np.float32)
    b = b_init(dft)
    for i, t in enumerate(tokens):
        idx = b_add_token(b, 0, t)
        pos = (ctypes.c_int32 * 4)(i, i, i, 0)
        assert b_set_pos(b, idx, pos)
        assert b_set_state(b, idx, Embd(h_in[i].ctypes.data_as(fptr), 1, n_embd))
        assert b_set_out(b, idx, True)
    rc = process(dft, 1, b)   # LLAMA_PROCESS_TYPE_DECODE
    assert rc == 0, f"MTP decode failed: {rc}"
    m_logits = np.array([np.ctypeslib.as_array(L.llama_get_logits_ith(dft, i), (n_vocab,)) for i in range(n)])
    m_h = np.array([np.ctypeslib.as_array(get_nextn_ith(dft, i), (n_embd,)) for i in range(n)], dtype=np.float32)
    np.savez(req["out"], target_logits=t_logits.astype(np.float32), target_h=t_h, mtp_h_in=h_in,
             mtp_logits=m_logits.astype(np.float32), mtp_h=m_h, version=np.array(L.__version__))


def llama_mtp(llama_python: str, model: Path, tokens: list[int]) -> dict[str, np.ndarray]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.npz"
        req = {"model": str(model), "out": str(out), "tokens": tokens}
        proc = subprocess.run(["nice", llama_python, __file__, "--worker"], input=json.dumps(req),
                              capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            sys.exit(f"llama.cpp worker failed ({proc.returncode}) on {model.name}:\n{proc.stderr[-3000:]}")
        with np.load(out) as z:
            return {k: z[k] for k in z.files}


def make(family: str, llama_python: str, seed: int = 0) -> Path:
    from hitenter.testing.tiny_model import tiny_vocab
    from hitenter.testing.tiny_qwen35 import write_tiny_mtp

    tokens = golden_tokens(len(tiny_vocab()[0]), seed)
    got: dict[str, np.ndarray] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for quant, suffix in ((None, ""), ("Q8_0", "_q8_0")):
            path = write_tiny_mtp(Path(tmp) / f"{family}{suffix}.gguf", family, seed=seed, quant=quant)
            got[f"gguf{suffix}_sha256"] = np.array(hashlib.sha256(path.read_bytes()).hexdigest())
            res = llama_mtp(llama_python, path, tokens.tolist())
            got["llama_cpp_version"] = res.pop("version")
            got.update({k + suffix: v for k, v in res.items()})
    OUT.mkdir(parents=True, exist_ok=True)
    out = OUT / f"mtp_{family}.npz"
    np.savez_compressed(out, tokens=tokens, seed=np.int32(seed), n_ctx=np.int32(N_CTX), **got)
    print(f"{family:14s} mtp logits std {got['mtp_logits'].std():5.2f}  -> {out.relative_to(ROOT)} "
          f"({out.stat().st_size // 1024} KB)")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-python", default="/work/venvs/llamacpp/bin/python")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("families", nargs="*")
    args = ap.parse_args()
    if args.worker:
        return worker()
    from hitenter.testing.tiny_qwen35 import MTP_HYBRIDS

    for family in args.families or MTP_HYBRIDS:
        make(family, args.llama_python)


if __name__ == "__main__":
    main()
