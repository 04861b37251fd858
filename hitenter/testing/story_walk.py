"""Walking the playground's story in a browser, step by step, the way a learner would: each step's experiment
run (its break-it button, drill, measurement or slider) and waited for, then handed to a callback (a screenshot,
a check). And a watch on the page for what must never happen on a walk: a script error, a console error, a 5xx
answer, or a 4xx other than the overflow experiment's intended 400 on /v1/completions.

The page is a playwright Page on the playground (hitenter/web/); nothing here acts on a node the page may redraw
through a call that does not retry: a button is clicked again until its result shows (a redraw can replace it
under the click), sliders move and results are read inside one page evaluation."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

WAIT = 180000            # ms: a side request on a busy 2-core machine
SETTLE = 700             # ms: panels off screen redraw at most every 500 ms (app.js FULL_MS)
PROMPT = "Why is the sky blue?"
# the engine's step counter as the page last saw it (its list of steps keeps only the last 200)
STEP_JS = "(window.playground.eng.kv ? window.playground.eng.kv.step_counter : 0)"


def watch(pg: Any) -> list[str]:
    """Start recording the page's script errors, console errors and refused requests; the live list."""
    problems: list[str] = []
    pg.on("pageerror", lambda e: problems.append(f"script error: {e}"))
    pg.on("console", lambda m: problems.append(f"console: {m.text}")
          if m.type == "error" and "Failed to load resource" not in m.text else None)
    pg.on("response", lambda r: problems.append(f"{r.status} {r.request.method} {r.url}") if r.status >= 500
          or (r.status >= 400 and not (r.status == 400 and r.url.endswith("/v1/completions"))) else None)
    return problems


def open_page(pg: Any, base: str) -> None:
    """Load the playground from `base` and wait until it has its models."""
    pg.goto(base + "/")
    pg.wait_for_selector("body[data-ready=true]", timeout=60000)


def settle(pg: Any) -> None:
    """Let the last full redraw land, then two animation frames."""
    pg.wait_for_timeout(SETTLE)
    pg.evaluate("() => new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r)))")


def enter(pg: Any, model: str, prompt: str = PROMPT, *, max_tokens: int = 12, seed: int = 42,
          trigram: bool = True) -> None:
    """Fill the form, press Enter and wait for the run, its trace and (with the trigram toy) the toy's run."""
    pg.select_option("#model", model)
    pg.set_checked("#chat", True)
    toy = pg.evaluate("() => Boolean(window.playground.models.find((m) => m.trigram))")
    if pg.is_visible("#with_trigram"):
        pg.set_checked("#with_trigram", trigram and toy)
    pg.fill("#max_tokens", str(max_tokens))
    pg.fill("#seed", str(seed))
    pg.fill("#stop", "")
    pg.fill("#prompt", prompt)
    traced = pg.evaluate("""() => { const f = document.querySelector('#finish'); if (f) f.dataset.reason = '';
      return document.body.dataset.insideReady || ''; }""")
    pg.press("#prompt", "Enter")
    pg.wait_for_function("() => { const f = document.querySelector('#finish'); return f && f.dataset.reason; }",
                         timeout=WAIT)
    pg.wait_for_function("(t) => document.body.dataset.insideReady && document.body.dataset.insideReady !== t",
                         arg=traced, timeout=WAIT)
    if trigram and toy:
        pg.wait_for_function("() => window.playground.tri && window.playground.tri.finish", timeout=WAIT)
    settle(pg)


def slide(pg: Any, name: str, value: float) -> None:
    """Move a sampler slider as a hand would (its input event), in one evaluation."""
    pg.evaluate("""([n, v]) => { const s = document.querySelector('#slider-' + n); if (!s || +s.value === v) return;
      s.value = v; s.dispatchEvent(new Event('input', { bubbles: true })); }""", [name, value])


def press(pg: Any, button: str, shown: str, *, tries: int = 4) -> None:
    """Click `button` until `shown` (a selector) appears: a redraw can replace the button under a click."""
    for _ in range(tries):
        pg.click(button)
        try:
            pg.wait_for_selector(shown, timeout=15000)
            return
        except Exception:                          # playwright's TimeoutError: the click was lost, click again
            continue
    pg.wait_for_selector(shown, timeout=WAIT)


def _fill(pg: Any, sel: str, value: str) -> None:
    pg.fill(sel, value)


def _drill_words(pg: Any) -> None:
    _fill(pg, "#drill-words-answer", "4000")
    pg.click("#drill-words-check")
    pg.wait_for_selector("#drill-words-result[data-ok=true]", timeout=WAIT)


def _drill_softmax(pg: Any) -> None:
    pg.wait_for_selector("#drill-softmax[data-p]", timeout=WAIT)
    p = pg.evaluate("() => JSON.parse(document.querySelector('#drill-softmax').dataset.p)[0]")
    _fill(pg, "#drill-softmax-answer", f"{100 * p:.1f}")
    pg.click("#drill-softmax-check")
    pg.wait_for_selector("#drill-softmax-result[data-ok=true]", timeout=WAIT)


