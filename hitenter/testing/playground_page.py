"""Driving the playground page in a headless browser: the browser it needs, the tiny engine's options the
page tests serve, and the page actions they share (enter a prompt, wait for the run to finish, read ids)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

CHROMIUM = Path("/usr/bin/chromium")
TINY_OPTS = dict(kv_cache_memory=64 * 4 * 512, block_size=4, max_model_len=128, max_num_batched_tokens=16)


def data(pg: Any, sel: str, attr: str) -> str:
    """The `data-<attr>` attribute of the element `sel` on the page `pg` (a playwright Page)."""
    return pg.get_attribute(sel, f"data-{attr}")


def enter(pg: Any, prompt: str, *, max_tokens: int = 12, seed: int = 7, stop: str = "", model: str = "tiny",
          chat: bool = True, trigram: bool = False) -> None:
    """Fill the dashboard's form, press Enter on the prompt and wait until the run has finished."""
    pg.select_option("#model", model)
    pg.set_checked("#chat", chat)
    pg.set_checked("#with_trigram", trigram)
    pg.fill("#max_tokens", str(max_tokens))
    pg.fill("#seed", str(seed))
    pg.fill("#stop", stop)
    pg.fill("#prompt", prompt)
    pg.evaluate("() => { const f = document.querySelector('#finish'); if (f) f.dataset.reason = ''; }")
    pg.press("#prompt", "Enter")
    finished(pg)


def finished(pg: Any) -> None:
    """Wait until the page shows a finish reason and its pause button is off."""
    pg.wait_for_function("() => { const f = document.querySelector('#finish'); return f && f.dataset.reason; }",
                         timeout=30000)
    pg.wait_for_function("() => !document.querySelector('#btn-pause') || document.querySelector('#btn-pause').disabled")


def gen_ids(pg: Any) -> list[int]:
    """The generated token ids the page shows."""
    return json.loads(data(pg, "#gen-tokens", "ids"))
