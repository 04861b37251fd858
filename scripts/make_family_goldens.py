"""Write llama.cpp's per-position logits on the tiny family GGUFs (hitenter/testing/tiny_families.py) as
goldens: tests/goldens/families/<family>.npz, checked by tests/models/families/test_llama_cpp_logits.py.

Reference: llama.cpp through llama-cpp-python 0.3.36 in its own venv (not a hitenter dependency):
    python3 -m venv /work/venvs/llamacpp
    CMAKE_BUILD_PARALLEL_LEVEL=2 /work/venvs/llamacpp/bin/pip install llama-cpp-python==0.3.36 numpy
It runs as a worker subprocess (this file with --worker): `Llama(path, n_ctx, n_batch >= len(tokens),
logits_all=True, type_k=type_v=0 (F32 KV cache), flash_attn=False, n_threads=2)`, one `eval` of the token
sequence, `scores` = the logits at every position (float32, llama.cpp's CPU backend).

Second, optional reference: HF transformers' float32 forward of the same GGUF (its GGUF loader, with the
config fixes in HF_CONFIG_FIXES for keys it does not read), in a venv with transformers, accelerate, gguf
and torch (the project venv has no accelerate), e.g.
    python3 -m venv /work/venvs/hf
    /work/venvs/hf/bin/pip install torch==2.13.0 transformers accelerate gguf
run as a second worker (--hf-worker).

Regenerate (from the repo root, with the project venv; about 5 minutes on 2 cores):
    .venv/bin/python scripts/make_family_goldens.py [--llama-python PY] [--hf-python PY] [FAMILY ...]
(defaults /work/venvs/llamacpp/bin/python and /work/venvs/hf/bin/python; --hf-python '' skips HF; no
FAMILY: all of them). The goldens are deterministic: rerunning rewrites the same bytes.

Each npz holds: tokens [40] (int32; deterministic from the seed, ids 3.. so no special token), logits
[40, V] float32, gguf_sha256 (of write_tiny_family(family, seed)), llama_cpp_version, n_ctx, seed; llama3 and
llama4 also long_tokens [8300] and long_logits [16, V] at long_positions (8284..8299, past 8192); the
Q8_FAMILIES also logits_q8_0 [40, V] and gguf_q8_0_sha256 (write_tiny_family(..., quant="Q8_0"), run with
llama.cpp's extra CPU buffer types off); phi3_partial also
logits_short [8, V]: positions 32..39 of the same tokens at n_ctx 256 <= original_context_length, where
llama.cpp uses rope_factors_short (the main logits run at n_ctx 4096 use rope_factors_long). Plus
ref64_max_rel_diff: max |llama.cpp - ref| / max |llama.cpp| against this script's own float64 numpy
forward of llama.cpp's graph (`reference_forward`, read from the same GGUF), a check that the golden is
what the module docstring of tiny_families.py says; for gemma2/gemma3 that reference emulates ggml's
GELU (its CPU op rounds the input to fp16 and looks the result up in an fp16 table) and
ref64_exact_gelu_max_rel_diff is the same against an exact tanh-GELU, i.e. how far llama.cpp's own GELU
rounding puts it from exact arithmetic (llama3: ref64_long_max_rel_diff, phi3_partial:
ref64_short_max_rel_diff for the extra runs). Where HF applies: hf_logits [8, V] at hf_positions 32..39,
hf_max_rel_diff against llama.cpp over all 40 positions (phi3_partial: against logits_short, since HF's
LongRoPE takes the short factors for a 40-token sequence), hf_version, hf_config_fixes (JSON).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests/goldens/families"
N_TOKENS, LONG_TOKENS, LONG_LAST = 40, 8300, 16
PHI3_SHORT_ROWS = HF_ROWS = slice(32, 40)
LONG_FAMILIES = ("llama3", "llama4")
# also a copy with the layers' projections in Q8_0 (llama.cpp's Q8_0 kernels: activations rounded to Q8_0
# blocks): logits_q8_0, gguf_q8_0_sha256
Q8_FAMILIES = ("olmo3", "mistral3", "llama4", "gemma4", "gemma4_moe")   # also a long_tokens run (llama4: past its 8192 chunk and temperature floor)


def golden_tokens(vocab: int, seed: int = 0, n: int = N_TOKENS) -> np.ndarray:
    """The fixed sequence: n ids in [3, vocab) (no special token), deterministic from the seed."""
    return np.random.default_rng([seed, n]).integers(3, vocab, size=n).astype(np.int32)


# ---- worker: runs inside the llama-cpp-python venv (numpy and llama_cpp only) -------------------------


def worker() -> None:
    """stdin: {"model": path, "out": npz path, "runs": [{"tokens", "n_ctx", "rows": [start, stop]}],
    "plain_buffers": bool}; writes run<i> = logits[rows] (float32) and the llama_cpp version to `out`.
    plain_buffers: llama.cpp's extra CPU buffer types off (use_extra_bufts = false, as
    scripts/make_hybrid_goldens.py: no repacked / AMX layouts, which crashed on tiny Q8_0 files)."""
    import llama_cpp
    import llama_cpp.llama as llama_module

    req = json.load(sys.stdin)
    if req.get("plain_buffers"):
        defaults = llama_cpp.llama_model_default_params

        def params():  # type: ignore[no-untyped-def]
            p = defaults()
            p.use_extra_bufts = False
            return p

        llama_module.llama_cpp.llama_model_default_params = params
    arrays: dict[str, np.ndarray] = {"version": np.array(llama_cpp.__version__)}
    for i, run in enumerate(req["runs"]):
        n = len(run["tokens"])
        llm = llama_cpp.Llama(model_path=req["model"], n_ctx=run["n_ctx"], n_batch=max(n, 64),
                              n_ubatch=min(max(n, 64), 512), n_threads=2, n_threads_batch=2, logits_all=True,
                              type_k=0, type_v=0, flash_attn=False, swa_full=True, verbose=False)
        llm.eval(run["tokens"])
        start, stop = run["rows"]
        arrays[f"run{i}"] = np.array(llm.scores[start:stop], dtype=np.float32)
        del llm
    np.savez(req["out"], **arrays)


def llama_logits(llama_python: str, model: Path, runs: list[dict],
                 plain_buffers: bool = False) -> tuple[list[np.ndarray], str]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.npz"
        req = {"model": str(model), "out": str(out), "runs": runs, "plain_buffers": plain_buffers}
        proc = subprocess.run(["nice", llama_python, __file__, "--worker"], input=json.dumps(req),
                              capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            sys.exit(f"llama.cpp worker failed on {model.name}:\n{proc.stderr[-3000:]}")
        with np.load(out) as z:
            return [z[f"run{i}"] for i in range(len(runs))], str(z["version"])


# ---- HF worker: runs in a venv with transformers + accelerate + gguf (torch CPU, float32) ----------------

# What transformers' GGUF loader does not read from these files (or reads differently from llama.cpp), given
# to from_pretrained as config overrides so that HF computes the same model; None: no HF comparison (its
# GGUF loader has no such architecture: granite, olmo2, smollm3; mixtral's experts load as a plain llama).
HF_CONFIG_FIXES: dict[str, dict | None] = {
    "llama": {},
    "llama3": {"rope_scaling": {"rope_type": "llama3", "rope_theta": 5e5, "factor": 32.0,  # not rope_freqs
                                "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                "original_max_position_embeddings": 8192}},
    "mixtral": None,
    "qwen2": {},
    "qwen3": {"head_dim": 32},                                            # attention.key_length is not read
    "qwen3moe": {"head_dim": 32, "moe_intermediate_size": 64, "norm_topk_prob": True},
    # softcaps default to 50 / 30; query_pre_attn_scalar defaults to 256 (llama.cpp: head_dim)
    "gemma2": {"attn_logit_softcapping": 5.0, "final_logit_softcapping": 10.0, "query_pre_attn_scalar": 32},
    "gemma3": {"query_pre_attn_scalar": 32},
    "phi3": {"vocab_size": 310, "pad_token_id": 2},                       # no vocab_size key for phi3
    # rope.dimension_count, the factor tensors and the original context are not read. HF's longrope picks
    # the short factors for a sequence <= original_max_position_embeddings: compare with logits_short.
    "phi3_partial": {"vocab_size": 310, "pad_token_id": 2, "original_max_position_embeddings": 256,
                     "rope_scaling": {"rope_type": "longrope", "rope_theta": 10000.0,
                                      "partial_rotary_factor": 0.5, "long_factor": [1.0, 2.5, 6.0, 16.0],
                                      "short_factor": [1.0, 1.1, 1.3, 1.7],
                                      "original_max_position_embeddings": 256}},
    "granite": None,
    "olmo2": None,
    "smollm3": None,
    # transformers 5.24's GGUF loader fails on gpt-oss's rope.scaling.* keys (it float()s a field's first
    # part, the key name, instead of its value), so no HF comparison
    "gpt-oss": None,
    "olmo3": None,
    "mistral3": None,
    "llama4": None,
    "gemma4": None,
    "gemma4_moe": None,
}


def hf_worker() -> None:
    """stdin: {"model": path, "out": npz path, "tokens": [...], "config": {...}}; writes logits [T, V]."""
    import logging
    import warnings

    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    req = json.load(sys.stdin)
    path = Path(req["model"])
    hf = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32,
                                              attn_implementation="eager", **req["config"])
    with torch.no_grad():
        logits = hf(torch.tensor([req["tokens"]])).logits[0].float().numpy()
    np.savez(req["out"], logits=logits, version=np.array(f"transformers {transformers.__version__}, "
                                                         f"torch {torch.__version__}"))


def hf_logits(hf_python: str, model: Path, tokens: np.ndarray, config: dict) -> tuple[np.ndarray, str]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.npz"
        req = {"model": str(model), "out": str(out), "tokens": tokens.tolist(), "config": config}
        proc = subprocess.run(["nice", hf_python, __file__, "--hf-worker"], input=json.dumps(req),
                              capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            sys.exit(f"HF worker failed on {model.name}:\n{proc.stderr[-3000:]}")
        with np.load(out) as z:
            return z["logits"], str(z["version"])


# ---- an independent float64 forward of llama.cpp's graphs (numpy + gguf only) --------------------------

NEOX = {"qwen2", "qwen3", "qwen3moe", "gemma2", "gemma3", "phi3", "olmo2", "gpt-oss"}


def _rms(x: np.ndarray, w: np.ndarray | None, eps: float) -> np.ndarray:
    y = x / np.sqrt((x * x).mean(-1, keepdims=True) + eps)
    return y if w is None else y * w


def _gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * x * (1.0 + 0.044715 * x * x)))


def _gelu_ggml(x: np.ndarray) -> np.ndarray:
    """ggml-cpu's GELU (GGML_GELU_FP16): fp16 input -> fp16 table of gelu; 0 below -10, x above 10."""
    x16 = x.astype(np.float16).astype(np.float64)
    t = _gelu_tanh(x16).astype(np.float16).astype(np.float64)
    return np.where(x <= -10, 0.0, np.where(x >= 10, x, t))


