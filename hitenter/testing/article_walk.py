"""Doing every item of the four articles (docs/playground/articles.md) on the dashboard with any model: DRIVES maps
each item's id to what a reader does for it (a button, a slider, a typed word, another Enter) and the marker it
waits for. It checks no numbers (tests/playground/test_article_items.py does, on the default model): it makes the
page ask the server for everything an item shows, so a walk on another model can watch for errors
(story_walk.watch). An item whose control a server lacks (speculation on a server without it) does what the
page offers there: it reads the explanation.

Nothing here acts on a node the page may redraw through a call that does not retry (story_walk.press clicks until
the result shows; hovers, reads and scrolls are single page evaluations)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hitenter.testing.story_walk import PROMPT, STEP_JS, WAIT, enter, press, settle, slide

LONG = " ".join(["The sky looks blue because air scatters short wavelengths of sunlight more than long ones."] * 14)


class Reader:
    """The page, the model it reads with and the prompt it came with (restored after an item changes it)."""

    def __init__(self, pg: Any, model: str, trigram: bool) -> None:
        self.pg, self.model, self.trigram = pg, model, trigram

    def enter(self, prompt: str = PROMPT, **kw: Any) -> None:
        enter(self.pg, self.model, prompt, trigram=self.trigram, **kw)

    def show(self, sel: str) -> None:
        """Wait for `sel` and scroll it into view (one evaluation)."""
        self.pg.wait_for_selector(sel, timeout=WAIT, state="attached")
        self.pg.evaluate("(s) => { const n = document.querySelector(s); if (n) n.scrollIntoView({ block: 'center' }); }", sel)

    def preview(self, text: str) -> None:
        """Type `text` without pressing Enter; wait until panel 1 previews its tokens."""
        before = self.pg.evaluate("() => (document.querySelector('#prompt-tokens') || { dataset: {} }).dataset.ids || ''")
        self.pg.fill("#prompt", text)
        self.pg.dispatch_event("#prompt", "input")
        self.pg.wait_for_function("(b) => { const n = document.querySelector('#prompt-tokens'); return n && n.dataset.ids"
                                  " && n.dataset.ids !== b; }", arg=before, timeout=WAIT)


def _look(sel: str) -> Callable[[Reader], None]:
    return lambda r: r.show(sel)


def _replay(r: Reader) -> None:
    r.pg.evaluate("() => { const n = document.querySelector('#replay'); if (n) n.remove(); }")
    press(r.pg, "#btn-replay", "#replay")


def _seeds(r: Reader) -> None:
    r.enter(seed=43)
    _replay(r)
    r.enter()


def _probe(r: Reader) -> None:
    r.pg.fill("#probe-word", "king")
    press(r.pg, "#btn-probe", "#probe[data-word='king'], #probe-error")


def _reshape(**params: float) -> Callable[[Reader], None]:
    def go(r: Reader) -> None:
        for k, v in params.items():
            slide(r.pg, k, v)
        sel = "".join(f"[data-{k.replace('_', '-')}='{v}']" for k, v in params.items())
        r.pg.wait_for_selector(f"#dist-table[data-reshaped=true]{sel}", timeout=WAIT)
        for k, v in (("top_k", -1), ("top_p", 1), ("temperature", 0.8)):
            slide(r.pg, k, v)
        settle(r.pg)
    return go


def _determinism(r: Reader) -> None:
    slide(r.pg, "temperature", 0)
    r.pg.fill("#det-n", "4")
    press(r.pg, "#btn-det", "#det-arith, #det-result .err")
    slide(r.pg, "temperature", 0.8)


def _steps(r: Reader) -> None:
    for n in (1, 2, 3):
        r.pg.click("#btn-step")
        r.pg.wait_for_function("(n) => { const x = window.playground.run; return x.mode === 'step' && x.stepInfo"
                               " && x.stepInfo.n === n && x.tokens.length === n; }", arg=n, timeout=WAIT)
    r.enter()


def _long(r: Reader) -> None:
    r.enter(LONG + " Summarise that in one line.", max_tokens=4)
    r.show("#timeline")
    r.enter()


def _burst(r: Reader) -> None:
    # the burst's steps, whatever they batch (a model that ends its replies at once may never hold 4 together)
    before = r.pg.evaluate(f"() => {STEP_JS}")
    r.pg.fill("#burst-n", "4")
    r.pg.click("#btn-burst")
    r.pg.wait_for_function(f"(n) => {STEP_JS} >= n + 4", arg=before, timeout=WAIT)
    r.pg.fill("#measure-n", "4")
    press(r.pg, "#btn-measure", "#fast-measured")


def _speculative(r: Reader) -> None:
    r.show("#fast-spec")
    if r.pg.get_attribute("#fast-spec", "data-on") == "true":
        r.pg.fill("#spec-tokens", "16")
        press(r.pg, "#btn-spec", "#spec-compare, #spec-result .err")


def _typed(text: str) -> Callable[[Reader], None]:
    def go(r: Reader) -> None:
        r.preview(text)
        r.show("#prompt-tokens")
        r.pg.fill("#prompt", PROMPT)
        r.pg.dispatch_event("#prompt", "input")
        r.enter()
    return go


def _drill_words(r: Reader) -> None:
    for guess in ("3000", "4000"):
        r.pg.fill("#drill-words-answer", guess)
        r.pg.click("#drill-words-check")
        r.pg.wait_for_selector(f"#drill-words-result[data-ok={'true' if guess == '4000' else 'false'}]", timeout=WAIT)


def _drill_softmax(r: Reader) -> None:
    r.pg.wait_for_selector("#drill-softmax[data-p]", timeout=WAIT)
    p = r.pg.evaluate("() => JSON.parse(document.querySelector('#drill-softmax').dataset.p)[0]")
    r.pg.fill("#drill-softmax-answer", f"{100 * p:.1f}")
    r.pg.click("#drill-softmax-check")
    r.pg.wait_for_selector("#drill-softmax-result[data-ok=true]", timeout=WAIT)
    r.pg.click("#drill-shift")


def _greedy(r: Reader) -> None:
    slide(r.pg, "temperature", 0)
    r.enter(seed=7)
    slide(r.pg, "temperature", 0.8)
    r.enter()


def _stop(r: Reader) -> None:
    words = [w for w in r.pg.evaluate("() => window.playground.run.text").split() if len(w) >= 3]
    if words:
        r.pg.fill("#stop", words[len(words) // 2])
        r.pg.press("#prompt", "Enter")
        r.pg.wait_for_function("() => { const f = document.querySelector('#finish'); return f && f.dataset.reason; }",
                               timeout=WAIT)
        settle(r.pg)
    r.enter()


def _overflow(r: Reader) -> None:
    press(r.pg, "#btn-overflow", "#v1-overflow")
    r.enter()


def _qkv(r: Reader) -> None:
    r.pg.wait_for_selector("#attn-focus[data-q]", timeout=WAIT)
    q = r.pg.evaluate("""() => { const q = document.querySelector('#attn-focus').dataset.q;
      const c = document.querySelector(`#attn-heat [data-q='${q}'][data-k='${q}']`) || document.querySelector('#attn-heat .qlab');
      if (c) c.dispatchEvent(new MouseEvent('mouseenter')); return q; }""")
    r.pg.wait_for_selector(f"#attn-qk[data-q='{q}']", timeout=WAIT)


def _heads(r: Reader) -> None:
    r.pg.wait_for_selector("#attn-grid .hcell", timeout=WAIT)
    r.pg.evaluate("() => { const c = document.querySelectorAll('#attn-grid .hcell'); c[c.length - 1].click(); }")
    r.show("#attn-heat")


def _ffn(r: Reader) -> None:
    r.pg.wait_for_selector("#ffn-layer", timeout=WAIT)
    r.pg.evaluate("() => { const s = document.querySelector('#ffn-layer'); s.value = 0;"
                  " s.dispatchEvent(new Event('input', { bubbles: true })); s.dispatchEvent(new Event('change', { bubbles: true })); }")
    r.pg.wait_for_selector("#ffn-block, #ffn-error", timeout=WAIT)


def _order(r: Reader) -> None:
    press(r.pg, "#btn-order", "#order, #order-error")


# what a reader does for each item of docs/playground/articles.md (the story steps are story_walk's)
DRIVES: dict[str, Callable[[Reader], None]] = {
    "enter-streams": lambda r: r.show("#answer-text"), "same-question-differs": _seeds,
    "bpe-tokens": _look("#prompt-tokens"), "four-chars": _look("#chars-per-token"), "token-ids": _look("#prompt-tokens"),
    "embedding-row": _look("#embedding"), "similar-meanings": _probe, "looks-back": _look("#attn-heat"),
    "river-bank": lambda r: press(r.pg, "#btn-compare", "#compare, #compare-error"), "dozens-of-layers": _look("#resid-norms"),
    "score-per-token": _look("#logits"), "one-next-token": _look("#gen-tokens"), "dice-roll": _look("#dice"),
    "temperature-reshapes": _reshape(temperature=0.5),
    "temperature-range": lambda r: press(r.pg, "#btn-temps", "#temps-side .temprow:nth-child(3)"),
    "nucleus": _reshape(temperature=1, top_p=0.5), "temp0-batch": _determinism, "loop": _steps,
    "prefill": _look("#timeline"), "long-document": _long, "decode": _look("#fast"), "kv-fills": _look("#req-kv"),
    "kv-800kb": _look("#fast-kv"), "window-limit": _look("#ctx-count"), "batching": _burst, "quantization": _look("#fast"),
    "speculative": _speculative, "disaggregation": _look("#fast"), "summary": _look("#cheat"),
    "readable-model": _look("#p-trigram"), "vocab-ids": _look("#prompt-tokens"), "bytes-fallback": _typed("I love 🦙 llamas"),
    "unit-of-everything": _look("#req-kv"), "drill-words": _drill_words, "softmax": _look("#logits"),
    "how-sure": _look("#entropy"), "drill-softmax": _drill_softmax, "passes": _look("#inspector-trace"),
    "overrule": lambda r: press(r.pg, "#btn-overrule", "#overrule, #overrule-error"), "greedy": _greedy,
    "seed-repeatable": _replay, "temperature-up": lambda r: press(r.pg, "#btn-temps", "#temps-side .temprow:nth-child(3)"),
    "ignore-eos": lambda r: press(r.pg, "#btn-ignore-eos", "#eos-compare"), "three-stops": _stop, "overflow": _overflow,
    "two-tokens": _look("#p-trigram"), "receive-prompt": _look("#inspector-json"), "not-words": _typed("Unbelievable"),
    "positions": _order, "qkv": _qkv, "multi-head": _heads, "ffn-norm": _ffn, "residual": _look("#resid-parts"),
    "contextual": lambda r: press(r.pg, "#btn-compare", "#compare, #compare-error"), "top-k": _reshape(temperature=1, top_k=5),
    "first-token-slowest": _look("#timeline"), "flash-attention": _look("#fast"), "tensor-parallel": _look("#fast"),
}


def walk_items(pg: Any, model: str, ids: list[str], trigram: bool = True,
               on_item: Callable[[str], None] | None = None) -> None:
    """On the dashboard: Enter the base prompt on `model`, then do each item of `ids` in turn (DRIVES)."""
    r = Reader(pg, model, trigram)
    pg.click("#view-dash")
    r.enter()
    for item in ids:
        DRIVES[item](r)
        settle(pg)
        if on_item is not None:
            on_item(item)
