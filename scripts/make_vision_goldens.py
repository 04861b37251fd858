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
image<i> [H, W, 3] uint8 and embd<i> [n_tokens, n_embd] float32. And a prompt holding image PROMPT_IMAGE
(prompt_worker: mtmd_tokenize, text chunks decoded causally with every row's logits, the image chunk by
mtmd_helper_eval_chunk_single, non-causal for Gemma 3): prompt_tokens [N] (-1 at the image's rows),
prompt_logits [text rows, V] in row order, prompt_embd (the image's embeddings as llama.cpp computed them),
prompt_image, text_sha256 (of write_tiny_gemma3(seed)).

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
# the prompt around an image (mtmd's default marker where it goes) and which of IMAGES it holds
PROMPT = "Look at this: <__media__> It shows a small cat on a red mat, and the sky is blue today."
PROMPT_IMAGE = 0


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
    n_embd = llama_cpp.llama_model_n_embd_inp(model)   # the image rows' width (Qwen3-VL: with DeepStack)
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


def _decode_text(llama_cpp, lctx, tokens: list[int], n_past: int, n_vocab: int) -> np.ndarray:
    """Decode `tokens` at positions n_past.. in one batch, causally; their logits [n, V]."""
    n = len(tokens)
    batch = llama_cpp.llama_batch_init(n, 0, 1)
    for j, tok in enumerate(tokens):
        batch.token[j], batch.pos[j], batch.n_seq_id[j] = tok, n_past + j, 1
        batch.seq_id[j][0], batch.logits[j] = 0, 1
    batch.n_tokens = n
    assert llama_cpp.llama_decode(lctx, batch) == 0
    out = np.stack([np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(lctx, j), shape=(n_vocab,)).copy()
                    for j in range(n)])
    llama_cpp.llama_batch_free(batch)
    return out


def prompt_worker() -> None:
    """stdin: {"text", "mmproj", "image" (npy path), "prompt" (holding mtmd's marker), "out"}; writes the
    prompt's chunks as llama.cpp lays them out (tokens, -1 at image rows), the image's embeddings and the
    logits of every text row (image rows have none: llama.cpp decodes them from embeddings, non-causally
    for Gemma 3, mtmd_helper_eval_chunk_single)."""
    import ctypes

    import llama_cpp
    import llama_cpp.mtmd_cpp as mtmd

    req = json.load(sys.stdin)
    mparams = llama_cpp.llama_model_default_params()
    mparams.use_extra_bufts = False
    mparams.n_gpu_layers = 0
    model = llama_cpp.llama_model_load_from_file(req["text"].encode(), mparams)
    cp = llama_cpp.llama_context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_threads, cp.n_threads_batch = 256, 256, 256, 2, 2
    cp.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
    cp.type_k = cp.type_v = 0
    cp.swa_full = True
    lctx = llama_cpp.llama_init_from_model(model, cp)
    n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model))
    cparams = mtmd.mtmd_context_params_default()
    cparams.use_gpu, cparams.n_threads, cparams.warmup = False, 2, False
    cparams.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
    ctx = mtmd.mtmd_init_from_file(req["mmproj"].encode(), model, cparams)
    img = np.ascontiguousarray(np.load(req["image"]))
    buf = (ctypes.c_uint8 * img.size).from_buffer_copy(img.tobytes())
    bitmap = mtmd.mtmd_bitmap_init(img.shape[1], img.shape[0], buf)
    text = mtmd.mtmd_input_text()
    raw = req["prompt"].encode()
    text.text, text.text_len, text.add_special, text.parse_special = raw, len(raw), False, True
    chunks = mtmd.mtmd_input_chunks_init()
    assert mtmd.mtmd_tokenize(ctx, chunks, ctypes.byref(text), (mtmd.mtmd_bitmap_p_ctypes * 1)(bitmap), 1) == 0
    tokens: list[int] = []
    logits: list[np.ndarray] = []
    embd = None
    for c in range(mtmd.mtmd_input_chunks_size(chunks)):
        chunk = mtmd.mtmd_input_chunks_get(chunks, c)
        if mtmd.mtmd_input_chunk_get_type(chunk) == mtmd.MTMD_INPUT_CHUNK_TYPE_TEXT:
            n = ctypes.c_size_t()
            ptr = mtmd.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(n))
            ids = [int(ptr[j]) for j in range(n.value)]
            logits.append(_decode_text(llama_cpp, lctx, ids, len(tokens), n_vocab))
            tokens += ids
            continue
        n_img = mtmd.mtmd_input_chunk_get_n_tokens(chunk)
        new_past = llama_cpp.llama_pos(0)
        assert mtmd.mtmd_helper_eval_chunk_single(ctx, lctx, chunk, len(tokens), 0, 256, False,
                                                  ctypes.byref(new_past)) == 0
        n_embd = llama_cpp.llama_model_n_embd(model)
        embd = np.ctypeslib.as_array(mtmd.mtmd_get_output_embd(ctx), shape=(n_img * n_embd,)).reshape(n_img, -1).copy()
        tokens += [-1] * n_img
        assert new_past.value == len(tokens)
    np.savez(req["out"], tokens=np.array(tokens, dtype=np.int64), logits=np.concatenate(logits).astype(np.float32),
             embd=embd, version=np.array(llama_cpp.__version__))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-python", default="/work/venvs/llamacpp/bin/python")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--prompt-worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker()
        return
    if args.prompt_worker:
        prompt_worker()
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
        np.save(t / "prompt_img.npy", images[PROMPT_IMAGE])
        out2 = t / "prompt.npz"
        req = {"text": str(text), "mmproj": str(mmproj), "image": str(t / "prompt_img.npy"), "out": str(out2),
               "prompt": PROMPT}
        proc = subprocess.run(["nice", args.llama_python, __file__, "--prompt-worker"], input=json.dumps(req),
                              capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            sys.exit(f"llama.cpp prompt worker failed:\n{proc.stderr[-3000:]}")
        with np.load(out2) as z:
            result.update(prompt_tokens=z["tokens"], prompt_logits=z["logits"], prompt_embd=z["embd"],
                          prompt_image=np.array(PROMPT_IMAGE),
                          text_sha256=np.array(hashlib.sha256(text.read_bytes()).hexdigest()))
        np.savez_compressed(OUT / "gemma3.npz", **result)
        print(f"wrote {OUT / 'gemma3.npz'}: " + ", ".join(f"embd{i} {result[f'embd{i}'].shape}"
                                                          for i in range(len(images))))


if __name__ == "__main__":
    main()
