"""The walks the screenshot and several-model scripts make (hitenter/testing/story_walk.py, article_walk.py) cover
what they claim: article_walk.DRIVES has one drive per row of docs/playground/articles.md and no other, and every
step story_walk acts on or looks at is a step of the page's story (hitenter/web/story.js). No browser."""

from __future__ import annotations

import re
from pathlib import Path

from hitenter.testing import article_walk, story_walk

ROOT = Path(__file__).resolve().parents[2]


def test_every_article_item_has_a_drive() -> None:
    rows = [ln for ln in (ROOT / "docs" / "playground" / "articles.md").read_text().splitlines()
            if ln.startswith("| ") and not ln.startswith("| id ")]
    ids = [r.split("|")[1].strip() for r in rows]
    assert len(ids) >= 50 and set(article_walk.DRIVES) == set(ids), set(article_walk.DRIVES) ^ set(ids)


def test_story_actions_name_real_steps() -> None:
    keys = re.findall(r'\{ key: "(\w+)"', (ROOT / "hitenter" / "web" / "story.js").read_text())
    assert len(keys) >= 28
    assert set(story_walk.ACTIONS) <= set(keys) and set(story_walk.LOOK) <= set(keys)
