"""Vision encoder speed: hitenter vs llama.cpp's mtmd on the same synthetic mmproj and image, same run,
alternating rounds.

    .venv/bin/python bench/vision_encoder.py [--shape gemma3-4b|qwen2.5-vl-3b|qwen3-vl-2b|gemma4-e4b|all]
        [--layers N] [--rounds 3] [--threads 2] [--llama-python /work/venvs/llamacpp/bin/python]

Files: random mmproj GGUFs of a real tower's widths written with llama.cpp's tensor names and metadata
(hitenter.testing.tiny_vision / tiny_qwen_vision writers with the shape's sizes), F32:
- ``gemma3-4b``: Gemma 3 4B's SigLIP (896 x 896, patch 14, hidden 1152, 16 heads, ffn 4304; projector to
  2560): 4096 patches, 256 tokens;
- ``qwen2.5-vl-3b``: Qwen2.5-VL-3B's tower (patch 14, hidden 1280, 16 heads, ffn 3420, window attention with
  every 8th layer full; merger to 2048) on a 448 x 336 image: 768 patches, 192 tokens;
- ``qwen3-vl-2b``: Qwen3-VL-2B's tower (patch 16, hidden 1024, 16 heads, ffn 4096, learned 48 x 48
  positions, DeepStack after layers 1 and 3 where kept; merger to 2048) on the same image: 616 patches, 154 tokens;
- ``gemma4-e4b``: Gemma 4 E4B's tower (projector gemma4v: patch 16, hidden 768, 12 heads, ffn 3072, 3 x 3
  pooling; projection to 2560; hitenter.testing.tiny_gemma4v) on a 640 x 480 image: 1170 patches, 130 tokens.
``--layers`` keeps the first N layers (default 8; the real towers have 27 / 32 / 24 / 16: the time per layer is
what compares). The text model beside each (llama.cpp needs one for the output width) is a tiny qwen2vl
file of the projector's width (qwen3vl with the DeepStack count for Qwen3-VL).

Timed: hitenter ``encoder.prepare(rgb)`` + ``encoder.encode`` (preprocessing, tower, projector); llama.cpp
``mtmd_tokenize`` (its preprocessing) + ``mtmd_encode_chunk``, in a worker process of the llama-cpp-python
venv kept across rounds (extra CPU buffer types off: this build crashes with them on AMX machines; flash
attention off, no warmup). Both get ``--threads`` threads. Medians over rounds and their ratio
(llama.cpp / hitenter: > 1 means hitenter is faster); ``uptime`` before and after, since other work may share
the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

SHAPES: dict[str, dict[str, Any]] = {
    "gemma3-4b": {"writer": "gemma3", "hidden": 1152, "ffn": 4304, "heads": 16, "patch": 14, "image_size": 896,
                  "out": 2560, "image": (640, 480)},
    "qwen2.5-vl-3b": {"writer": "qwen25vl", "hidden": 1280, "ffn": 3420, "heads": 16, "patch": 14, "out": 2048,
                      "n_wa_pattern": 8, "image": (448, 336)},
    "qwen3-vl-2b": {"writer": "qwen3vl", "hidden": 1024, "ffn": 4096, "heads": 16, "patch": 16, "image_size": 768,
                    "out": 2048, "deepstack": (1, 3), "image": (448, 336)},
    "gemma4-e4b": {"writer": "gemma4v", "hidden": 768, "ffn": 3072, "heads": 12, "patch": 16, "out": 2560,
                   "image": (640, 480)},
}


def worker() -> None:
    """stdin: one JSON line {"text", "mmproj", "image", "threads"}, then a line per round; stdout: seconds."""
    import ctypes

    import llama_cpp
    import llama_cpp.mtmd_cpp as mtmd
    import numpy as np

    req = json.loads(sys.stdin.readline())
    mp = llama_cpp.llama_model_default_params()
    mp.use_extra_bufts, mp.n_gpu_layers = False, 0
    model = llama_cpp.llama_model_load_from_file(req["text"].encode(), mp)
    cp = mtmd.mtmd_context_params_default()
    cp.use_gpu, cp.n_threads, cp.warmup = False, int(req["threads"]), False
    cp.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
    ctx = mtmd.mtmd_init_from_file(req["mmproj"].encode(), model, cp)
    img = np.ascontiguousarray(np.load(req["image"]))
    buf = (ctypes.c_uint8 * img.size).from_buffer_copy(img.tobytes())
    print("ready", flush=True)
    for _ in sys.stdin:
        t0 = time.perf_counter()
        bitmap = mtmd.mtmd_bitmap_init(img.shape[1], img.shape[0], buf)
        text = mtmd.mtmd_input_text()
        raw = mtmd.mtmd_default_marker()
        text.text, text.text_len, text.add_special, text.parse_special = raw, len(raw), False, True
        chunks = mtmd.mtmd_input_chunks_init()
        assert mtmd.mtmd_tokenize(ctx, chunks, ctypes.byref(text), (mtmd.mtmd_bitmap_p_ctypes * 1)(bitmap), 1) == 0
        for c in range(mtmd.mtmd_input_chunks_size(chunks)):
            chunk = mtmd.mtmd_input_chunks_get(chunks, c)
            if mtmd.mtmd_input_chunk_get_type(chunk) == mtmd.MTMD_INPUT_CHUNK_TYPE_IMAGE:
                assert mtmd.mtmd_encode_chunk(ctx, chunk) == 0
        print(time.perf_counter() - t0, flush=True)
        mtmd.mtmd_input_chunks_free(chunks)
        mtmd.mtmd_bitmap_free(bitmap)


def write_files(shape: dict[str, Any], layers: int, d: Path) -> tuple[Path, Path]:
    from hitenter.testing.tiny_gemma4v import write_tiny_gemma4v_mmproj
    from hitenter.testing.tiny_qwen_vision import (
        write_tiny_qwen3vl_mmproj,
        write_tiny_qwen25vl_mmproj,
        write_tiny_qwen_vl_text,
    )
    from hitenter.testing.tiny_vision import write_tiny_gemma3_mmproj

    common = {"text_hidden": shape["out"], "hidden": shape["hidden"], "ffn": shape["ffn"], "layers": layers,
              "heads": shape["heads"], "patch_size": shape["patch"]}
    mm = d / "mmproj.gguf"
    deepstack: tuple[int, ...] = ()
    if shape["writer"] == "gemma3":
        write_tiny_gemma3_mmproj(mm, image_size=shape["image_size"], **common)
    elif shape["writer"] == "gemma4v":
        write_tiny_gemma4v_mmproj(mm, **common)
    elif shape["writer"] == "qwen25vl":
        write_tiny_qwen25vl_mmproj(mm, n_wa_pattern=shape["n_wa_pattern"], **common)
    else:
        deepstack = tuple(i for i in shape["deepstack"] if i < layers)
        write_tiny_qwen3vl_mmproj(mm, image_size=shape["image_size"], deepstack=deepstack, **common)
    if deepstack:   # the text model's input is as wide as the encoder's rows (n_embd_inp)
        text = write_tiny_qwen_vl_text(d / "text.gguf", "qwen3vl", hidden=shape["out"], layers=len(deepstack),
                                       heads=4, kv_heads=2, ffn=128, deepstack=len(deepstack))
    else:
        text = write_tiny_qwen_vl_text(d / "text.gguf", "qwen2vl", hidden=shape["out"], layers=1,
                                       heads=shape["out"] // 16, kv_heads=2, ffn=128)
    return text, mm


def run_shape(name: str, args: argparse.Namespace) -> dict[str, Any]:
    import numpy as np
    import torch
    from common import baseline_env

    from hitenter.models.vision.loader import load_vision_encoder
    from hitenter.testing.tiny_vision import sample_image

    torch.set_num_threads(args.threads)
    shape = SHAPES[name]
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        text, mm = write_files(shape, args.layers, d)
        rgb = sample_image(*shape["image"], seed=5)
        np.save(d / "img.npy", rgb)
        enc = load_vision_encoder(mm)
        proc = subprocess.Popen(["nice", "-n", "0", args.llama_python, __file__, "--worker"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=baseline_env())
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(json.dumps({"text": str(text), "mmproj": str(mm), "image": str(d / "img.npy"),
                                     "threads": args.threads}) + "\n")
        proc.stdin.flush()
        if proc.stdout.readline().strip() != "ready":
            sys.exit("llama.cpp worker failed to start")
        ours: list[float] = []
        theirs: list[float] = []
        tokens = 0

        def run_ours() -> None:
            nonlocal tokens
            t0 = time.perf_counter()
            tokens = int(enc.encode(enc.prepare(rgb)).shape[0])
            ours.append(time.perf_counter() - t0)

        def run_theirs() -> None:
            proc.stdin.write("run\n")
            proc.stdin.flush()
            theirs.append(float(proc.stdout.readline()))

        for r in range(args.rounds + 1):   # round 0 warms both up and is not counted
            for f in (run_ours, run_theirs) if r % 2 == 0 else (run_theirs, run_ours):
                f()
            if r == 0:
                ours.clear()
                theirs.clear()
        proc.stdin.close()
        proc.wait()
    med_o, med_t = statistics.median(ours), statistics.median(theirs)
    return {"shape": name, "layers": args.layers, "tokens": tokens, "hitenter_s": med_o, "llamacpp_s": med_t,
            "ratio": med_t / med_o}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="all", choices=[*SHAPES, "all"])
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--llama-python", default="/work/venvs/llamacpp/bin/python")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker()
        return
    from common import emit_json, table

    print("uptime before:", os.getloadavg())
    rows = [run_shape(s, args) for s in (SHAPES if args.shape == "all" else [args.shape])]
    print("uptime after:", os.getloadavg())
    print(table([[r["shape"], r["layers"], r["tokens"], r["hitenter_s"], r["llamacpp_s"], r["ratio"]] for r in rows],
                ["shape", "layers", "tokens", "hitenter s", "llama.cpp s", "llama.cpp / hitenter"]))
    emit_json("vision_encoder", {"threads": args.threads, "rounds": args.rounds, "results": rows,
                                 "load": os.getloadavg()})


if __name__ == "__main__":
    main()
