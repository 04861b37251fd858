"""``hitenter run`` / ``chat`` through a running ``hitenter serve``, as ``ollama run`` talks to its server.

The server is looked for at ``$HITENTER_HOST`` (``host:port`` or a URL; default 127.0.0.1:8000, where
``hitenter serve`` listens): a connection within ``PROBE_SECONDS`` and a GET /health answered 200 means
one runs there. A refused connection answers at once, so a machine with no server loses nothing. The generation is the
OpenAI streaming surface (/v1/chat/completions, or /v1/completions for a raw prompt) read with the
standard library only: nothing heavy is imported on this path (no torch, no HTTP client package).

``generate`` yields text pieces and returns a ``Finish`` (token count, finish reason, time to first
token); ``Unavailable`` says the server cannot serve the request (not there, or it does not have the
model: 404 / 503), so the caller runs the model itself; ``RemoteError`` is the server refusing the
request itself (a 4xx with its message).
"""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from hitenter import envs

DEFAULT_HOST = "127.0.0.1:8000"
PROBE_SECONDS = 0.3           # to connect: a refused connection answers at once
ANSWER_SECONDS = 10.0         # for /health once connected
READ_SECONDS = 600.0


class Unavailable(Exception):
    """No server answered, or it cannot serve this model now."""


class RemoteError(Exception):
    """The server refused the request (its status and message)."""


@dataclass(frozen=True)
class Server:
    host: str
    port: int
    api_key: str | None = None

    def connection(self, timeout: float) -> http.client.HTTPConnection:
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)


@dataclass(frozen=True)
class Finish:
    tokens: int
    finish_reason: str | None
    ttft: float | None          # seconds from the request to the first text


def server_address(host: str | None = None, api_key: str | None = None) -> Server:
    """Where a server would run: ``host`` (``host``, ``host:port`` or ``http://host:port``; default
    $HITENTER_HOST) with ``api_key`` (default $HITENTER_API_KEY); ValueError for an unusable address."""
    raw = host or envs.HITENTER_HOST.get() or DEFAULT_HOST
    parts = urlsplit(raw if "://" in raw else f"http://{raw}")
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(f"HITENTER_HOST: expected host:port or http://host:port, got {raw!r}")
    return Server(parts.hostname, parts.port or 8000, api_key or envs.HITENTER_API_KEY.get() or None)


def running(server: Server, timeout: float = PROBE_SECONDS, answer: float = ANSWER_SECONDS) -> bool:
    """Whether a server answers /health there: a connection within ``timeout`` (nothing listening is
    refused at once), then its answer within ``answer`` (a busy server may take a moment)."""
    conn = server.connection(timeout)
    try:
        conn.connect()
        assert conn.sock is not None
        conn.sock.settimeout(answer)
        conn.request("GET", "/health")
        return conn.getresponse().status == 200
    except (OSError, http.client.HTTPException):
        return False
    finally:
        conn.close()


def model_ref(model: str | None) -> str | None:
    """The model as the server should see it: a local file by its absolute path (the server's working
    directory is not ours), a name as it is."""
    if model is None:
        return None
    p = Path(model).expanduser()
    return str(p.resolve()) if p.is_file() else model


def sampling_body(max_tokens: int, temperature: float, top_p: float, top_k: int, min_p: float,
                  seed: int | None, stop: list[str] | None) -> dict[str, Any]:
    """The run flags as an OpenAI request's sampling fields (vLLM's top_k / min_p included)."""
    body: dict[str, Any] = {"max_tokens": max_tokens, "temperature": temperature, "top_p": top_p,
                            "min_p": min_p, "top_k": top_k}
    if seed is not None:
        body["seed"] = seed
    if stop:
        body["stop"] = stop
    return body


def generate(server: Server, model: str | None, sampling: dict[str, Any], *, messages: list[dict[str, str]] | None = None,
             prompt: str | None = None) -> Generator[str, None, Finish]:
    """Stream one chat reply (``messages``) or raw completion (``prompt``) from ``server``."""
    path = "/v1/chat/completions" if messages is not None else "/v1/completions"
    body: dict[str, Any] = {**sampling, "stream": True, "stream_options": {"include_usage": True}}
    body.update({"messages": messages} if messages is not None else {"prompt": prompt})
    if model is not None:
        body["model"] = model
    headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
    if server.api_key:
        headers["Authorization"] = f"Bearer {server.api_key}"
    conn = server.connection(READ_SECONDS)
    t0 = time.perf_counter()
    try:
        try:
            conn.request("POST", path, json.dumps(body).encode(), headers)
            resp = conn.getresponse()
        except (OSError, http.client.HTTPException) as e:
            raise Unavailable(f"no answer from {server.host}:{server.port}: {e}") from e
        if resp.status != 200:
            _refusal(resp)
        return (yield from _read_stream(resp, t0))
    finally:
        conn.close()


def _refusal(resp: http.client.HTTPResponse) -> None:
    raw = resp.read()
    try:
        message = json.loads(raw)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = raw.decode("utf-8", "replace")[:300]
    if resp.status in (404, 503):
        raise Unavailable(f"the server answered {resp.status}: {message}")
    if resp.status == 401:
        raise RemoteError(f"the server asks for its --api-key ({message}): set HITENTER_API_KEY, or run "
                          "with --no-server")
    raise RemoteError(f"the server refused the request ({resp.status}): {message}")


def _events(resp: http.client.HTTPResponse) -> Iterator[dict[str, Any]]:
    for line in resp:
        text = line.decode("utf-8").strip()
        if not text.startswith("data:"):
            continue
        data = text[5:].strip()
        if data == "[DONE]":
            return
        yield json.loads(data)


def _read_stream(resp: http.client.HTTPResponse, t0: float) -> Generator[str, None, Finish]:
    tokens, reason, ttft = 0, None, None
    for ev in _events(resp):
        if "error" in ev:
            raise RemoteError(f"the server failed mid-reply: {ev['error'].get('message', ev['error'])}")
        for choice in ev.get("choices") or []:
            piece = (choice.get("delta") or {}).get("content") if "delta" in choice else choice.get("text")
            if piece:
                if ttft is None:
                    ttft = time.perf_counter() - t0
                yield piece
            reason = choice.get("finish_reason") or reason
        if ev.get("usage"):
            tokens = int(ev["usage"].get("completion_tokens") or 0)
    return Finish(tokens, reason, ttft)