def _rope(x: np.ndarray, pos: np.ndarray, n_rot: int, base: float, neox: bool, factors: np.ndarray | None,
          mscale: float, yarn: tuple[float, int, float, float] | None = None) -> np.ndarray:
    """x [T, H, D]: ggml_rope_ext (cos, sin times mscale). yarn: (freq_scale, n_ctx_orig, beta_fast,
    beta_slow) for ext_factor 1 (ggml's rope_yarn: theta = interp * (1 - ramp) + extrap * ramp with the
    ramp between ggml_rope_yarn_corr_dims, mscale *= 1 + 0.1 ln(1 / freq_scale)); None: ext_factor 0."""
    half = n_rot // 2
    i = np.arange(half)
    theta = pos[:, None] * base ** (-2.0 * i / n_rot)
    if factors is not None:
        theta = theta / factors
    if yarn is not None:
        freq_scale, n_orig, beta_fast, beta_slow = yarn

        def corr_dim(beta: float) -> float:
            return n_rot * math.log(n_orig / (beta * 2 * math.pi)) / (2 * math.log(base))

        low = max(0.0, math.floor(corr_dim(beta_fast)))
        high = min(n_rot - 1.0, math.ceil(corr_dim(beta_slow)))
        ramp = 1 - np.clip((i - low) / max(0.001, high - low), 0, 1)
        theta = theta * freq_scale * (1 - ramp) + theta * ramp
        mscale = mscale * (1 + 0.1 * math.log(1 / freq_scale))
    cos, sin = (np.cos(theta) * mscale)[:, None], (np.sin(theta) * mscale)[:, None]
    out = x.copy()
    if neox:
        a, b = x[..., :half], x[..., half:n_rot]
        out[..., :half], out[..., half:n_rot] = a * cos - b * sin, a * sin + b * cos
    else:
        a, b = x[..., 0:n_rot:2], x[..., 1:n_rot:2]
        out[..., 0:n_rot:2], out[..., 1:n_rot:2] = a * cos - b * sin, a * sin + b * cos
    return out


