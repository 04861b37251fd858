// Tables and strips wider than their panel scroll sideways (style.css); this says so where it happens: a line
// "scroll sideways" above each one whose content is wider than what shows (data-scrolls on the scroller), kept
// current as panels are redrawn and the window resized (one check per animation frame at most).
import { el } from "./util.js";

const SCROLLERS = ".panel .body table, .panel .scrollx";

export function hintScrollers(root = document) {
  for (const n of root.querySelectorAll(SCROLLERS)) {
    const over = n.scrollWidth > n.clientWidth + 1;
    const prev = n.previousElementSibling;
    const has = prev && prev.classList.contains("scroll-hint");
    if (over && !has) n.before(el("div", { class: "scroll-hint", "aria-hidden": "true" }, "⇠ wider than the screen: scroll sideways ⇢"));
    else if (!over && has) prev.remove();
    if (n.dataset.scrolls !== String(over)) n.dataset.scrolls = String(over);
  }
}

export function watchScrollers(root) {
  let queued = false;
  const check = () => {
    if (queued) return;
    queued = true;
    requestAnimationFrame(() => { queued = false; hintScrollers(root); });
  };
  new MutationObserver(check).observe(root, { childList: true, subtree: true });
  addEventListener("resize", check);
  check();
}
