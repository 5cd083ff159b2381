"""The page cache of the benches' files: how much of them is resident, measured by mincore
independently of ferry, and their pages written back and dropped (cold) or read in (hot). Used by
checkpoint_bench, distributed_bench, host_map_bench and torch_save_bench."""

from __future__ import annotations

import ctypes
import os
from typing import List

MIB = 1 << 20


def _libc():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    return libc


def resident_fraction(paths: List[str]) -> float:
    """Fraction of the files' pages in the page cache (mincore over a shared mapping)."""
    libc, page = _libc(), os.sysconf("SC_PAGE_SIZE")
    resident = total = 0
    for p in paths:
        size = os.path.getsize(p)
        if size == 0:
            continue
        fd = os.open(p, os.O_RDONLY)
        try:
            addr = libc.mmap(None, size, 1, 1, fd, 0)  # PROT_READ, MAP_SHARED
            if addr in (None, ctypes.c_void_p(-1).value):
                return -1.0
            pages = (size + page - 1) // page
            vec = (ctypes.c_ubyte * pages)()
            ok = libc.mincore(addr, size, vec) == 0
            libc.munmap(addr, size)
            if not ok:
                return -1.0
            resident += sum(1 for v in bytes(vec) if v & 1)
            total += pages
        finally:
            os.close(fd)
    return resident / total if total else 1.0


def drop_pages(paths: List[str]) -> float:
    """Writes back and drops every file's pages; returns the fraction still resident."""
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return resident_fraction(paths)


def warm_pages(paths: List[str]) -> float:
    buf = bytearray(64 * MIB)
    for p in paths:
        with open(p, "rb", buffering=0) as f:
            while f.readinto(buf):
                pass
    return resident_fraction(paths)
