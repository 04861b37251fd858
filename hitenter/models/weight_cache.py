"""A GGUF's weight arena kept on disk: built once (fused, un-permuted, repacked), mapped by every later load.

What the native kernels read is not always the file's bytes: a fused Q/K/V or gate/up projection is one
run of rows, llama's Q/K rows are un-permuted and Q4_0 / Q4_1 / Q8_0 are repacked
(hitenter/models/block_linear.py `own_block_bytes`). Building that costs a copy of every weight byte at each
load. `WeightCache` writes the arena once to `<HITENTER_HOME>/weights/<name>-<path hash>.arena` and maps it
on the next load: the model is then built over placeholders (torch "meta" tensors: shapes, no bytes) and
its weights become views of the mapped file, so a load costs the page-table entries of pages already in
the page cache, every process on one model shares one copy, and a file written in one go is mapped with
2 MB pages where the OS has them (hitenter/kernels/arena.py `WeightArena.mapped`).

The file: a JSON header padded to 2 MB, then the arena's bytes. The header names the GGUF (real path,
size, mtime, inode), the cache format (`LAYOUT`), a hash of the code that decides the layout (the model
and kernel sources, `code_hash`) and the slot list (type, shape, repack lanes, bytes of each weight, in
arena order). A load uses the file only when all of these match what it is about to build; otherwise it
builds the arena from the GGUF and writes the file again. Files of GGUFs that no longer exist are
removed when a new one is written. GGUFs under `MIN_GGUF_BYTES` (load in well under a second) and tensor
parallel shards are not cached; `HITENTER_WEIGHT_CACHE=0` turns the cache off.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hitenter import envs
from hitenter.kernels.arena import HUGE, WeightArena
from hitenter.paths import hitenter_home

log = logging.getLogger("hitenter.loader")

LAYOUT = 1                    # the file's own format
MIN_GGUF_BYTES = 64 << 20
MAGIC = b"HITENTER-ARENA\n"
# the sources that decide an arena's bytes: the block types, fusing, un-permutation, repacking, the build
_LAYOUT_SOURCES = ("kernels/blocks.py", "kernels/qmatmul.py", "kernels/csrc/qmatmul/*", "models/block_linear.py",
                   "models/layers.py", "models/decoder.py", "models/experts.py", "models/moe.py",
                   "models/loader.py", "models/weight_cache.py", "models/families/*.py")

Slot = tuple[int, int, int, int, int]   # (qtype, rows, columns, repack lanes, bytes)


@functools.cache
def code_hash() -> str:
    """SHA-1 over the sources that decide the arena's bytes (`_LAYOUT_SOURCES`: block types, fusing,
    un-permutation, repacking): any change to them makes earlier cache files stale."""
    root = Path(__file__).resolve().parent.parent
    h = hashlib.sha1()
    for pattern in _LAYOUT_SOURCES:
        for p in sorted(root.glob(pattern)):
            if p.is_file():
                h.update(str(p.relative_to(root)).encode())
                h.update(p.read_bytes())
    return h.hexdigest()


def cache_dir() -> Path:
    return hitenter_home() / "weights"


@dataclass
class WeightCache:
    """The cache file of one GGUF: `hit` when a file for this GGUF and code exists (its slots still to be
    matched by `map`; the loader then builds the model over placeholders)."""

    gguf: Path
    path: Path
    key: dict[str, Any]
    hit: bool = False
    slots: list[Slot] = field(default_factory=list)

    @classmethod
    def for_gguf(cls, gguf_path: str | os.PathLike[str]) -> WeightCache | None:
        """The cache of this GGUF, None where caching does not apply (switched off, a small file, a
        path that cannot be stat'ed)."""
        if not envs.HITENTER_WEIGHT_CACHE.get():
            return None
        try:
            real = Path(gguf_path).resolve()
            st = real.stat()
        except OSError:
            return None
        if st.st_size < MIN_GGUF_BYTES:
            return None
        key = {"source": str(real), "size": st.st_size, "mtime_ns": st.st_mtime_ns, "ino": st.st_ino,
               "layout": LAYOUT, "code": code_hash()}
        name = f"{real.stem}-{hashlib.sha1(str(real).encode()).hexdigest()[:12]}.arena"
        cache = cls(real, cache_dir() / name, key)
        header = _read_header(cache.path)
        if header is not None and header.get("key") == key:
            cache.hit, cache.slots = True, [tuple(s) for s in header.get("slots", [])]
        return cache

    def map(self, slots: list[Slot]) -> WeightArena | None:
        """The cached arena mapped, when its slots are `slots`; None otherwise (the caller builds it)."""
        if not self.hit or self.slots != [tuple(s) for s in slots]:
            return None
        try:
            with open(self.path, "rb") as f:
                nbytes = os.fstat(f.fileno()).st_size - HUGE
                if nbytes < _arena_bytes(slots):
                    return None
                return WeightArena.mapped(f.fileno(), HUGE, nbytes)
        except (OSError, ValueError) as e:
            log.warning("weight cache %s unreadable (%s): building from the GGUF", self.path, e)
            return None

    def store(self, arena: WeightArena, slots: list[Slot]) -> WeightArena | None:
        """Write `arena` (filled in `slots` order) to the cache file and return it mapped from there (the
        anonymous copy can then go); None where it cannot be written (the build's arena is kept)."""
        header = json.dumps({"key": self.key, "slots": slots}).encode()
        if len(MAGIC) + 8 + len(header) > HUGE:
            return None
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            _remove_orphans(self.path.parent)
            free = os.statvfs(self.path.parent)
            if free.f_bavail * free.f_frsize < 2 * (arena.used + HUGE):
                log.info("weight cache: too little disk space for %s", self.path)
                return None
            with open(tmp, "wb") as f:
                f.write(MAGIC + len(header).to_bytes(8, "little") + header)
                f.truncate(HUGE)
                f.seek(HUGE)
                f.write(arena.filled())
            os.replace(tmp, self.path)
            with open(self.path, "rb") as f:
                return WeightArena.mapped(f.fileno(), HUGE, arena.used)
        except (OSError, ValueError) as e:
            log.warning("weight cache: could not write %s (%s)", self.path, e)
            tmp.unlink(missing_ok=True)
            return None


def _arena_bytes(slots: list[Slot]) -> int:
    from hitenter.kernels.arena import ALIGN

    end = 0
    for s in slots:
        end = (end + ALIGN - 1) // ALIGN * ALIGN + s[4]
    return end


def _read_header(path: Path) -> dict[str, Any] | None:
    """The header of a cache file, None for a missing or malformed one."""
    try:
        with open(path, "rb") as f:
            head = f.read(len(MAGIC) + 8)
            if len(head) != len(MAGIC) + 8 or not head.startswith(MAGIC):
                return None
            n = int.from_bytes(head[len(MAGIC):], "little")
            if n > HUGE:
                return None
            out = json.loads(f.read(n))
    except (OSError, ValueError):
        return None
    return out if isinstance(out, dict) else None


def _remove_orphans(folder: Path) -> None:
    """Remove the cache files whose GGUF is gone, and temporary files left by a process that died."""
    for p in folder.iterdir():
        if p.name.endswith(".tmp") and p.name.startswith("."):
            pid = p.name.rsplit(".", 2)[-2]
            if pid.isdigit() and not Path(f"/proc/{pid}").exists():
                p.unlink(missing_ok=True)
            continue
        if p.suffix != ".arena":
            continue
        header = _read_header(p)
        source = (header or {}).get("key", {}).get("source")
        if not isinstance(source, str) or not Path(source).exists():
            p.unlink(missing_ok=True)
