"""Walk the playground on several models and report what went wrong: for each model (by default SmolLM2-135M-Instruct,
Qwen2.5-Coder-0.5B-Instruct and Gemma-3-270M from ~/.cache/hitenter/models; an absent file is skipped and said so)
this process serves it (a 512-token window, the trigram toy beside it), opens the playground in Debian's Chromium
at 1400x1000, walks the whole story with each step's experiment (hitenter/testing/story_walk.py), then does every
item of docs/playground/articles.md on the dashboard (hitenter/testing/article_walk.py), recording every script
error, console error and refused request (a 5xx, or a 4xx other than the overflow experiment's intended 400 on
/v1/completions) and the number of responses seen.

Each model walks in a child process of its own (a hung page or a crash stops that model only, after --timeout);
its problems are printed as soon as it is done. Exits 1 if any model's walk saw a problem, or if no model was
found.

    .venv/bin/python scripts/playground_walk.py [--models NAME,NAME] [--shots DIR]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

from hitenter.testing import article_walk, story_walk
from hitenter.testing.live_server import live_server
from hitenter.testing.playground_page import CHROMIUM

ROOT = Path(__file__).resolve().parent.parent
MODELS = Path.home() / ".cache" / "hitenter" / "models"
DEFAULT = "smollm2-135m-instruct,qwen2.5-coder-0.5b-instruct,gemma-3-270m"
TABLE = ROOT / "docs" / "playground" / "articles.md"


def table_ids() -> list[str]:
    """The ids of the articles table's rows, in order."""
    rows = [ln for ln in TABLE.read_text().splitlines() if ln.startswith("| ") and not ln.startswith("| id ")]
    return [r.split("|")[1].strip() for r in rows]


def walk_model(browser, path: Path, shots: Path | None) -> dict:
    """Serve `path`, walk the story and the items; {'problems': [...], 'responses': n, 'seconds': s}."""
    from hitenter.engine.llm_engine import LLMEngine
    from hitenter.server.api import create_app

    name = path.stem
    engine = LLMEngine(str(path), max_model_len=512, kv_cache_memory=1 << 26)
    toy = LLMEngine("trigram", kv_cache_memory=1 << 16, block_size=4)
    app = create_app(engine, name, extra_engines={"trigram": toy})
    t0 = time.monotonic()
    seen = {"responses": 0}
    with live_server(app) as srv:
        pg = browser.new_page(viewport={"width": 1400, "height": 1000})
        problems = story_walk.watch(pg)
        pg.on("response", lambda r: seen.__setitem__("responses", seen["responses"] + 1))
        story_walk.open_page(pg, srv.url)
        story_walk.enter(pg, name)

        said = [0]

        def snap(label: str) -> None:
            print(f"  {name}: {label}", flush=True)
            for line in problems[said[0]:]:        # as they happen: a walk stopped by its timeout still tells
                print(f"  PROBLEM {name} (by {label}): {line}", flush=True)
            said[0] = len(problems)
            if shots is not None:
                (shots / name).mkdir(parents=True, exist_ok=True)
                pg.screenshot(path=str(shots / name / f"{label}.png"))

        story_walk.walk_story(pg, lambda i, key: snap(f"story-{i + 1:02d}-{key}"))
        article_walk.walk_items(pg, name, table_ids(), on_item=lambda item: snap(f"item-{item}"))
        pg.close()
    return {"problems": list(problems), "responses": seen["responses"], "seconds": time.monotonic() - t0}


def walk_one(name: str, shots: Path | None) -> int:
    """Walk one model in this process; print its problems; 1 if there were any."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox", "--disable-gpu",
                                                                         "--disable-dev-shm-usage"])
        try:
            r = walk_model(browser, MODELS / f"{name}.gguf", shots)
        except Exception as e:                      # a step that never showed its result, a model that fails to load
            r = {"problems": [f"walk stopped: {type(e).__name__}: {str(e).splitlines()[0]}"], "responses": 0, "seconds": 0.0}
        browser.close()
    print(f"RESULT {name}: {len(r['problems'])} problems, {r['responses']} responses, {r['seconds']:.0f} s", flush=True)
    for line in r["problems"]:
        print(f"  {line}", flush=True)
    return 1 if r["problems"] else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=DEFAULT, help="GGUF names in ~/.cache/hitenter/models, comma-separated")
    ap.add_argument("--shots", type=Path, default=None, help="save a screenshot after every step and item here")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds one model's walk may take (a hung page)")
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)      # the per-model child process
    args = ap.parse_args()
    if args.one:
        return walk_one(args.models, args.shots)
    failed, walked = [], 0
    for name in args.models.split(","):
        path = MODELS / f"{name}.gguf"
        if not path.exists():
            print(f"{name}: skipped, not cached ({path})", flush=True)
            continue
        print(f"{name}: walking", flush=True)
        walked += 1
        cmd = [sys.executable, __file__, "--one", "--models", name] + (["--shots", str(args.shots)] if args.shots else [])
        try:                                        # its own process: a hung page or a crash stops only this model
            rc = subprocess.run(cmd, timeout=args.timeout).returncode
        except subprocess.TimeoutExpired:
            print(f"RESULT {name}: the walk took over {args.timeout:.0f} s (a hung page or server)", flush=True)
            rc = 1
        if rc:
            failed.append(name)
    print(f"walked {walked} model(s); with problems: {', '.join(failed) or 'none'}")
    return 1 if not walked or failed else 0


if __name__ == "__main__":
    sys.exit(main())
