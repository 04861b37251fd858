"""One block of memory for a model's block weights, backed by transparent huge pages where the OS has them.

Why: a decode step streams every weight byte once, and with 4 KB pages each page is a fresh TLB walk
and a fresh start for the hardware prefetcher (it does not cross pages). 2 MB pages make decode steps
faster (figures: docs/benchmarks.md). `madvise(MADV_HUGEPAGE)` asks for them
per mapping, so this works when the system setting is `madvise` (the common default) as well as
`always`; where the OS refuses, the memory is ordinary pages and nothing else changes.

`HITENTER_HUGEPAGES=0` turns the advice off (the arena is still one mapping).
"""

from __future__ import annotations

import ctypes
import mmap
import warnings

import numpy as np
import torch

from hitenter import envs

ALIGN = 64          # each tensor starts on a cache line (the kernels' loads never straddle one needlessly)
HUGE = 2 << 20      # the huge page size the mapping is rounded to
_MADV_POPULATE_READ = 22   # Linux's value (Python 3.11's mmap module does not name it)


def hugepages_wanted() -> bool:
    return envs.HITENTER_HUGEPAGES.get() and hasattr(mmap, "MADV_HUGEPAGE")


class WeightArena:
    """Room for tensors of `sizes` bytes (anonymous memory, untouched until written); `place(t)` copies a
    uint8 tensor into the next free, 64-byte aligned slot and returns the view."""

    def __init__(self, sizes: list[int]) -> None:
        nbytes = sum((n + ALIGN - 1) // ALIGN * ALIGN for n in sizes)
        self.size = max(HUGE, (nbytes + HUGE - 1) // HUGE * HUGE)
        self._map = mmap.mmap(-1, self.size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        self.huge = False
        if hugepages_wanted():
            try:
                self._map.madvise(mmap.MADV_HUGEPAGE)   # before the first write: faults then take 2 MB pages
                self.huge = True
            except OSError:
                pass
        self.storage = torch.from_numpy(np.frombuffer(self._map, dtype=np.uint8))
        self.used = 0
        self.read_only = False

    def take(self, nbytes: int) -> torch.Tensor:
        """The next free, 64-byte aligned slot of `nbytes` (uint8, 1-D, contents undefined)."""
        start = (self.used + ALIGN - 1) // ALIGN * ALIGN
        end = start + nbytes
        if end > self.size:
            raise MemoryError(f"WeightArena: {end} bytes needed, {self.size} reserved")
        self.used = end
        return self.storage[start:end]

    def place(self, t: torch.Tensor) -> torch.Tensor:
        """A copy of `t` (uint8, any shape) inside the arena, contiguous."""
        if self.read_only:
            raise ValueError("WeightArena.place: a mapped arena is read-only")
        view = self.take(t.numel()).view(t.shape)
        view.copy_(t)
        return view

    def owns(self, t: torch.Tensor) -> bool:
        return t.untyped_storage().data_ptr() == self.storage.untyped_storage().data_ptr()

    @classmethod
    def mapped(cls, fileno: int, offset: int, nbytes: int) -> WeightArena:
        """An arena over `nbytes` of an open file from `offset` (a multiple of HUGE), mapped shared and
        read-only, its page-table entries filled now from the page cache: nothing is copied, every process
        mapping the file shares its pages, and a file written in large pieces is mapped with 2 MB pages
        where the OS has them. `take` returns views in the order the arena was filled; `place` is refused."""
        if offset % HUGE:
            raise ValueError(f"WeightArena.mapped: offset {offset} is not a multiple of {HUGE}")
        self = cls.__new__(cls)
        self.size = nbytes
        self._map = mmap.mmap(fileno, nbytes, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ, offset=offset)
        self.huge = False
        if hugepages_wanted():
            try:   # before the pages are read in: what readahead brings in then comes as 2 MB folios
                self._map.madvise(mmap.MADV_HUGEPAGE)
                self.huge = True
            except OSError:
                pass
        try:   # the page-table entries now, not a fault per page in the first steps
            self._map.madvise(getattr(mmap, "MADV_POPULATE_READ", _MADV_POPULATE_READ))
        except OSError:   # before Linux 5.14: faulted in as the kernels read
            pass
        with warnings.catch_warnings():   # a read-only buffer viewed by torch: the weights are never written
            warnings.simplefilter("ignore", UserWarning)
            self.storage = torch.from_numpy(np.frombuffer(self._map, dtype=np.uint8))
        self.used = 0
        self.read_only = True
        return self

    def filled(self) -> memoryview:
        """The bytes taken so far (from the arena's start), for writing the arena to a file."""
        return memoryview(self._map)[:self.used]

    def rewind(self) -> None:
        """Take from the start again: the same sizes taken in the same order give the same views."""
        self.used = 0


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def drop_mapped_pages(address: int, nbytes: int) -> None:
    """Drop this process's mappings of the whole pages in [address, address + nbytes), part of a
    read-only file map whose bytes were copied elsewhere: they leave the RSS (the page cache keeps them;
    a later read faults them back in). A no-op where madvise is unavailable."""
    page = mmap.PAGESIZE
    start, end = (address + page - 1) // page * page, (address + nbytes) // page * page
    if end <= start or not hasattr(mmap, "MADV_DONTNEED"):
        return
    try:
        _libc().madvise(ctypes.c_void_p(start), ctypes.c_size_t(end - start), mmap.MADV_DONTNEED)
    except (OSError, AttributeError):
        pass


# mallopt parameters (glibc malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
STEP_HEAP_BYTES = 32 << 20     # glibc's largest heap-served request (DEFAULT_MMAP_THRESHOLD_MAX on 64-bit)
KEEP_HEAP_BYTES = 1 << 30


def keep_heap() -> bool:
    """Stop glibc from handing a step's buffers back to the OS only to fault them in again next step.

    A batch step allocates a few MB a tensor (logits and the sampler's temporaries: 16 rows of a 49k
    vocabulary are 3 MB each). glibc serves such sizes with a fresh mmap, or trims the heap's free top
    after each free, so every step would page-fault and zero them again (a large share of a batched
    step's sampling time). Requests up to ``STEP_HEAP_BYTES`` come from the heap instead and the heap's free
    top is kept up to ``KEEP_HEAP_BYTES``; :func:`trim_heap` still returns it, and the serving loop
    calls it whenever the engine goes idle, so memory comes back after large requests. Returns whether
    glibc took both settings (False elsewhere)."""
    try:
        libc = _libc()
        return bool(libc.mallopt(_M_MMAP_THRESHOLD, STEP_HEAP_BYTES)) and \
            bool(libc.mallopt(_M_TRIM_THRESHOLD, KEEP_HEAP_BYTES))
    except (OSError, AttributeError):
        return False


def trim_heap() -> None:
    """Hand freed heap memory back to the OS: glibc keeps a load's freed temporaries (fused weight copies,
    the tokenizer's build) mapped otherwise, tens of MB of RSS for a 1.5B model. No-op off glibc."""
    try:
        _libc().malloc_trim(0)
    except (OSError, AttributeError):
        pass
