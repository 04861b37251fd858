"""Goldens for the dynamic-size vision encoders: llama.cpp's mtmd image embeddings of tiny random mmproj
files (Qwen2.5-VL, Qwen3-VL, Pixtral, Gemma 4), and the logits of a prompt holding an image (M-RoPE
positions for the Qwen-VL ones).

goldens: tests/goldens/vision/qwen25vl.npz, qwen2vl.npz, qwen3vl.npz and qwen3vlmoe.npz, checked by
tests/models/vision/test_qwen_vision.py and test_qwen_prompt.py; pixtral.npz, checked by
tests/models/vision/test_pixtral.py; gemma4v.npz, checked by tests/models/vision/test_gemma4v.py.

The reference is llama-cpp-python 0.3.36's mtmd bindings (its own venv, CPU, flash attention off, extra CPU
buffer types off: this build crashes with them on AVX-512 + AMX machines). The embeddings come from
scripts/make_vision_goldens.py's worker (raw RGB pixels to mtmd_bitmap_init, "<__media__>" tokenized,
mtmd_encode_chunk, mtmd_get_output_embd), run here on the tiny text model (hitenter/testing/
tiny_qwen_vision.py write_tiny_qwen_vl_text: qwen2vl / qwen3vl, whose n_embd_inp is the mmproj's output
width; Pixtral: tiny_families.py's mistral3; Gemma 4: its gemma4) and mmproj (write_tiny_qwen25vl_mmproj /
write_tiny_qwen3vl_mmproj, tiny_pixtral.py write_tiny_pixtral_mmproj, tiny_gemma4v.py write_tiny_gemma4v_mmproj).
The prompt worker below
tokenizes PROMPT with the image (mtmd_tokenize: text, <|vision_start|>, the image chunk, <|vision_end|>,
text; Pixtral: the image chunk, [IMG_END], text), decodes text chunks as token batches at positions
n_past.. (one position on every M-RoPE axis, the 4th 0: llama.cpp's llm_graph_input_pos) with every row's
logits, and the image chunk by mtmd_helper_eval_chunk_single (M-RoPE: t = n_past, h = n_past + row,
w = n_past + column per token; n_past then advances by max(rows, columns) of the token grid, not by the
token count; Pixtral: one position per row, causal; Gemma 4: `<|image>`, the image chunk, `<image|>`,
one position per row, decoded non-causally (mtmd_decode_use_non_causal: llama.cpp's SWA_ONLY mask, the
sliding-window layers bidirectional over the image, the global ones causal)).

Each npz holds: mmproj_sha256, text_sha256, llama_cpp_version, per image i image<i> [H, W, 3] uint8 and
embd<i> [n_tokens, n_embd_inp] float32; prompt_tokens [N] (-1 at image rows), prompt_pos [N] (each row's
first M-RoPE position, as llama.cpp placed it), prompt_grid [2] (token rows, columns of the image, as
mtmd reports them), prompt_logits [text rows, V], prompt_embd, prompt_image; for the IMAGE_LOGITS families
prompt_image_logits [image rows, V] (the image chunk decoded as one embedding batch by hand, with outputs).

Regenerate (from the repo root, with the project venv):
    .venv/bin/python scripts/make_dynamic_vision_goldens.py [--llama-python PY]
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
# (width, height, seed) per family: upscaled to the minimum pixels, several windows cut by the grid, tall,
# and (Qwen3-VL) the position table's own size
IMAGES = {
    "qwen25vl": [(48, 40, 1), (300, 200, 2), (90, 250, 3), (224, 224, 4)],
    "qwen2vl": [(48, 40, 1), (300, 200, 2), (90, 250, 3)],
    "qwen3vl": [(48, 40, 1), (300, 200, 2), (30, 90, 3), (96, 96, 4)],
    "qwen3vlmoe": [(300, 200, 2)],
    "pixtral": [(48, 40, 1), (100, 70, 2), (30, 90, 3), (500, 400, 4), (700, 600, 5)],   # the last over the maximum
    # Gemma 4 (12-pixel tokens, 70..1120 of them): upscaled to the minimum, near it, tall, over a few hundred
    "gemma4v": [(48, 40, 1), (100, 70, 2), (30, 90, 3), (300, 200, 4)],
}
TEXT_ARCH = {"qwen25vl": "qwen2vl", "qwen2vl": "qwen2vl", "qwen3vl": "qwen3vl", "qwen3vlmoe": "qwen3vlmoe",
             "pixtral": "mistral3", "gemma4v": "gemma4"}
PROMPT = "Look at this: <__media__> It shows a small cat on a red mat, and the sky is blue today."
# the families whose image rows' logits are kept too (prompt_image_logits): Gemma 4's attention over its image
# differs by layer (bidirectional on the sliding-window layers only), which the tiny model's text rows do not see
IMAGE_LOGITS = ("gemma4v",)
PROMPT_IMAGE = 1   # or a family's last image where it has fewer (qwen3vlmoe: the Qwen3-VL mmproj, MoE text)


def prompt_worker() -> None:
    """stdin: {"text", "mmproj", "image" (npy path), "prompt", "out"}; see the module docstring."""
    import ctypes

    import llama_cpp
    import llama_cpp.mtmd_cpp as mtmd

    req = json.load(sys.stdin)
    mparams = llama_cpp.llama_model_default_params()
    mparams.use_extra_bufts = False
    mparams.n_gpu_layers = 0
    model = llama_cpp.llama_model_load_from_file(req["text"].encode(), mparams)
    cp = llama_cpp.llama_context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_threads, cp.n_threads_batch = 512, 512, 512, 2, 2
    cp.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
    cp.type_k = cp.type_v = 0
    lctx = llama_cpp.llama_init_from_model(model, cp)
    n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model))
    cparams = mtmd.mtmd_context_params_default()
    cparams.use_gpu, cparams.n_threads, cparams.warmup = False, 2, False
    cparams.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
    ctx = mtmd.mtmd_init_from_file(req["mmproj"].encode(), model, cparams)
    use_mrope = mtmd.mtmd_decode_use_mrope(ctx)
    img = np.ascontiguousarray(np.load(req["image"]))
    buf = (ctypes.c_uint8 * img.size).from_buffer_copy(img.tobytes())
    bitmap = mtmd.mtmd_bitmap_init(img.shape[1], img.shape[0], buf)
    text = mtmd.mtmd_input_text()
    raw = req["prompt"].encode()
    text.text, text.text_len, text.add_special, text.parse_special = raw, len(raw), False, True
    chunks = mtmd.mtmd_input_chunks_init()
    assert mtmd.mtmd_tokenize(ctx, chunks, ctypes.byref(text), (mtmd.mtmd_bitmap_p_ctypes * 1)(bitmap), 1) == 0
    tokens: list[int] = []
    pos: list[int] = []
    logits: list[np.ndarray] = []
    embd, grid, n_past, image_logits = None, None, 0, np.zeros((0, n_vocab), np.float32)
    n_embd = llama_cpp.llama_model_n_embd_inp(model)
    for c in range(mtmd.mtmd_input_chunks_size(chunks)):
        chunk = mtmd.mtmd_input_chunks_get(chunks, c)
        if mtmd.mtmd_input_chunk_get_type(chunk) == mtmd.MTMD_INPUT_CHUNK_TYPE_TEXT:
            n = ctypes.c_size_t()
            ptr = mtmd.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(n))
            ids = [int(ptr[j]) for j in range(n.value)]
            batch = llama_cpp.llama_batch_init(len(ids), 0, 1)
            for j, tok in enumerate(ids):
                batch.token[j], batch.pos[j], batch.n_seq_id[j] = tok, n_past + j, 1
                batch.seq_id[j][0], batch.logits[j] = 0, 1
            batch.n_tokens = len(ids)
            assert llama_cpp.llama_decode(lctx, batch) == 0
            logits.append(np.stack([np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(lctx, j),
                                                          shape=(n_vocab,)).copy() for j in range(len(ids))]))
            llama_cpp.llama_batch_free(batch)
            tokens += ids
            pos += [n_past + j for j in range(len(ids))]
            n_past += len(ids)
            continue
        image_tokens = mtmd.mtmd_input_chunk_get_tokens_image(chunk)
        grid = (mtmd.mtmd_image_tokens_get_ny(image_tokens), mtmd.mtmd_image_tokens_get_nx(image_tokens))
        n_img = mtmd.mtmd_input_chunk_get_n_tokens(chunk)
        if req.get("image_logits"):   # as mtmd_helper_decode_image_chunk, with every image row's logits
            assert not use_mrope and mtmd.mtmd_encode_chunk(ctx, chunk) == 0
            embd = np.ctypeslib.as_array(mtmd.mtmd_get_output_embd(ctx), shape=(n_img * n_embd,))
            embd = embd.reshape(n_img, -1).copy()
            image_logits = _decode_embd(lctx, embd, n_past, n_vocab, mtmd.mtmd_decode_use_non_causal(ctx, chunk))
            tokens += [-1] * n_img
            pos += [n_past + j for j in range(n_img)]
            n_past += n_img
            continue
        new_past = llama_cpp.llama_pos(0)
        assert mtmd.mtmd_helper_eval_chunk_single(ctx, lctx, chunk, n_past, 0, 512, False,
                                                  ctypes.byref(new_past)) == 0
        embd = np.ctypeslib.as_array(mtmd.mtmd_get_output_embd(ctx), shape=(n_img * n_embd,)).reshape(n_img, -1).copy()
        tokens += [-1] * n_img
        pos += [n_past] * n_img if use_mrope else [n_past + j for j in range(n_img)]
        n_past = new_past.value
    np.savez(req["out"], tokens=np.array(tokens, dtype=np.int64), pos=np.array(pos, dtype=np.int64),
             grid=np.array(grid, dtype=np.int64), logits=np.concatenate(logits).astype(np.float32), embd=embd,
             image_logits=image_logits.astype(np.float32), version=np.array(llama_cpp.__version__))


def _decode_embd(lctx: object, embd: np.ndarray, n_past: int, n_vocab: int, non_causal: bool) -> np.ndarray:
    """One embedding batch of the image rows at positions n_past.. (non-causal where mtmd says), every
    row's logits [rows, V] (what mtmd_helper_decode_image_chunk decodes, its outputs kept)."""
    import llama_cpp

    n, width = embd.shape
    batch = llama_cpp.llama_batch_init(n, width, 1)
    flat = np.ascontiguousarray(embd, dtype=np.float32).reshape(-1)
    for k, v in enumerate(flat.tolist()):
        batch.embd[k] = v
    for j in range(n):
        batch.pos[j], batch.n_seq_id[j], batch.seq_id[j][0], batch.logits[j] = n_past + j, 1, 0, 1
    batch.n_tokens = n
    llama_cpp.llama_set_causal_attn(lctx, not non_causal)
    assert llama_cpp.llama_decode(lctx, batch) == 0
    llama_cpp.llama_set_causal_attn(lctx, True)
    out = np.stack([np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(lctx, j), shape=(n_vocab,)).copy()
                    for j in range(n)])
    llama_cpp.llama_batch_free(batch)
    return out


