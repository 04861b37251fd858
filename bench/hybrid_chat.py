"""A multi-turn chat, turn by turn, against hitenter and llama-server on the same GGUF: each turn's time to
first token and how many prompt tokens the server had to read again (not served from its cache).

    .venv/bin/python bench/hybrid_chat.py --model FILE.gguf [--llama-server-bin PATH] [--turns 8]

One conversation of ``--turns`` turns: each user turn ``--user-words`` words of varied text, each reply at
most ``--max-tokens`` tokens (greedy), appended to the history as the next turn's context, so turn t's
prompt extends turn t-1's prompt + reply (``--conversations 2``: two chats whose turns alternate). On a hybrid (recurrent-state) model, a server that cannot resume
a state re-reads the whole conversation every turn. Re-read counts: hitenter's ``usage.prompt_tokens -
usage.prompt_tokens_details.cached_tokens``; llama-server's ``timings.prompt_n``. Both servers run
``--threads`` threads, one slot each, the servers in turn (never at once). Prints a table per turn and a
JSON line (bench/common.py).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).parent))
from common import emit_json, table  # noqa: E402
from llama_server import LlamaServer, ServerProcess  # noqa: E402

WORDS = ("model state token layer cache prompt reply turn memory block snapshot window river mountain "
         "garden winter summer engine compiler kernel thread vector matrix").split()


def user_turns(n: int, words: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [f"Turn {i + 1}: " + " ".join(rng.choice(WORDS) for _ in range(words)) + ". Answer briefly."
            for i in range(n)]


class HitenterServer(ServerProcess):
    name = "hitenter"

    def __init__(self, model: str, threads: int, max_model_len: int) -> None:
        super().__init__(300.0)
        self.model, self.threads, self.max_model_len = model, threads, max_model_len

    def command(self) -> list[str]:
        return [sys.executable, "-m", "hitenter.cli", "serve", "--model", self.model, "--host", "127.0.0.1",
                "--port", str(self.port), "--num-threads", str(self.threads), "--max-model-len",
                str(self.max_model_len), "--max-num-seqs", "1"]


def served_model(url: str) -> str:
    """The first model the server lists (/v1/models)."""
    return str(httpx.get(url + "/v1/models", timeout=30).json()["data"][0]["id"])


def one_turn(url: str, messages: list[dict[str, str]], max_tokens: int) -> dict[str, Any]:
    """Stream one reply: TTFT, the reply text, prompt tokens, tokens re-read."""
    body = {"model": served_model(url), "messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    ttft, text, usage, timings = None, [], {}, {}
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            for choice in chunk.get("choices") or ():
                piece = (choice.get("delta") or {}).get("content")
                if piece:
                    ttft = ttft if ttft is not None else time.perf_counter() - t0
                    text.append(piece)
            usage = chunk.get("usage") or usage
            timings = chunk.get("timings") or timings
    prompt = int(usage.get("prompt_tokens", timings.get("prompt_n", 0) + timings.get("cache_n", 0)))
    if timings:
        reread = int(timings.get("prompt_n", prompt))
    else:
        reread = prompt - int((usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0))
    return {"ttft": ttft if ttft is not None else time.perf_counter() - t0, "text": "".join(text),
            "prompt_tokens": prompt, "reread": reread}


def conversation(url: str, turns: list[str], max_tokens: int, conversations: int = 1) -> list[dict[str, Any]]:
    """``turns`` spread over ``conversations`` chats taken in turn (turn i goes to chat i mod n), so with n > 1
    a server's one slot sees the chats interleave."""
    chats: list[list[dict[str, str]]] = [[{"role": "system", "content": f"You are helpful assistant {c}."}]
                                         for c in range(conversations)]
    out = []
    for i, turn in enumerate(turns):
        messages = chats[i % conversations]
        messages.append({"role": "user", "content": turn})
        res = one_turn(url, messages, max_tokens)
        messages.append({"role": "assistant", "content": res["text"]})
        out.append(res)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="a GGUF file")
    ap.add_argument("--llama-server-bin", help="llama-server (bench/build_llama_server.sh); omitted: hitenter only")
    ap.add_argument("--llama-server-arg", action="append", default=[],
                    help="an extra llama-server argument (repeatable), e.g. --no-repack where its repacked CPU "
                         "buffers crash (seen on AVX-512 + AMX machines with this llama.cpp)")
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--conversations", type=int, default=1, help="chats the turns alternate between (2: interleaved)")
    ap.add_argument("--user-words", type=int, default=60)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-model-len", type=int, default=4096)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    turns = user_turns(args.turns, args.user_words, args.seed)
    results: dict[str, list[dict[str, Any]]] = {}
    with HitenterServer(args.model, args.threads, args.max_model_len) as srv:
        results["hitenter"] = conversation(srv.url, turns, args.max_tokens, args.conversations)
    if args.llama_server_bin:
        with LlamaServer(args.llama_server_bin, args.model, parallel=1, ctx_per_slot=args.max_model_len,
                         threads=args.threads, extra_args=tuple(args.llama_server_arg)) as srv:
            results["llama-server"] = conversation(srv.url, turns, args.max_tokens, args.conversations)
    rows = []
    for t in range(args.turns):
        row: list[Any] = [t + 1]
        for name in results:
            r = results[name][t]
            row += [r["prompt_tokens"], r["reread"], r["ttft"] * 1000]
        rows.append(row)
    header = ["turn"] + [f"{name} {col}" for name in results for col in ("prompt", "re-read", "TTFT ms")]
    print(table(rows, header))
    emit_json("hybrid_chat", {"model": args.model, "turns": args.turns,
                              "results": {k: [{kk: v for kk, v in r.items() if kk != "text"} for r in rs]
                                          for k, rs in results.items()}})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
