"""A hostile GGUF named by a request is a 400 with the loader's one-line reason, never a 5xx or a hang,
and the server keeps serving; a hostile chat template in an otherwise good file is a 400 at request time.
The files are damaged copies of a tiny GGUF (hitenter/testing/gguf_fuzz.py), loaded on demand by path."""

from __future__ import annotations

import struct
from pathlib import Path

import httpx
import pytest

from hitenter.engine.llm_engine import LLMEngine
from hitenter.server.api import create_app, engine_loader
from hitenter.server.model_manager import Lifecycle
from hitenter.testing.gguf_fuzz import HOSTILE_TEMPLATES, duplicate_key, encode_value, layout, replace_value
from hitenter.testing.live_server import live_server
from hitenter.testing.tiny_model import write_tiny_gguf

HI = [{"role": "user", "content": "hi"}]


def _hostile_files(d: Path) -> dict[str, tuple[Path, str]]:
    """name -> (file, words its refusal carries)."""
    base = write_tiny_gguf(d / "base.gguf", quant="Q8_0", seed=3).read_bytes()
    lay = layout(base)
    toffsets = [f for t in lay.tensor_fields for f in t if f.kind == "toffset"]
    overlap = bytearray(base)
    overlap[toffsets[3].offset:toffsets[3].offset + 8] = base[toffsets[0].offset:toffsets[0].offset + 8]
    variants = {
        "huge_count": (base[:8] + struct.pack("<Q", 1 << 60) + base[16:], "claims 1152921504606846976 tensors"),
        "truncated": (base[:lay.header_end - 5], "truncated or corrupt"),
        "overlap": (bytes(overlap), "overlap"),
        "wrong_type": (replace_value(base, lay, "llama.block_count", encode_value("abc")), "'llama.block_count'"),
        "duplicate": (duplicate_key(base, lay, "general.name"), "appears twice"),
        "bad_tokens": (replace_value(base, lay, "tokenizer.ggml.tokens", encode_value(7)), "tokenizer.ggml.tokens"),
    }
    out = {}
    for name, (data, words) in variants.items():
        (d / f"{name}.gguf").write_bytes(data)
        out[name] = (d / f"{name}.gguf", words)
    return out


@pytest.mark.slow
def test_hostile_files_are_400s_and_the_server_keeps_serving(tiny_qwen2_path: Path, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HITENTER_HOME", str(tmp_path / "home"))
    files = _hostile_files(tmp_path)
    template = write_tiny_gguf(tmp_path / "template.gguf", seed=4).read_bytes()
    bad_template = tmp_path / "bad_template.gguf"
    bad_template.write_bytes(replace_value(template, layout(template), "tokenizer.chat_template",
                                           encode_value(HOSTILE_TEMPLATES[0])))
    app = create_app(LLMEngine(str(tiny_qwen2_path)), "tiny", playground=False, loader=engine_loader({}, None),
                     lifecycle=Lifecycle(keep_alive=300.0, wait_seconds=30.0))
    with live_server(app) as srv:
        for name, (path, words) in files.items():
            r = httpx.post(srv.url + "/api/chat", json={"model": str(path), "messages": HI, "stream": False},
                           timeout=60)
            assert r.status_code == 400, (name, r.status_code, r.text)
            err = r.json()["error"]
            assert words in err and "could not be loaded" in err and "\n" not in err, (name, err)
            r = httpx.post(srv.url + "/v1/chat/completions", json={"model": str(path), "messages": HI}, timeout=60)
            assert r.status_code == 400 and words in r.json()["error"]["message"], (name, r.text)
        r = httpx.post(srv.url + "/v1/chat/completions", timeout=60,
                       json={"model": str(bad_template), "messages": HI, "max_tokens": 2})
        assert r.status_code == 400 and "chat template" in r.json()["error"]["message"], r.text
        r = httpx.post(srv.url + "/v1/chat/completions", json={"model": "tiny", "messages": HI, "max_tokens": 2},
                       timeout=60)
        assert r.status_code == 200, r.text