def _attend(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float, window: int | None,
            softcap: float | None, sinks: np.ndarray | None = None, chunk: int | None = None) -> np.ndarray:
    """q [T, H, D], k/v [T, KV, D]: causal (and sliding: key j masked when i - j >= window) attention,
    256 queries at a time; sinks [H]: an extra logit per head in the softmax's denominator only."""
    t, h, _ = q.shape
    rep = h // k.shape[1]
    k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
    out = np.empty((t, h, v.shape[-1]))
    for start in range(0, t, 256):
        i = np.arange(start, min(t, start + 256))[:, None]
        j = np.arange(i[-1, 0] + 1)[None, :]
        s = np.einsum("ihd,jhd->hij", q[i[:, 0]], k[:j.shape[1]]) * scale
        if softcap:
            s = softcap * np.tanh(s / softcap)
        masked = (j > i) | ((i - j >= window) if window else False) | ((j < i // chunk * chunk) if chunk else False)
        s = np.where(masked[None], -np.inf, s)
        m = s.max(-1, keepdims=True)
        if sinks is not None:
            m = np.maximum(m, sinks[:, None, None])
        p = np.exp(s - m)
        p /= p.sum(-1, keepdims=True) + (0.0 if sinks is None else np.exp(sinks[:, None, None] - m))
        out[i[:, 0]] = np.einsum("hij,jhd->ihd", p, v[:j.shape[1]])
    return out.reshape(t, -1)


def _moe(y: np.ndarray, w: dict, p: str, n_used: int, oai: bool = False, llama4: bool = False) -> np.ndarray:
    """llama.cpp's build_moe_ffn. Default (SOFTMAX gating, norm_w): p = softmax(router logits), top-k by p,
    weights p_top / sum(p_top), SiLU-gated experts. oai (gpt-oss: SOFTMAX_WEIGHT, no norm_w): top-k by the
    biased logits, weights softmax(logits_top), biased experts with swiglu_oai."""
    logits = y @ w[p + "ffn_gate_inp.weight"].T + w.get(p + "ffn_gate_inp.bias", 0.0)
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    out = np.zeros_like(y)
    for t in range(len(y)):
        if oai:
            top = np.argsort(-logits[t], kind="stable")[:n_used]
            wt = np.exp(logits[t, top] - logits[t, top].max())
            wt /= wt.sum()
        elif llama4:   # top-k by the logits, weights sigmoid(logit) on the expert's input
            top = np.argsort(-logits[t], kind="stable")[:n_used]
            wt = 1 / (1 + np.exp(-logits[t, top]))
        else:
            top = np.argsort(-probs[t], kind="stable")[:n_used]
            wt = probs[t, top] / probs[t, top].sum()
        for e, we in zip(top, wt, strict=True):
            yt = y[t] * we if llama4 else y[t]
            we = 1.0 if llama4 else we
            g = w[p + "ffn_gate_exps.weight"][e] @ yt
            u = w[p + "ffn_up_exps.weight"][e] @ yt
            if oai:
                g = np.minimum(g + w[p + "ffn_gate_exps.bias"][e], 7.0)
                u = np.clip(u + w[p + "ffn_up_exps.bias"][e], -7.0, 7.0)
                act = g / (1 + np.exp(-1.702 * g)) * (u + 1)
            else:
                act = g / (1 + np.exp(-g)) * u
            d = w[p + "ffn_down_exps.weight"][e] @ act + (w[p + "ffn_down_exps.bias"][e] if oai else 0.0)
            out[t] += we * d
    return out


def reference_forward(path: Path, tokens: np.ndarray, n_ctx: int, ggml_gelu: bool = True,
                      overrides: dict | None = None) -> np.ndarray:
    """float64 logits [T, V] of llama.cpp's graph for the GGUF's architecture, hparams read as llama.cpp reads
    them (the families of tiny_families.py, F32 files). `overrides`: metadata entries to replace (None drops
    one), for checking how much a hyper-parameter moves the logits."""
    import gguf

    reader = gguf.GGUFReader(path)
    meta = {f.name: f.contents() for f in reader.fields.values()}
    meta = {k: v for k, v in {**meta, **(overrides or {})}.items() if v is not None}
    w = {t.name: np.asarray(t.data, dtype=np.float64).reshape([int(d) for d in reversed(t.shape)])
         for t in reader.tensors}
    arch = meta["general.architecture"]

    def hp(key: str, default: object = None) -> object:
        return meta.get(f"{arch}.{key}", default)

    n_embd, n_head = int(hp("embedding_length")), int(hp("attention.head_count"))
    n_kv, n_layer = int(hp("attention.head_count_kv", n_head)), int(hp("block_count"))
    eps = float(hp("attention.layer_norm_rms_epsilon"))
    hd = int(hp("attention.key_length", n_embd // n_head))
    n_rot, base = int(hp("rope.dimension_count", hd)), float(hp("rope.freq_base", 10000.0))
    mscale = float(hp("rope.scaling.attn_factor", 1.0))
    neox = arch in NEOX
    factors = w.get("rope_freqs.weight")
    if "rope_factors_long.weight" in w:   # llama.cpp: long iff n_ctx_seq (n_ctx padded to 256) > orig ctx
        orig = int(hp("rope.scaling.original_context_length", hp("context_length")))
        padded = -(-n_ctx // 256) * 256
        factors = w["rope_factors_long.weight" if padded > orig else "rope_factors_short.weight"]
    gelu = _gelu_ggml if ggml_gelu else _gelu_tanh
    n_used = int(hp("expert_used_count", 0))
    t = len(tokens)
    pos = np.arange(t, dtype=np.float64)
    x = w["token_embd.weight"][tokens]
    if arch in ("gemma2", "gemma3"):
        x = x * np.sqrt(np.float32(n_embd))
    if arch == "granite":
        x = x * float(hp("embedding_scale"))
    res_scale = float(hp("residual_scale", 1.0)) if arch == "granite" else 1.0
    window, pattern = hp("attention.sliding_window"), {"gemma2": 2, "gemma3": 6, "gpt-oss": 2}.get(arch)
    yarn = None
    if hp("rope.scaling.type") == "yarn":   # llama-cpp-python's context defaults: beta_fast 32, beta_slow 1
        yarn = (1.0 / float(hp("rope.scaling.factor")), int(hp("rope.scaling.original_context_length")),
                32.0, 1.0)
        if (log_mul := hp("rope.scaling.yarn_log_multiplier")):   # llama_context: get_mscale(f, 1) / get_mscale(f, m)
            mscale = mscale / (1 + 0.1 * float(log_mul) * math.log(float(hp("rope.scaling.factor"))))
    temp_beta = float(hp("attention.temperature_scale", 0.0))   # mistral3: q x (1 + beta ln(floor(pos / n) + 1))
    temp = (1 + temp_beta * np.log(np.floor(pos / int(hp("rope.scaling.original_context_length", 1))) + 1)
            if temp_beta else None)
    if arch == "llama4":   # llama.cpp's hard-coded chunk 8192, NoPE every 4th layer with 1 + 0.1 ln(...)
        temp = 1 + 0.1 * np.log(np.floor((pos + 1) / 8192) + 1)
    if arch == "gemma3":
        pattern = int(hp("attention.sliding_window_pattern", 6))
    softcap = float(hp("attn_logit_softcapping")) if arch == "gemma2" else None
    scale = float(hp("attention.scale", 0.0)) or hd ** -0.5
    swa_array = hp("attention.sliding_window_pattern")   # olmo3: a per-layer bool array
    for il in range(n_layer):
        p = f"blk.{il}."
        swa = pattern is not None and il % pattern < pattern - 1
        if isinstance(swa_array, list) and window:
            swa = bool(swa_array[il])
        h = x if arch == "olmo2" else _rms(x, w[p + "attn_norm.weight"], eps)
        if p + "attn_qkv.weight" in w:
            qkv = h @ w[p + "attn_qkv.weight"].T
            q, k, v = np.split(qkv, [n_head * hd, (n_head + n_kv) * hd], axis=-1)
        else:
            q, k, v = (h @ w[p + f"attn_{n}.weight"].T + w.get(p + f"attn_{n}.bias", 0.0) for n in "qkv")
        if arch == "olmo2":
            q, k = _rms(q, w[p + "attn_q_norm.weight"], eps), _rms(k, w[p + "attn_k_norm.weight"], eps)
        q, k, v = q.reshape(t, n_head, hd), k.reshape(t, n_kv, hd), v.reshape(t, n_kv, hd)
        if arch in ("qwen3", "qwen3moe", "gemma3"):
            q, k = _rms(q, w[p + "attn_q_norm.weight"], eps), _rms(k, w[p + "attn_k_norm.weight"], eps)
        nope = arch in ("smollm3", "llama4") and (il + 1) % 4 == 0
        if not nope:
            b = float(hp("rope.freq_base_swa", 10000.0)) if arch == "gemma3" and swa else base
            # olmo2 (OLMo 3): the local layers rotate without YaRN (freq_scale 1, ext_factor 0, attn_factor 1)
            ly, lm = (None, 1.0) if arch == "olmo2" and swa else (yarn, mscale)
            q = _rope(q, pos, n_rot, b, neox, factors, lm, ly)
            k = _rope(k, pos, n_rot, b, neox, factors, lm, ly)
        if arch == "llama4" and not nope:   # L2 norm (rms without weight) after RoPE
            q, k = _rms(q, None, eps), _rms(k, None, eps)
        if temp is not None and (arch != "llama4" or nope):
            q = q * temp[:, None, None]
        chunk = 8192 if arch == "llama4" and not nope else None
        a = _attend(q, k, v, scale, int(window) if swa else None, softcap, w.get(p + "attn_sinks.weight"), chunk)
        a = a @ w[p + "attn_output.weight"].T + w.get(p + "attn_output.bias", 0.0)
        if arch in ("gemma2", "gemma3", "olmo2"):
            a = _rms(a, w[p + "post_attention_norm.weight"], eps)
        x = x + res_scale * a
        if arch == "olmo2":
            y = x
        else:   # gpt-oss names its FFN input norm post_attention_norm
            y = _rms(x, w[p + ("post_attention_norm" if arch == "gpt-oss" else "ffn_norm") + ".weight"], eps)
        if p + "ffn_gate_inp.weight" in w:
            m = _moe(y, w, p, n_used, oai=arch == "gpt-oss", llama4=arch == "llama4")
            if p + "ffn_up_shexp.weight" in w:
                g, u = y @ w[p + "ffn_gate_shexp.weight"].T, y @ w[p + "ffn_up_shexp.weight"].T
                m = m + (g / (1 + np.exp(-g)) * u) @ w[p + "ffn_down_shexp.weight"].T
        elif arch == "phi3":
            gu = y @ w[p + "ffn_up.weight"].T
            g, u = np.split(gu, 2, axis=-1)
            m = (g / (1 + np.exp(-g)) * u) @ w[p + "ffn_down.weight"].T
        else:
            g, u = y @ w[p + "ffn_gate.weight"].T, y @ w[p + "ffn_up.weight"].T
            act = gelu(g) if arch in ("gemma2", "gemma3") else g / (1 + np.exp(-g))
            m = (act * u) @ w[p + "ffn_down.weight"].T
        if arch in ("gemma2", "gemma3", "olmo2"):
            m = _rms(m, w[p + "post_ffw_norm.weight"], eps)
        x = x + res_scale * m
    logits = _rms(x, w["output_norm.weight"], eps) @ w.get("output.weight", w["token_embd.weight"]).T
    if arch == "granite":
        logits = logits / float(hp("logit_scale"))
    if (cap := hp("final_logit_softcapping")) is not None and arch in ("gemma2", "gemma3") and float(cap):
        logits = float(cap) * np.tanh(logits / float(cap))
    return logits


def gemma4_reference(path: Path, tokens: np.ndarray, ggml_gelu: bool = True) -> np.ndarray:
    """float64 logits [T, V] of llama.cpp's gemma4 graph (src/models/gemma4.cpp) for the dense tiny file:
    per-layer head sizes / KV heads / RoPE, K = V without attn_v, V RMS-normed, shared KV layers reading
    layer n_kv - 2 (local) / n_kv - 1 (global), per-layer inputs, layer output scales, final soft-cap."""
    import gguf

    reader = gguf.GGUFReader(path)
    meta = {f.name: f.contents() for f in reader.fields.values()}
    w = {t.name: np.asarray(t.data, dtype=np.float64).reshape([int(d) for d in reversed(t.shape)])
         for t in reader.tensors}

    def hp(key: str, default: object = None) -> object:
        return meta.get(f"gemma4.{key}", default)

    n_embd, n_head, n_layer = int(hp("embedding_length")), int(hp("attention.head_count")), int(hp("block_count"))
    eps, window = float(hp("attention.layer_norm_rms_epsilon")), int(hp("attention.sliding_window"))
    swa, kv_heads = list(hp("attention.sliding_window_pattern")), list(hp("attention.head_count_kv"))
    n_kv = n_layer - int(hp("attention.shared_kv_layers", 0))
    n_pl = int(hp("embedding_length_per_layer_input", 0))
    gelu = _gelu_ggml if ggml_gelu else _gelu_tanh
    t = len(tokens)
    pos = np.arange(t, dtype=np.float64)
    x = w["token_embd.weight"][tokens] * np.sqrt(np.float32(n_embd))
    if n_pl:
        tok = w["per_layer_token_embd.weight"][tokens].reshape(t, n_layer, n_pl) * np.sqrt(np.float32(n_pl))
        proj = (x @ w["per_layer_model_proj.weight"].T / np.sqrt(n_embd)).reshape(t, n_layer, n_pl)
        ple = (_rms(proj, w["per_layer_proj_norm.weight"], eps) + tok) / np.sqrt(2.0)
    kv: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for il in range(n_layer):
        p = f"blk.{il}."
        hd = int(hp("attention.key_length_swa") if swa[il] else hp("attention.key_length"))
        n_rot = int(hp("rope.dimension_count_swa") if swa[il] else hp("rope.dimension_count"))
        base = float(hp("rope.freq_base_swa", 10000.0) if swa[il] else hp("rope.freq_base"))
        factors = None if swa[il] else w.get("rope_freqs.weight")
        h = _rms(x, w[p + "attn_norm.weight"], eps)
        q = _rms((h @ w[p + "attn_q.weight"].T).reshape(t, n_head, hd), w[p + "attn_q_norm.weight"], eps)
        q = _rope(q, pos, n_rot, base, True, factors, 1.0)
        if il < n_kv:
            k_raw = (h @ w[p + "attn_k.weight"].T).reshape(t, kv_heads[il], hd)
            v_raw = (h @ w[p + "attn_v.weight"].T).reshape(t, kv_heads[il], hd) if p + "attn_v.weight" in w else k_raw
            k = _rope(_rms(k_raw, w[p + "attn_k_norm.weight"], eps), pos, n_rot, base, True, factors, 1.0)
            kv[il] = (k, _rms(v_raw, None, eps))
        k, v = kv[il if il < n_kv else n_kv - (2 if swa[il] else 1)]
        a = _attend(q, k, v, 1.0, window if swa[il] else None, None)
        x = x + _rms(a @ w[p + "attn_output.weight"].T, w[p + "post_attention_norm.weight"], eps)
        y = _rms(x, w[p + "ffn_norm.weight"], eps)
        m = (gelu(y @ w[p + "ffn_gate.weight"].T) * (y @ w[p + "ffn_up.weight"].T)) @ w[p + "ffn_down.weight"].T
        if p + "ffn_gate_inp.weight" in w:   # 26B-A4B: the MLP beside the experts, each with its own norms
            m = _rms(m, w[p + "post_ffw_norm_1.weight"], eps) + _rms(
                _gemma4_experts(x, w, p, eps, int(hp("expert_used_count")), gelu), w[p + "post_ffw_norm_2.weight"], eps)
        x = x + _rms(m, w[p + "post_ffw_norm.weight"], eps)
        if n_pl:
            g = gelu(x @ w[p + "inp_gate.weight"].T) * ple[:, il]
            x = x + _rms(g @ w[p + "proj.weight"].T, w[p + "post_norm.weight"], eps)
        if p + "layer_output_scale.weight" in w:
            x = x * w[p + "layer_output_scale.weight"][0]
    logits = _rms(x, w["output_norm.weight"], eps) @ w.get("output.weight", w["token_embd.weight"]).T
    cap = float(hp("final_logit_softcapping", 0.0))
    return cap * np.tanh(logits / cap) if cap else logits


def _gemma4_experts(x: np.ndarray, w: dict, p: str, eps: float, n_used: int, gelu: Callable) -> np.ndarray:
    """gemma4's expert branch: router on rms(x) / sqrt(n) * ffn_gate_inp.scale, softmax, top-k renormalised,
    GeGLU experts from ffn_gate_up_exps (per expert gate rows then up rows) times ffn_down_exps.scale."""
    n = x.shape[-1]
    logits = (_rms(x, None, eps) / np.sqrt(n) * w[p + "ffn_gate_inp.scale"]) @ w[p + "ffn_gate_inp.weight"].T
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    y = _rms(x, w[p + "pre_ffw_norm_2.weight"], eps)
    gu, down = w[p + "ffn_gate_up_exps.weight"], w[p + "ffn_down_exps.weight"]
    ef = gu.shape[1] // 2
    out = np.zeros_like(x)
    for t in range(len(x)):
        top = np.argsort(-probs[t], kind="stable")[:n_used]
        for e, we in zip(top, probs[t, top] / probs[t, top].sum(), strict=True):
            h = gu[e] @ y[t]
            out[t] += we * w[p + "ffn_down_exps.scale"][e] * (down[e] @ (gelu(h[:ef]) * h[ef:]))
    return out


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / np.abs(a).max())


# ---- driver: runs in the project venv ------------------------------------------------------------------


def make(family: str, llama_python: str, hf_python: str | None, seed: int = 0) -> Path:
    from hitenter.testing.tiny_families import PHI3_PARTIAL_CTX, PHI3_PARTIAL_ORIG_CTX, write_tiny_family
    from hitenter.testing.tiny_model import tiny_vocab

    vocab = len(tiny_vocab()[0])
    tokens = golden_tokens(vocab, seed)
    with tempfile.TemporaryDirectory() as tmp:
        path = write_tiny_family(Path(tmp) / f"{family}.gguf", family, seed=seed)
        sha = hashlib.sha256(path.read_bytes()).hexdigest()
        n_ctx = PHI3_PARTIAL_CTX if family == "phi3_partial" else 256
        runs = [{"tokens": tokens.tolist(), "n_ctx": n_ctx, "rows": [0, N_TOKENS]}]
        long_tokens = golden_tokens(vocab, seed, LONG_TOKENS)
        if family in LONG_FAMILIES:
            runs.append({"tokens": long_tokens.tolist(), "n_ctx": LONG_TOKENS + 20,
                         "rows": [LONG_TOKENS - LONG_LAST, LONG_TOKENS]})
        if family == "phi3_partial":
            runs.append({"tokens": tokens.tolist(), "n_ctx": PHI3_PARTIAL_ORIG_CTX,
                         "rows": [PHI3_SHORT_ROWS.start, PHI3_SHORT_ROWS.stop]})
        outs, version = llama_logits(llama_python, path, runs)
        logits = outs[0]
        gemma4 = family in ("gemma4", "gemma4_moe")
        ref = gemma4_reference(path, tokens) if gemma4 else reference_forward(path, tokens, n_ctx)
        extra: dict[str, np.ndarray] = {"ref64_max_rel_diff": np.float64(_rel(logits, ref))}
        if gemma4:
            extra["ref64_exact_gelu_max_rel_diff"] = np.float64(_rel(logits, gemma4_reference(
                path, tokens, ggml_gelu=False)))
        if family in ("gemma2", "gemma3"):
            extra["ref64_exact_gelu_max_rel_diff"] = np.float64(_rel(logits, reference_forward(
                path, tokens, n_ctx, ggml_gelu=False)))
        if family in LONG_FAMILIES:
            long_ref = reference_forward(path, long_tokens, LONG_TOKENS + 20)[-LONG_LAST:]
            extra.update(long_tokens=long_tokens.astype(np.int16), long_logits=outs[1],
                         long_positions=np.arange(LONG_TOKENS - LONG_LAST, LONG_TOKENS, dtype=np.int32),
                         ref64_long_max_rel_diff=np.float64(_rel(outs[1], long_ref)))
        if family == "phi3_partial":
            short_ref = reference_forward(path, tokens, PHI3_PARTIAL_ORIG_CTX)[PHI3_SHORT_ROWS]
            rows = np.arange(PHI3_SHORT_ROWS.start, PHI3_SHORT_ROWS.stop, dtype=np.int32)
            extra.update(logits_short=outs[1], short_positions=rows,
                         short_n_ctx=np.int32(PHI3_PARTIAL_ORIG_CTX),
                         ref64_short_max_rel_diff=np.float64(_rel(outs[1], short_ref)))
        if family in Q8_FAMILIES:
            q8 = write_tiny_family(Path(tmp) / f"{family}-q8_0.gguf", family, seed=seed, quant="Q8_0")
            extra.update(gguf_q8_0_sha256=np.array(hashlib.sha256(q8.read_bytes()).hexdigest()),
                         logits_q8_0=llama_logits(llama_python, q8, runs[:1], plain_buffers=True)[0][0])
        fixes = HF_CONFIG_FIXES[family]
        if hf_python and fixes is not None:
            hf, hf_version = hf_logits(hf_python, path, tokens, fixes)
            # phi3_partial: HF's longrope uses the short factors at 40 <= 256 tokens, llama.cpp's logits_short
            ours, theirs = (outs[1], hf[HF_ROWS]) if family == "phi3_partial" else (logits, hf)
            extra.update(hf_logits=hf[HF_ROWS], hf_version=np.array(hf_version),
                         hf_positions=np.arange(HF_ROWS.start, HF_ROWS.stop, dtype=np.int32),
                         hf_config_fixes=np.array(json.dumps(fixes)),
                         hf_max_rel_diff=np.float64(_rel(ours, theirs)))
    OUT.mkdir(parents=True, exist_ok=True)
    out = OUT / f"{family}.npz"
    np.savez_compressed(out, tokens=tokens, logits=logits, gguf_sha256=np.array(sha),
                        llama_cpp_version=np.array(version), n_ctx=np.int32(n_ctx), seed=np.int32(seed),
                        **extra)
    argmax_ref = int((ref.argmax(-1) == logits.argmax(-1)).sum())
    print(f"{family:13s} logits std {logits.std():5.2f} max|.| {np.abs(logits).max():6.2f}  vs float64 ref: "
          f"max rel {extra['ref64_max_rel_diff']:.1e}, argmax {argmax_ref}/{N_TOKENS}"
          + "".join(f"  {k} {float(v):.1e}" for k, v in extra.items()
                    if k.startswith(("ref64_", "hf_max")) and k != "ref64_max_rel_diff")
          + f"  -> {out.relative_to(ROOT)} ({out.stat().st_size // 1024} KB)")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--hf-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--llama-python", default="/work/venvs/llamacpp/bin/python")
    ap.add_argument("--hf-python", default="/work/venvs/hf/bin/python",
                    help="a python with transformers + accelerate + gguf ('' to skip HF)")
    ap.add_argument("families", nargs="*")
    args = ap.parse_args()
    if args.worker:
        return worker()
    if args.hf_worker:
        return hf_worker()
    hf_python = args.hf_python if args.hf_python and Path(args.hf_python).exists() else None
    if hf_python is None:
        print("no HF python: the goldens get no hf_* entries")
    sys.path.insert(0, str(ROOT))
    from hitenter.testing.tiny_families import FAMILIES

    for family in args.families or FAMILIES:
        make(family, args.llama_python, hf_python)


if __name__ == "__main__":
    main()
