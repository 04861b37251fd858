"""Goldens for the vision encoders: llama.cpp's mtmd image embeddings of tiny random mmproj files.

goldens: tests/goldens/vision/<family>.npz, checked by tests/models/vision/test_<family>_vision.py.

The reference is llama-cpp-python 0.3.36's mtmd bindings (its own venv, CPU, flash attention off), run by this
file's worker with llama.cpp's extra CPU buffer types off (as scripts/make_hybrid_goldens.py: with them this
build crashes on this AVX-512 + AMX machine). The worker loads the tiny text model
(tiny_gemma.write_tiny_gemma3, hidden = the projector's output width), the mmproj
(tiny_vision.write_tiny_gemma3_mmproj), hands each image's raw RGB pixels to mtmd_bitmap_init (no image file
decoder in between), tokenizes "<__media__>", encodes the image chunk (mtmd_encode_chunk) and reads
mtmd_get_output_embd.

Each npz holds: mmproj_sha256 (of write_tiny_gemma3_mmproj(seed)), llama_cpp_version, and per image i:
image<i> [H, W, 3] uint8 and embd<i> [n_tokens, n_embd] float32.

Regenerate (from the repo root, with the project venv):
    .venv/bin/python scripts/make_vision_goldens.py [--llama-python PY]
Deterministic: a rerun writes the same embeddings.
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
OUT = ROOT / "tests" / "goldens" / "vision"
SEED = 0
# (width, height, seed): smaller and not square (upscale + padding), larger (downscale + padding), exact size
IMAGES = [(48, 40, 1), (100, 70, 2), (64, 64, 3), (30, 90, 4)]


def worker() -> None:
    """stdin: {"text": path, "mmproj": path, "images": [npy paths], "out": npz path}; writes embd<i>."""
    import ctypes

    import llama_cpp
    import llama_cpp.mtmd_cpp as mtmd

    req = json.load(sys.stdin)
    mparams = llama_cpp.llama_model_default_params()
    mparams.use_extra_bufts = False
    mparams.n_gpu_layers = 0
    model = llama_cpp.llama_model_load_from_file(req["text"].encode(), mparams)
    assert model, "text model failed to load"
    cparams = mtmd.mtmd_context_params_default()
    cparams.use_gpu = False
    cparams.n_threads = 2
    cparams.warmup = False
    cparams.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
    ctx = mtmd.mtmd_init_from_file(req["mmproj"].encode(), model, cparams)
    assert ctx, "mmproj failed to load"
    arrays: dict[str, np.ndarray] = {"version": np.array(llama_cpp.__version__)}
    n_embd = llama_cpp.llama_model_n_embd(model)
    for i, path in enumerate(req["images"]):
        img = np.ascontiguousarray(np.load(path))
        h, w = img.shape[:2]
        buf = (ctypes.c_uint8 * img.size).from_buffer_copy(img.tobytes())
        bitmap = mtmd.mtmd_bitmap_init(w, h, buf)
        text = mtmd.mtmd_input_text()
        raw = mtmd.mtmd_default_marker()
        text.text, text.text_len, text.add_special, text.parse_special = raw, len(raw), False, True
        chunks = mtmd.mtmd_input_chunks_init()
        bitmaps = (mtmd.mtmd_bitmap_p_ctypes * 1)(bitmap)
        assert mtmd.mtmd_tokenize(ctx, chunks, ctypes.byref(text), bitmaps, 1) == 0
        for c in range(mtmd.mtmd_input_chunks_size(chunks)):
            chunk = mtmd.mtmd_input_chunks_get(chunks, c)
            if mtmd.mtmd_input_chunk_get_type(chunk) != mtmd.MTMD_INPUT_CHUNK_TYPE_IMAGE:
                continue
            n = mtmd.mtmd_input_chunk_get_n_tokens(chunk)
            assert mtmd.mtmd_encode_chunk(ctx, chunk) == 0
            ptr = mtmd.mtmd_get_output_embd(ctx)
            arrays[f"embd{i}"] = np.ctypeslib.as_array(ptr, shape=(n * n_embd,)).reshape(n, n_embd).copy()
        mtmd.mtmd_input_chunks_free(chunks)
        mtmd.mtmd_bitmap_free(bitmap)
    mtmd.mtmd_free(ctx)
    np.savez(req["out"], **arrays)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-python", default="/work/venvs/llamacpp/bin/python")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker()
        return
    sys.path.insert(0, str(ROOT))
    from hitenter.testing.tiny_gemma import write_tiny_gemma3
    from hitenter.testing.tiny_vision import sample_image, write_tiny_gemma3_mmproj

    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        text = write_tiny_gemma3(t / "text.gguf", seed=SEED)
        mmproj = write_tiny_gemma3_mmproj(t / "mmproj.gguf", seed=SEED)
        images = [sample_image(w, h, s) for w, h, s in IMAGES]
        paths = []
        for i, img in enumerate(images):
            np.save(t / f"img{i}.npy", img)
            paths.append(str(t / f"img{i}.npy"))
        out = t / "out.npz"
        req = {"text": str(text), "mmproj": str(mmproj), "images": paths, "out": str(out)}
        proc = subprocess.run(["nice", args.llama_python, __file__, "--worker"], input=json.dumps(req),
                              capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            sys.exit(f"llama.cpp worker failed:\n{proc.stderr[-3000:]}")
        with np.load(out) as z:
            arrays = {k: z[k] for k in z.files}
        result: dict[str, np.ndarray] = {
            "mmproj_sha256": np.array(hashlib.sha256(mmproj.read_bytes()).hexdigest()),
            "llama_cpp_version": arrays["version"],
        }
        for i, img in enumerate(images):
            result[f"image{i}"] = img
            result[f"embd{i}"] = arrays[f"embd{i}"].astype(np.float32)
        np.savez_compressed(OUT / "gemma3.npz", **result)
        print(f"wrote {OUT / 'gemma3.npz'}: " + ", ".join(f"embd{i} {result[f'embd{i}'].shape}"
                                                          for i in range(len(images))))


if __name__ == "__main__":
    main()
