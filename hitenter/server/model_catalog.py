"""What a server can load by name (``Catalog``): known models pulled into the model cache
(hitenter/models/registry.py: also those pulled while it runs, by /api/pull), and local ``.gguf`` files
named by their path.

A known name that is not pulled is not loaded on a request (no download behind a chat: pull it first,
as Ollama asks); ``hf:`` references are taken on the command line only.
"""

from __future__ import annotations

from pathlib import Path


class Catalog:
    def __init__(self, paths: bool = True) -> None:
        """``paths``: also load a local .gguf file named by its path."""
        self.paths = paths

    def names(self) -> list[str]:
        """Known models that can be served without a download (pulled)."""
        from hitenter.models.registry import KNOWN_MODELS, model_path

        pulled = [n for n, m in KNOWN_MODELS.items() if m.supported and model_path(n).is_file()]
        return pulled

    def ref(self, name: str) -> str | None:
        """The file (or reference) ``name`` loads from, or None when it names nothing servable. May read
        the file to verify a cached download (ModelLoadError when it fails verification): run it off
        the event loop."""
        from hitenter.models.registry import KNOWN_MODELS, verified_cached

        if name in KNOWN_MODELS:
            path = verified_cached(name)
            return str(path) if path is not None else None
        if self.paths and name.lower().endswith(".gguf"):
            p = Path(name).expanduser()
            return str(p.resolve()) if p.is_file() else None
        return None
