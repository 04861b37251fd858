"""The image panel in real Chromium (tiny random Gemma 3 + its tiny mmproj beside it, and the tiny Llama
without one): an image picked in the file input goes to POST /image and the panel shows the engine's
numbers: the patch count of the mmproj's grid, the token count of the encoder's prepare, the image run's place
in the engine's image_prompt layout of the same chat, one norm per projected row and the answer's attention
drawn over the token grid; a model without a projector says --mmproj and draws nothing."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hitenter.engine.image_prompt import MEDIA_MARKER, chat_segments
from hitenter.testing.live_server import live_server
from hitenter.testing.playground_page import CHROMIUM, TINY_OPTS
from hitenter.testing.tiny_vision import image_bytes, sample_image, write_tiny_gemma3_with_mmproj

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's /usr/bin/chromium")]
TEXT = "What is in this picture?"


@pytest.fixture(scope="module")
def vision_server(tmp_path_factory: pytest.TempPathFactory, tiny_llama_path: Path) -> Iterator[tuple[str, Any]]:
    from hitenter.engine.llm_engine import LLMEngine
    from hitenter.server.api import create_app

    text, _ = write_tiny_gemma3_with_mmproj(tmp_path_factory.mktemp("vision_page"))
    eng = LLMEngine(str(text))
    app = create_app(eng, "vision", extra_engines={"tiny": LLMEngine(str(tiny_llama_path), **TINY_OPTS)})
    with live_server(app) as srv:
        yield srv.url, eng


SHOWN = """() => {
  const c = document.querySelector('#vision-counts').dataset, run = document.querySelector('#vision-run').dataset;
  return {patches: +c.patches, tokens: +c.tokens, start: +c.start, length: +c.length, count: +c.count,
          runStart: +run.start, runLength: +run.length, grid: c.grid, tokenGrid: c.tokenGrid,
          norms: document.querySelectorAll('#vision-norms i').length,
          answer: document.querySelectorAll('#vision-answer .tok').length,
          answerIds: [...document.querySelectorAll('#vision-answer .tok')].map((t) => +t.dataset.id),
          drawn: document.querySelector('#vision-canvas').dataset.drawn,
          share: +document.querySelector('#vision-share').dataset.share,
          chips: [...document.querySelectorAll('#vision-seq .tok[data-pos]')].map((t) => [+t.dataset.pos, +t.dataset.id])};
}"""


def test_image_panel_shows_the_engines_numbers(browser: Any, vision_server: tuple[str, Any]) -> None:
    url, eng = vision_server
    rgb = sample_image(48, 40, 9)
    pg = browser.new_page(viewport={"width": 1400, "height": 1000})
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    pg.goto(url + "/")
    pg.wait_for_selector("body[data-ready=true]", timeout=20000)
    pg.wait_for_selector("#p-vision[data-vision-state=idle]", state="attached")
    pg.set_input_files("#vision-file", files=[{"name": "x.png", "mimeType": "image/png", "buffer": image_bytes(rgb)}])
    pg.wait_for_selector("#p-vision[data-vision-state=attention]", state="attached", timeout=20000)
    pg.wait_for_function("() => document.querySelector('#vision-canvas').dataset.drawn === '0:-1'")
    shown = pg.evaluate(SHOWN)
    enc = eng.vision.encoder
    cfg, inp = enc.config, enc.prepare(rgb)
    side = cfg.image_size // cfg.patch_size
    prompt = eng.image_prompt(chat_segments(eng.tokenizer, [{"role": "user", "content": MEDIA_MARKER + TEXT}], True),
                              [rgb], add_bos=False)
    run = prompt.runs[0]
    assert shown["patches"] == side * side and shown["grid"] == f"{side}x{side}"
    assert shown["tokens"] == inp.num_tokens == shown["norms"] == shown["runLength"] == run.length
    assert shown["tokenGrid"] == f"{side // cfg.merge}x{side // cfg.merge}"
    assert (shown["start"], shown["runStart"], shown["count"]) == (run.start, run.start, len(prompt))
    assert shown["chips"] == [[i, t] for i, t in enumerate(prompt.ids) if not run.start <= i < run.end]
    assert shown["answer"] == 4 and 0.0 <= shown["share"] <= 1.0
    pg.select_option("#model", "tiny")                  # no projector: the way to get one, nothing drawn
    pg.wait_for_selector("#p-vision[data-vision-state=none]", state="attached")
    none = pg.evaluate("() => [document.querySelector('#vision-none').textContent, !!document.querySelector('#vision-canvas')]")
    assert "--mmproj" in none[0] and none[1] is False
    assert not errors, errors
    pg.close()
