"""Bad images beside running streams: every bad image kind on every API gets a 4xx quickly, and 16 streams
keep their token rate. Prints figures; exits non-zero when one is out of bounds.

    .venv/bin/python bench/image_abuse.py [--model PATH] [--streams 16] [--max-tokens 64] [--rounds 6]

Starts ``hitenter serve`` on a real text model (default gemma-3-270m from the model cache) with a small
random Gemma-3-shaped mmproj of the model's width beside it (hitenter.testing.tiny_vision; the tower's size
does not matter here: a bad image never reaches it). Then, in alternating runs:
- alone: ``--streams`` streaming OpenAI completions of ``--max-tokens`` tokens each (text only: the cached
  gemma-3-270m GGUF has no chat template), their mean tokens/s per stream;
- attacked: the same streams while one client (its own process) posts every bad request in a loop: each of
  tiny_vision.bad_images() (bomb, truncated, malformed, wrong MIME, not an image type, not base64, empty)
  plus an image over the pixel limit, one over the side limit and 17 images in one request, on each API
  (OpenAI chat ``image_url``, Anthropic ``image`` blocks, Responses ``input_image``, Ollama ``/api/chat``
  ``images``; Ollama's images carry no MIME type, so its wrong-MIME and not-an-image-type cases are left out).
Each attacked run's rate is divided by the mean of the alone runs either side (the machine is shared);
the figure is the median of those ratios (bound: >= 0.8). Every bad request's status (bound: 4xx; on a
model without a chat template the image is still checked first, so the refusal is the image's) and
latency, max and p99 per request kind (bound: max < 1 s). ``uptime`` before and after.
The server paces a client's image refusals (hitenter/server/image_chat.py), so the looping client's rate
is a few a second after its first few.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from common import emit_json, percentile, table  # noqa: E402

from hitenter.testing.serve import serve_subprocess  # noqa: E402
from hitenter.testing.tiny_vision import (  # noqa: E402
    bad_images,
    image_base64,
    png_claiming,
    sample_image,
    write_tiny_gemma3_mmproj,
)

KEY = "sk-image-abuse"
AUTH = {"Authorization": f"Bearer {KEY}"}
DEFAULT_MODEL = Path.home() / ".cache/hitenter/models/gemma-3-270m.gguf"


def text_width(model: Path) -> int:
    """The text model's embedding width (the projector's output width)."""
    from gguf import GGUFReader

    r = GGUFReader(model)
    arch = bytes(r.fields["general.architecture"].parts[-1]).decode()
    return int(r.fields[f"{arch}.embedding_length"].parts[-1][0])


def bad_kinds() -> dict[str, list[tuple[str, str]]]:
    """Each bad request kind: a list of (MIME type, base64 data) images."""
    import base64

    b64 = lambda b: base64.b64encode(b).decode()  # noqa: E731
    kinds = {k: [v] for k, v in bad_images().items()}
    kinds["over_pixels"] = [("image/png", b64(png_claiming(9000, 5000)))]      # 45 M pixels, sides within limits
    kinds["over_side"] = [("image/png", b64(png_claiming(20000, 8)))]
    kinds["too_many"] = [("image/png", image_base64(sample_image(8, 8, i))) for i in range(17)]
    return kinds


def request(api: str, model: str, images: list[tuple[str, str]]) -> tuple[str, dict[str, Any]]:
    """(path, JSON body) of one chat request on `api` holding `images`."""
    if api == "openai":
        parts = [{"type": "image_url", "image_url": {"url": f"data:{m};base64,{d}"}} for m, d in images]
        return "/v1/chat/completions", {"model": model, "max_tokens": 4, "messages": [
            {"role": "user", "content": [*parts, {"type": "text", "text": "What is it?"}]}]}
    if api == "anthropic":
        parts = [{"type": "image", "source": {"type": "base64", "media_type": m, "data": d}} for m, d in images]
        return "/v1/messages", {"model": model, "max_tokens": 4, "messages": [
            {"role": "user", "content": [*parts, {"type": "text", "text": "What is it?"}]}]}
    if api == "responses":
        parts = [{"type": "input_image", "image_url": f"data:{m};base64,{d}"} for m, d in images]
        return "/v1/responses", {"model": model, "max_output_tokens": 4, "input": [
            {"role": "user", "content": [*parts, {"type": "input_text", "text": "What is it?"}]}]}
    return "/api/chat", {"model": model, "stream": False, "messages": [
        {"role": "user", "content": "What is it?", "images": [d for _, d in images]}]}


def bad_requests(model: str) -> list[tuple[str, str, str, bytes]]:
    """(api, kind, path, body) of every bad request."""
    import json

    out = []
    for api in ("openai", "anthropic", "responses", "ollama"):
        for kind, images in bad_kinds().items():
            if api == "ollama" and kind in ("wrong_mime", "not_an_image_type"):
                continue
            path, body = request(api, model, images)
            out.append((api, kind, path, json.dumps(body).encode()))
    return out


def _attacker(url: str, model: str, stop: Any, result: Any) -> None:
    """Posts every bad request in turn until `stop`; puts [(api, kind, status, seconds)] (its own process:
    a thread would share the measuring client's GIL)."""
    reqs, out = bad_requests(model), []
    with httpx.Client(headers={**AUTH, "content-type": "application/json"}, timeout=60) as c:
        i = 0
        while not stop.is_set():
            api, kind, path, body = reqs[i % len(reqs)]
            t0 = time.perf_counter()
            r = c.post(url + path, content=body)
            out.append((api, kind, r.status_code, time.perf_counter() - t0))
            i += 1
    result.put(out)


async def _stream(c: httpx.AsyncClient, url: str, model: str, max_tokens: int) -> tuple[int, float]:
    body = {"model": model, "prompt": "Once upon a time, in a lighthouse by the sea,", "max_tokens": max_tokens,
            "stream": True, "ignore_eos": True, "temperature": 0}
    n, t0 = 0, time.perf_counter()
    async with c.stream("POST", url + "/v1/completions", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"stream: {r.status_code} {(await r.aread())[:300]!r}")
        async for line in r.aiter_lines():
            if line.startswith("data: {") and '"text":"' in line:
                n += 1
    return n, time.perf_counter() - t0


async def _streams(url: str, model: str, n: int, max_tokens: int) -> float:
    """Mean tokens/s per stream of `n` concurrent streams."""
    async with httpx.AsyncClient(headers=AUTH, timeout=600) as c:
        res = await asyncio.gather(*[_stream(c, url, model, max_tokens) for _ in range(n)])
    return sum(k / t for k, t in res) / n


def attacked(url: str, model: str, n: int, max_tokens: int) -> tuple[float, list[tuple[str, str, int, float]]]:
    ctx = multiprocessing.get_context("fork")
    stop, result = ctx.Event(), ctx.Queue()
    proc = ctx.Process(target=_attacker, args=(url, model, stop, result), daemon=True)
    proc.start()
    time.sleep(0.3)
    tps = asyncio.run(_streams(url, model, n, max_tokens))
    stop.set()
    seen = result.get(timeout=120)
    proc.join(timeout=60)
    return tps, seen


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    ap.add_argument("--streams", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=6, help="attacked runs (each between two alone runs)")
    a = ap.parse_args()
    print("uptime before:", os.getloadavg(), flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        mm = write_tiny_gemma3_mmproj(Path(tmp) / "mmproj.gguf", text_hidden=text_width(a.model))
        args = ["--model", str(a.model), "--mmproj", str(mm), "--api-key", KEY, "--extra-model", "none"]
        with serve_subprocess(args) as (url, _):
            model = httpx.get(url + "/v1/models", headers=AUTH).json()["data"][0]["id"]
            asyncio.run(_streams(url, model, 2, 4))     # warm up
            alone = [asyncio.run(_streams(url, model, a.streams, a.max_tokens))]
            ratios, seen = [], []
            for _ in range(a.rounds):
                tps, s = attacked(url, model, a.streams, a.max_tokens)
                alone.append(asyncio.run(_streams(url, model, a.streams, a.max_tokens)))
                ratios.append(tps / ((alone[-2] + alone[-1]) / 2))
                seen += s
                print(f"round: alone {alone[-2]:.2f} / {alone[-1]:.2f}, attacked {tps:.2f} tok/s per stream, "
                      f"{len(s)} bad requests, load {os.getloadavg()[0]:.1f}", flush=True)
    print("uptime after:", os.getloadavg())
    rows, bad = [], []
    for api, kind, _, _ in bad_requests("m"):
        lat = [t for a_, k, _, t in seen if (a_, k) == (api, kind)]
        codes = sorted({c for a_, k, c, _ in seen if (a_, k) == (api, kind)})
        rows.append([api, kind, ",".join(map(str, codes)), len(lat), max(lat, default=float("nan")) * 1e3,
                     percentile(lat, 99) * 1e3])
        if not lat or any(not 400 <= c < 500 for c in codes) or max(lat) >= 1.0:
            bad.append((api, kind))
    print(table(rows, ["api", "kind", "statuses", "n", "max ms", "p99 ms"]))
    all_lat = [t for *_, t in seen]
    ratio = statistics.median(ratios)
    print(f"{a.streams} streams: alone {statistics.median(alone):.2f} tok/s per stream (runs "
          f"{[round(v, 2) for v in alone]}); attacked / alone ratios {[round(r, 3) for r in ratios]}, "
          f"median {ratio:.3f}; bad requests {len(all_lat)}, max {max(all_lat) * 1e3:.1f} ms, "
          f"p99 {percentile(all_lat, 99) * 1e3:.1f} ms; out of bounds: {bad or 'none'}")
    emit_json("image_abuse", {"model": a.model.name, "streams": a.streams, "max_tokens": a.max_tokens,
                              "alone_tps": alone, "ratios": ratios, "ratio": ratio, "bad_requests": len(all_lat),
                              "max_ms": max(all_lat) * 1e3, "p99_ms": percentile(all_lat, 99) * 1e3,
                              "out_of_bounds": bad, "load": os.getloadavg()})
    return 0 if ratio >= 0.8 and not bad else 1


if __name__ == "__main__":
    raise SystemExit(main())
