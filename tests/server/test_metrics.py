"""Speculative decoding through the server: identical text, and its acceptance in /metrics."""

from __future__ import annotations

import httpx
import openai
from prometheus_client.parser import text_string_to_metric_families

from hitenter.engine.llm_engine import LLMEngine
from hitenter.server.api import create_app
from hitenter.testing.live_server import live_server


def _gauges(url: str) -> dict[str, float]:
    fams = text_string_to_metric_families(httpx.get(url + "/metrics").text)
    return {s.name: s.value for f in fams for s in f.samples}


def test_ngram_speculation_same_text_and_metrics(tiny_llama_path):
    prompt = "abc abc abc abc abc abc abc"
    plain = LLMEngine(str(tiny_llama_path))
    spec = LLMEngine(str(tiny_llama_path), speculative_method="ngram", num_speculative_tokens=3)
    texts = []
    for eng in (plain, spec):
        with live_server(create_app(eng, "m", playground=False)) as srv:
            client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=60)
            r = client.completions.create(model="m", prompt=prompt, max_tokens=24, temperature=0,
                                          extra_body={"ignore_eos": True})
            texts.append(r.choices[0].text)
            g = _gauges(srv.url)
    assert texts[0] == texts[1]
    assert g["hitenter:spec_decode_num_draft_tokens"] > 0
    assert 0 <= g["hitenter:spec_decode_acceptance_rate"] <= 1
    assert g["hitenter:spec_decode_num_accepted_tokens"] == round(
        g["hitenter:spec_decode_acceptance_rate"] * g["hitenter:spec_decode_num_draft_tokens"])