def _run(llama_python: str, mode: str, req: dict) -> dict[str, np.ndarray]:
    script = Path(__file__).with_name("make_vision_goldens.py") if mode == "--worker" else Path(__file__)
    proc = subprocess.run(["nice", llama_python, str(script), mode], input=json.dumps(req),
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        sys.exit(f"llama.cpp {mode} failed:\n{proc.stderr[-3000:]}")
    with np.load(req["out"]) as z:
        return {k: z[k] for k in z.files}


def make(family: str, llama_python: str, tmp: Path) -> Path:
    from hitenter.testing.tiny_families import write_tiny_family
    from hitenter.testing.tiny_gemma4v import write_tiny_gemma4v_mmproj
    from hitenter.testing.tiny_pixtral import write_tiny_pixtral_mmproj
    from hitenter.testing.tiny_qwen_vision import (
        write_tiny_qwen2vl_mmproj,
        write_tiny_qwen3vl_mmproj,
        write_tiny_qwen25vl_mmproj,
        write_tiny_qwen_vl_text,
    )
    from hitenter.testing.tiny_vision import sample_image

    if family in ("pixtral", "gemma4v"):
        text = write_tiny_family(tmp / f"{family}-text.gguf", TEXT_ARCH[family], seed=SEED)
    else:
        text = write_tiny_qwen_vl_text(tmp / f"{family}-text.gguf", TEXT_ARCH[family], seed=SEED)
    writer = {"qwen25vl": write_tiny_qwen25vl_mmproj, "qwen3vl": write_tiny_qwen3vl_mmproj,
              "pixtral": write_tiny_pixtral_mmproj, "qwen2vl": write_tiny_qwen2vl_mmproj,
              "qwen3vlmoe": write_tiny_qwen3vl_mmproj, "gemma4v": write_tiny_gemma4v_mmproj}[family]
    mmproj = writer(tmp / f"{family}-mmproj.gguf", seed=SEED)
    images = [sample_image(w, h, s) for w, h, s in IMAGES[family]]
    paths = []
    for i, img in enumerate(images):
        paths.append(str(tmp / f"{family}-img{i}.npy"))
        np.save(paths[-1], img)
    arrays = _run(llama_python, "--worker", {"text": str(text), "mmproj": str(mmproj), "images": paths,
                                             "out": str(tmp / f"{family}-embd.npz")})
    result: dict[str, np.ndarray] = {
        "mmproj_sha256": np.array(hashlib.sha256(mmproj.read_bytes()).hexdigest()),
        "text_sha256": np.array(hashlib.sha256(text.read_bytes()).hexdigest()),
        "llama_cpp_version": arrays["version"],
    }
    for i, img in enumerate(images):
        result[f"image{i}"], result[f"embd{i}"] = img, arrays[f"embd{i}"].astype(np.float32)
    which = min(PROMPT_IMAGE, len(images) - 1)
    p = _run(llama_python, "--prompt-worker", {"text": str(text), "mmproj": str(mmproj), "image": paths[which],
                                               "prompt": PROMPT, "out": str(tmp / f"{family}-prompt.npz"),
                                               "image_logits": family in IMAGE_LOGITS})
    result.update(prompt_tokens=p["tokens"], prompt_pos=p["pos"], prompt_grid=p["grid"], prompt_logits=p["logits"],
                  prompt_embd=p["embd"], prompt_image=np.array(which))
    if family in IMAGE_LOGITS:
        result["prompt_image_logits"] = p["image_logits"]
    out = OUT / f"{family}.npz"
    np.savez_compressed(out, **result)
    print(f"wrote {out}: " + ", ".join(f"embd{i} {result[f'embd{i}'].shape}" for i in range(len(images)))
          + f", prompt {len(p['tokens'])} rows, image grid {tuple(p['grid'])}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-python", default="/work/venvs/llamacpp/bin/python")
    ap.add_argument("--family", choices=sorted(IMAGES), action="append")
    ap.add_argument("--prompt-worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.prompt_worker:
        prompt_worker()
        return
    sys.path.insert(0, str(ROOT))
    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for family in args.family or sorted(IMAGES):
            make(family, args.llama_python, Path(tmp))


if __name__ == "__main__":
    main()