def _determinism(pg: Any) -> None:
    slide(pg, "temperature", 0)
    _fill(pg, "#det-n", "4")
    press(pg, "#btn-det", "#det-arith")


def _top_k(pg: Any) -> None:
    slide(pg, "temperature", 1)
    slide(pg, "top_k", 5)
    pg.wait_for_selector("#dist-table[data-reshaped=true][data-top-k='5']", timeout=WAIT)


def _top_p(pg: Any) -> None:
    slide(pg, "top_k", -1)
    slide(pg, "top_p", 0.5)
    pg.wait_for_selector("#dist-table[data-reshaped=true][data-top-p='0.5']", timeout=WAIT)


def _draw(pg: Any) -> None:
    slide(pg, "top_p", 1)                          # the draw at the run's own settings (panel 2 is off the stage)
    slide(pg, "temperature", 0.8)
    pg.wait_for_function("() => { const s = window.playground.sampling; return s.temperature === 0.8 && s.top_p === 1; }",
                         timeout=WAIT)


def _faster(pg: Any) -> None:
    _fill(pg, "#measure-n", "4")
    press(pg, "#btn-measure", "#fast-measured")


def _batching(pg: Any) -> None:
    before = pg.evaluate(f"() => {STEP_JS}")
    _fill(pg, "#burst-n", "6")
    pg.click("#btn-burst")
    pg.wait_for_function(f"(n) => {STEP_JS} >= n + 6", arg=before, timeout=WAIT)


def _undo_determinism(pg: Any) -> None:
    slide(pg, "temperature", 0.8)


def _rerun(pg: Any) -> None:
    """The overflow experiment leaves its refused request as the page's run: Enter the form again, as a learner
    would, so the later steps show a run."""
    if not pg.evaluate("() => Boolean(window.playground.run && window.playground.run.error)"):
        return
    model = pg.input_value("#model")
    enter(pg, model, pg.input_value("#prompt"), max_tokens=int(pg.input_value("#max_tokens")),
          seed=int(pg.input_value("#seed")), trigram=pg.is_checked("#with_trigram"))


# what each step does before it is looked at (steps not named here only show the run)
ACTIONS: dict[str, Callable[[Any], None]] = {
    "drill_words": _drill_words,
    "order": lambda pg: pg.wait_for_selector("#order", timeout=WAIT),
    "attention": lambda pg: press(pg, "#btn-compare", "#compare, #compare-error"),
    "drill_softmax": _drill_softmax,
    "hot": lambda pg: press(pg, "#btn-temps", "#temps-side .temprow:nth-child(3)"),
    "top_k": _top_k,
    "top_p": _top_p,
    "draw": _draw,
    "determinism": _determinism,
    "loop": _undo_determinism,
    "overrule": lambda pg: press(pg, "#btn-overrule", "#overrule, #overrule-error"),
    "no_eos": lambda pg: press(pg, "#btn-ignore-eos", "#eos-compare"),
    "overflow": lambda pg: press(pg, "#btn-overflow", "#v1-overflow"),
    "trigram": _rerun,
    "batching": _batching,
    "faster": _faster,
}


# where the window looks once a step's experiment ran: its result (block 'nearest' after the window's top shows
# as much of the step's text as fits; 'center' for a result far down a long panel); other steps: the window's top
LOOK: dict[str, tuple[str, str]] = {
    "attention": ("#compare", "center"), "hot": ("#temps-side", "nearest"), "determinism": ("#det-result", "nearest"),
    "overrule": ("#overrule", "nearest"), "no_eos": ("#eos-compare", "nearest"), "overflow": ("#overflow", "nearest"),
    "faster": ("#fast-measured", "nearest"), "drill_softmax": ("#drill-softmax-result", "nearest"),
}


def look(pg: Any, key: str) -> None:
    """Scroll the window to the step's result (LOOK) or to its top, in one evaluation."""
    sel, block = LOOK.get(key, ("", "start"))
    pg.evaluate("""([sel, block]) => { window.scrollTo(0, 0); const n = sel && document.querySelector(sel);
      if (n) n.scrollIntoView({ block }); }""", [sel, block])


def story_keys(pg: Any) -> list[str]:
    """The story's step keys, in order."""
    return pg.evaluate("() => [...document.querySelectorAll('#story-rail li')].map((l) => l.dataset.key)")


def walk_story(pg: Any, on_step: Callable[[int, str], None], only: set[str] | None = None) -> list[str]:
    """Open story mode and show each step in order (or those in `only`), run its experiment (ACTIONS), look at its
    result (LOOK), let the panels settle and call on_step(index, key); the keys walked."""
    pg.click("#view-story")
    walked = []
    for i, key in enumerate(story_keys(pg)):
        if only is not None and key not in only:
            continue
        pg.click(f"#story-rail li[data-key='{key}']")
        pg.wait_for_selector(f"#story[data-step='{key}']", timeout=WAIT)
        if key in ACTIONS:
            ACTIONS[key](pg)
        look(pg, key)
        settle(pg)
        on_step(i, key)
        walked.append(key)
    return walked
