"""`hitenter serve --mmproj FILE`, as llama-server has it: the named projector gives the model images; a file
that does not fit the model stops the start with a clear error."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from hitenter.testing.serve import serve_subprocess
from hitenter.testing.tiny_gemma import write_tiny_gemma3
from hitenter.testing.tiny_vision import data_url, sample_image, write_tiny_gemma3_mmproj

pytestmark = pytest.mark.slow


def _image_chat(url: str) -> httpx.Response:
    content = [{"type": "text", "text": "What is it?"},
               {"type": "image_url", "image_url": {"url": data_url(sample_image(30, 20, 1))}}]
    return httpx.post(url + "/v1/chat/completions", timeout=120, json={
        "messages": [{"role": "user", "content": content}], "max_tokens": 3, "temperature": 0})


def test_serve_with_a_named_mmproj(tmp_path: Path) -> None:
    text = write_tiny_gemma3(tmp_path / "models" / "tiny-gemma3.gguf")
    mmproj = write_tiny_gemma3_mmproj(tmp_path / "elsewhere" / "projector.gguf")   # not beside the model
    with serve_subprocess(["--model", str(text), "--extra-model", "none"]) as (url, _):
        r = _image_chat(url)
        assert r.status_code == 400 and "--mmproj" in r.json()["error"]["message"], r.text
    with serve_subprocess(["--model", str(text), "--extra-model", "none", "--mmproj", str(mmproj)]) as (url, _):
        r = _image_chat(url)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3, r.text


def test_an_mmproj_that_does_not_fit_is_refused(tmp_path: Path) -> None:
    text = write_tiny_gemma3(tmp_path / "tiny-gemma3.gguf")
    wide = write_tiny_gemma3_mmproj(tmp_path / "other" / "mmproj.gguf", text_hidden=32)
    r = subprocess.run([sys.executable, "-m", "hitenter.cli", "serve", "--model", str(text), "--extra-model", "none",
                        "--mmproj", str(wide), "--port", "1"], capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and "hidden size 64" in r.stderr and "Traceback" not in r.stderr, r.stderr[-2000:]
