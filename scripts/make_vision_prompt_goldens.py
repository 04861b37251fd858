"""Goldens for prompts holding several images: llama.cpp's mtmd per-position logits of a Gemma 3 prompt with two
images, for tests/engine/test_images.py (the engine's layout, placement, bidirectional ranges and chunking).

goldens: tests/goldens/vision/gemma3_two_images.npz

The reference is llama-cpp-python 0.3.36's mtmd bindings (its own venv, CPU, flash attention off, llama.cpp's
extra CPU buffer types off: this build crashes on AVX-512 + AMX machines with them). The worker loads the tiny
text model (tiny_gemma.write_tiny_gemma3) and its mmproj (tiny_vision.write_tiny_gemma3_mmproj), hands the
images' raw RGB pixels to mtmd_bitmap_init, tokenizes PROMPT (mtmd's marker once per image, add_special off)
with mtmd_tokenize, decodes each text chunk causally with every row's logits and each image chunk with
mtmd_helper_eval_chunk_single (non-causal for Gemma 3).

The npz holds: tokens [N] (-1 at image rows), logits [text rows, V] in row order, image<i> [H, W, 3] uint8,
prompt, text_sha256 / mmproj_sha256 (of the files the seeds write), llama_cpp_version.

Regenerate (from the repo root, with the project venv):
    .venv/bin/python scripts/make_vision_prompt_goldens.py [--llama-python PY]
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
OUT = ROOT / "tests" / "goldens" / "vision" / "gemma3_two_images.npz"
SEED = 0
IMAGES = [(100, 70, 2), (30, 90, 4)]   # (width, height, seed) of tiny_vision.sample_image
PROMPT = ("First <__media__> then the second picture <__media__> Which of the two shows more red, and why is "
          "the sky so blue in both of them today?")


def worker() -> None:
    """stdin: {"text", "mmproj", "images": [npy paths], "prompt", "out"}; writes tokens and logits."""
    import ctypes

    import llama_cpp
    import llama_cpp.mtmd_cpp as mtmd

    req = json.load(sys.stdin)
    mparams = llama_cpp.llama_model_default_params()
    mparams.use_extra_bufts = False
    mparams.n_gpu_layers = 0
    model = llama_cpp.llama_model_load_from_file(req["text"].encode(), mparams)
    assert model, "text model failed to load"
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
    assert ctx, "mmproj failed to load"
    bitmaps = []
    for path in req["images"]:
        img = np.ascontiguousarray(np.load(path))
        buf = (ctypes.c_uint8 * img.size).from_buffer_copy(img.tobytes())
        bitmaps.append(mtmd.mtmd_bitmap_init(img.shape[1], img.shape[0], buf))
    text = mtmd.mtmd_input_text()
    raw = req["prompt"].encode()
    text.text, text.text_len, text.add_special, text.parse_special = raw, len(raw), False, True
    chunks = mtmd.mtmd_input_chunks_init()
    arr = (mtmd.mtmd_bitmap_p_ctypes * len(bitmaps))(*bitmaps)
    assert mtmd.mtmd_tokenize(ctx, chunks, ctypes.byref(text), arr, len(bitmaps)) == 0
    tokens: list[int] = []
    logits: list[np.ndarray] = []
    for c in range(mtmd.mtmd_input_chunks_size(chunks)):
        chunk = mtmd.mtmd_input_chunks_get(chunks, c)
        if mtmd.mtmd_input_chunk_get_type(chunk) == mtmd.MTMD_INPUT_CHUNK_TYPE_TEXT:
            n = ctypes.c_size_t()
            ptr = mtmd.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(n))
            ids = [int(ptr[j]) for j in range(n.value)]
            batch = llama_cpp.llama_batch_init(len(ids), 0, 1)
            for j, tok in enumerate(ids):
                batch.token[j], batch.pos[j], batch.n_seq_id[j] = tok, len(tokens) + j, 1
                batch.seq_id[j][0], batch.logits[j] = 0, 1
            batch.n_tokens = len(ids)
            assert llama_cpp.llama_decode(lctx, batch) == 0
            logits += [np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(lctx, j), shape=(n_vocab,)).copy()
                       for j in range(len(ids))]
            llama_cpp.llama_batch_free(batch)
            tokens += ids
            continue
        n_img = mtmd.mtmd_input_chunk_get_n_tokens(chunk)
        new_past = llama_cpp.llama_pos(0)
        assert mtmd.mtmd_helper_eval_chunk_single(ctx, lctx, chunk, len(tokens), 0, 256, False,
                                                  ctypes.byref(new_past)) == 0
        tokens += [-1] * n_img
        assert new_past.value == len(tokens)
    np.savez(req["out"], tokens=np.array(tokens, dtype=np.int64), logits=np.stack(logits).astype(np.float32),
             version=np.array(llama_cpp.__version__))


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
        req = {"text": str(text), "mmproj": str(mmproj), "images": paths, "prompt": PROMPT, "out": str(out)}
        proc = subprocess.run(["nice", args.llama_python, __file__, "--worker"], input=json.dumps(req),
                              capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            sys.exit(f"llama.cpp worker failed:\n{proc.stderr[-3000:]}")
        with np.load(out) as z:
            result = {"tokens": z["tokens"], "logits": z["logits"], "llama_cpp_version": z["version"]}
        result.update({f"image{i}": img for i, img in enumerate(images)})
        result.update(prompt=np.array(PROMPT),
                      text_sha256=np.array(hashlib.sha256(text.read_bytes()).hexdigest()),
                      mmproj_sha256=np.array(hashlib.sha256(mmproj.read_bytes()).hexdigest()))
        OUT.parent.mkdir(parents=True, exist_ok=True)
        np.savez_compressed(OUT, **result)
        print(f"wrote {OUT}: {len(result['tokens'])} positions, {len(result['logits'])} text rows")


if __name__ == "__main__":
    main()
