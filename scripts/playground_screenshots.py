"""Screenshots of every story step of the playground, for docs/playground/steps/ (linked from
docs/playground/steps.md).

Starts the server on the default model (SmolLM2-135M-Instruct from ~/.cache/hitenter/models, a 512-token window,
with the trigram toy beside it, as the article tests serve it) in this process, opens the playground in Debian's
Chromium at 1400x1000, presses Enter on "Why is the sky blue?" (12 tokens, seed 42) and walks the story
(hitenter/testing/story_walk.py: each step's experiment run), saving the window at every step as
NN-<key>.png; then a 390x844 phone walks a few steps (phone-NN-<key>.png). The PNGs are palette-quantized
(Pillow, 128 colours), which keeps all of them under 3 MB.

Exits 1, naming them, if the walk saw a script error, a console error or a refused request
(story_walk.watch).

    .venv/bin/python scripts/playground_screenshots.py [--model PATH] [--out DIR] [--phone-steps KEY,KEY]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from PIL import Image

from hitenter.testing import story_walk
from hitenter.testing.live_server import live_server
from hitenter.testing.playground_page import CHROMIUM

ROOT = Path(__file__).resolve().parent.parent
MODEL = Path.home() / ".cache" / "hitenter" / "models" / "smollm2-135m-instruct.gguf"
PHONE_STEPS = "prompt,tokens,attention,temperature,faster,cheat"


def save(pg, path: Path, colours: int = 128) -> int:
    """Save the window as a palette PNG; its size in bytes."""
    raw = path.with_suffix(".raw.png")
    pg.screenshot(path=str(raw))
    Image.open(raw).convert("RGB").quantize(colours, method=Image.Quantize.MEDIANCUT).save(path, optimize=True)
    raw.unlink()
    return path.stat().st_size


def shoot(browser, base: str, out: Path, size: dict, prefix: str, only: set[str] | None) -> list[str]:
    """One page at `size`: Enter, walk the story, a screenshot per step; what the walk saw go wrong."""
    pg = browser.new_page(viewport=size)
    problems = story_walk.watch(pg)
    story_walk.open_page(pg, base)
    story_walk.enter(pg, "smollm2")

    def on_step(i: int, key: str) -> None:
        n = save(pg, out / f"{prefix}{i + 1:02d}-{key.replace('_', '-')}.png")
        print(f"{prefix}{i + 1:02d} {key}: {n / 1024:.0f} KiB", flush=True)

    story_walk.walk_story(pg, on_step, only)
    pg.close()
    return problems


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=MODEL)
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "playground" / "steps")
    ap.add_argument("--phone-steps", default=PHONE_STEPS, help="story step keys shot at 390x844 (empty: none)")
    ap.add_argument("--no-desktop", action="store_true", help="only the phone shots")
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright

    from hitenter.engine.llm_engine import LLMEngine
    from hitenter.server.api import create_app

    args.out.mkdir(parents=True, exist_ok=True)
    main_engine = LLMEngine(str(args.model), max_model_len=512, kv_cache_memory=1 << 26)
    toy = LLMEngine("trigram", kv_cache_memory=1 << 16, block_size=4)
    app = create_app(main_engine, "smollm2", extra_engines={"trigram": toy})
    problems: list[str] = []
    with live_server(app) as srv, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox", "--disable-gpu",
                                                                         "--disable-dev-shm-usage"])
        if not args.no_desktop:
            problems += shoot(browser, srv.url, args.out, {"width": 1400, "height": 1000}, "", None)
        phone = {k for k in args.phone_steps.split(",") if k}
        if phone:
            problems += shoot(browser, srv.url, args.out, {"width": 390, "height": 844}, "phone-", phone)
        browser.close()
    total = sum(f.stat().st_size for f in args.out.glob("*.png"))
    print(f"{len(list(args.out.glob('*.png')))} PNGs in {args.out}: {total / 1e6:.2f} MB")
    for line in problems:
        print("PROBLEM", line, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
