"""This machine's memory bandwidth: the ceiling of a batch-1 decode step, which streams every weight once.

    .venv/bin/python bench/memory_bandwidth.py [--mb 2048] [--threads 1 2] [--reps 5] [--sizes-mb 16 256]

Compiles bench/memory_bandwidth.c with the project's native build helper (hitenter/kernels/build.py:
-O3 -march=native -fopenmp, cached), then for each thread count reads a buffer of --mb MB with the
widest vector loads the CPU has (AVX-512 where present), each thread its contiguous share:

- pages: 4 KB pages (``MADV_NOHUGEPAGE``) or 2 MB transparent huge pages (``MADV_HUGEPAGE``; the
  line says how much of the buffer the kernel actually backed with them, from /proc/self/smaps);
- software prefetch off, or 512 B / 1 KB / 2 KB / 4 KB ahead of each cache line;
- ``copy``: read one buffer and write another of the same size (an in-place recurrent-state update
  reads and writes each byte: count both directions);
- ``--keep-mb``: a stream of --stream-mb (a decode step's bytes) read again and again, its first K MB with
  plain loads and the rest behind non-temporal prefetches (which do not leave lines in L2 / L3): whether a
  last-level cache smaller than the stream can keep part of it from one pass to the next.

Each figure is the fastest of --reps passes, GB/s = 1e9 bytes/s (bytes moved: read, or read + written).
--sizes-mb adds the 2-thread read of smaller buffers (what stays in the caches: a hybrid model's
recurrent states are tens of MB). Others share this machine: the load average is printed beside.
"""

from __future__ import annotations

import argparse
import ctypes
import mmap
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import emit_json  # noqa: E402

from hitenter.kernels.build import build_library  # noqa: E402

SOURCE = Path(__file__).resolve().parent / "memory_bandwidth.c"
PREFETCHES = (0, 512, 1024, 2048, 4096)


def load() -> ctypes.CDLL:
    lib = ctypes.CDLL(str(build_library("memory_bandwidth", SOURCE, [])))
    lib.bw_read.restype = ctypes.c_double
    lib.bw_read.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_int64, ctypes.c_int,
                            ctypes.POINTER(ctypes.c_int64)]
    lib.bw_copy_rw.restype = ctypes.c_double
    lib.bw_copy_rw.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_int]
    lib.bw_vector_bytes.restype = ctypes.c_int
    lib.bw_read_keep.restype = ctypes.c_double
    lib.bw_read_keep.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int,
                                 ctypes.c_int, ctypes.POINTER(ctypes.c_int64)]
    return lib


class Buffer:
    """An anonymous mapping of `nbytes`, advised to 2 MB pages or away from them, every page written."""

    def __init__(self, nbytes: int, huge: bool) -> None:
        self.map = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        self.map.madvise(mmap.MADV_HUGEPAGE if huge else mmap.MADV_NOHUGEPAGE)
        chunk = bytes(range(256)) * 4096                   # 1 MB of non-zero bytes
        for off in range(0, nbytes, len(chunk)):           # touch (and fill) every page
            n = min(len(chunk), nbytes - off)
            self.map[off:off + n] = chunk[:n]
        self.address = ctypes.addressof(ctypes.c_char.from_buffer(self.map))
        self.nbytes = nbytes

    def huge_bytes(self) -> int:
        """How much of this mapping the kernel backs with huge pages (AnonHugePages in /proc/self/smaps)."""
        lines = Path("/proc/self/smaps").read_text().splitlines()
        for i, line in enumerate(lines):
            if line.split("-")[0].strip().lower() == f"{self.address:x}":
                for row in lines[i + 1:]:
                    if row.startswith("AnonHugePages:"):
                        return int(row.split()[1]) << 10
        return 0

    def close(self) -> None:
        self.map.close()


def read_gbs(lib: ctypes.CDLL, buf: Buffer, nbytes: int, threads: int, prefetch: int, reps: int) -> float:
    sink = ctypes.c_int64()
    sec = lib.bw_read(buf.address, nbytes, threads, prefetch, reps, ctypes.byref(sink))
    return nbytes / sec / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=2048, help="buffer size (MB, 2^20 bytes)")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--sizes-mb", type=int, nargs="*", default=[8, 32, 128, 256, 512, 768, 1024])
    ap.add_argument("--stream-mb", type=int, default=960, help="the stream of the --keep-mb test (MB)")
    ap.add_argument("--keep-mb", type=int, nargs="*", default=[0, 128, 256, 384, 960])
    ap.add_argument("--skip-main", action="store_true", help="only the smaller buffers and the keep test")
    a = ap.parse_args()
    lib = load()
    nbytes = a.mb << 20
    print(f"load average {os.getloadavg()[0]:.2f}; {lib.bw_vector_bytes() * 8}-bit loads; buffer {a.mb} MB; "
          f"best of {a.reps}")
    results = []
    for huge in () if a.skip_main else (False, True):
        buf = Buffer(nbytes, huge)
        dst = Buffer(nbytes, huge)
        pages = f"2MB ({buf.huge_bytes() * 100 // nbytes}% huge)" if huge else "4KB"
        for threads in a.threads:
            row = {"pages": "2MB" if huge else "4KB", "threads": threads}
            for pf in PREFETCHES:
                row[f"read_pf{pf}"] = read_gbs(lib, buf, nbytes, threads, pf, a.reps)
            row["copy_rw"] = 2 * nbytes / lib.bw_copy_rw(buf.address, dst.address, nbytes, threads, a.reps) / 1e9
            results.append(row)
            reads = "  ".join(f"pf{pf}: {row[f'read_pf{pf}']:.1f}" for pf in PREFETCHES)
            print(f"{pages:>18} {threads} thr  read GB/s  {reads}   copy (r+w) {row['copy_rw']:.1f}")
        buf.close()
        dst.close()
    sizes = {}
    if a.sizes_mb:
        buf = Buffer(max(a.sizes_mb) << 20, True)
        for mb in a.sizes_mb:
            sizes[mb] = read_gbs(lib, buf, mb << 20, max(a.threads), 0, a.reps * 4)
        buf.close()
        print(f"{max(a.threads)} thr read, smaller buffers (2MB pages, no prefetch): " +
              "  ".join(f"{mb} MB: {g:.1f}" for mb, g in sizes.items()) + " GB/s")
    keeps = {}
    if a.keep_mb:
        n = a.stream_mb << 20
        buf = Buffer(n, True)
        sink = ctypes.c_int64()
        for keep in a.keep_mb:
            k = min(keep, a.stream_mb) << 20
            sec = lib.bw_read_keep(buf.address, n, k, 1024, max(a.threads), a.reps, ctypes.byref(sink))
            keeps[keep] = n / sec / 1e9
        buf.close()
        print(f"{max(a.threads)} thr read of a {a.stream_mb} MB stream, its first K MB plain and the rest with NTA "
              "prefetches (K = stream: all plain): " + "  ".join(f"K {k}: {g:.1f}" for k, g in keeps.items()) + " GB/s")
    print(f"load average after {os.getloadavg()[0]:.2f}")
    emit_json("memory_bandwidth", {"mb": a.mb, "rows": results, "sizes_gbs": sizes, "keep_gbs": keeps,
                                   "load": os.getloadavg()[0]})


if __name__ == "__main__":
    main()
