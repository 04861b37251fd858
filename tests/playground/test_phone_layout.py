"""A phone (390x844): nothing forces the page wider than the window; every table or strip wider than its panel
scrolls sideways and says so (a visible hint right above it); the cheat sheet's "here" column (this model's and
this run's numbers) shows inside the window. On a desktop the cheat sheet's "here" column shows too. Real
Chromium on the tiny llama server of tests/playground/conftest.py."""

from __future__ import annotations

import pytest

from hitenter.testing.paths import TEST_OUTPUT
from hitenter.testing.playground_page import CHROMIUM, enter

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's /usr/bin/chromium")]

SCROLLERS = """() => [...document.querySelectorAll('.panel .body table, .panel .scrollx')]
  .filter((n) => n.getBoundingClientRect().width > 0)
  .map((n) => { const h = n.previousElementSibling, r = h ? h.getBoundingClientRect() : null;
    return { id: n.id || n.className, section: n.closest('section').id, over: n.scrollWidth > n.clientWidth + 1,
      scrolls: n.dataset.scrolls || null, hint: Boolean(h && h.classList.contains('scroll-hint') && r.width > 0 && r.height > 0
        && getComputedStyle(h).visibility !== 'hidden') }; })"""

HERE = """() => { document.querySelector('#cheat').scrollIntoView({ block: 'nearest' });
  return [...document.querySelectorAll('#cheat td.here')].filter((c) => c.textContent.trim()).map((c) => {
  const r = c.getBoundingClientRect(), box = c.closest('.panel').getBoundingClientRect();
  return { text: c.textContent, left: r.left, right: r.right, width: r.width, boxLeft: box.left, boxRight: box.right }; }); }"""


def _page(browser, server, width: int, height: int):
    pg = browser.new_page(viewport={"width": width, "height": height})
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    pg.goto(server[0] + "/")
    pg.wait_for_selector("body[data-ready=true]", timeout=20000)
    pg.click("#view-dash")
    traced = pg.evaluate("() => document.body.dataset.insideReady || ''")
    enter(pg, "the deploy failed on the second server", max_tokens=8)
    pg.wait_for_function(f"() => document.body.dataset.insideReady && document.body.dataset.insideReady !== '{traced}'",
                         timeout=60000)
    return pg, errors


def _here_inside(pg, right_edge: float) -> None:
    cells = pg.evaluate(HERE)                             # scrolls and measures in one call: a redraw replaces #cheat
    assert len(cells) >= 3, cells                         # the run and the trace fill several
    for c in cells:
        assert c["width"] > 20 and c["left"] >= c["boxLeft"] - 1 and c["right"] <= min(c["boxRight"], right_edge) + 1, c


def test_phone_tables_scroll_with_a_hint_and_the_cheat_sheet_fits(browser, server) -> None:
    pg, errors = _page(browser, server, 390, 844)
    assert pg.evaluate("() => document.documentElement.scrollWidth") <= 390
    pg.wait_for_timeout(300)                              # the hints follow the last redraw by one frame
    found = pg.evaluate(SCROLLERS)
    wide = [s for s in found if s["over"]]
    assert wide, found                                   # the distribution table at least is wider than a phone
    for s in found:
        assert s["hint"] == s["over"] and s["scrolls"] == ("true" if s["over"] else "false"), s
    moved = pg.evaluate("""() => { const n = document.querySelector('.panel .body [data-scrolls=true]');
      n.scrollLeft = n.scrollWidth; return n.scrollLeft; }""")
    assert moved > 0                                     # it really scrolls sideways
    pg.locator("#p-dist").screenshot(path=str(TEST_OUTPUT / "phone-table-scrolls.png"))
    _here_inside(pg, 390)
    assert pg.evaluate("() => { const t = document.querySelector('#cheat'); return t.scrollWidth <= t.clientWidth + 1; }")
    pg.locator("#p-cheat").screenshot(path=str(TEST_OUTPUT / "phone-cheat-sheet.png"))
    pg.close()
    assert not errors, errors


def test_desktop_cheat_sheet_shows_its_here_column(browser, server) -> None:
    pg, errors = _page(browser, server, 1400, 1000)
    _here_inside(pg, 1400)
    pg.close()
    assert not errors, errors
