"""The chunk cache's size bound: least recently used chunks go first (pure file system)."""

from __future__ import annotations

import os
import time

from dsec.images.remote import ChunkCache

A, B = "sha256:" + "a" * 64, "sha256:" + "b" * 64


def _age(cache, digest, index, seconds_ago):
    t = time.time() - seconds_ago
    os.utime(cache.path(digest, index), (t, t))


def test_unbounded_cache_keeps_everything(tmp_path):
    cache = ChunkCache(tmp_path)
    for i in range(10):
        cache.put(A, i, b"x" * 1000)
    assert cache.chunk_bytes() == 10_000


def test_puts_past_the_bound_evict_the_least_recently_used(tmp_path):
    cache = ChunkCache(tmp_path, max_bytes=5000)
    for i in range(4):
        cache.put(A, i, b"x" * 1000)
        _age(cache, A, i, 100 - i)           # chunk 0 oldest
    assert cache.get(A, 0) == b"x" * 1000    # a hit makes chunk 0 the most recent
    cache.put(B, 0, b"y" * 1000)
    cache.put(B, 1, b"y" * 1000)             # 6000 > 5000: evict down to 4500
    assert cache.chunk_bytes() <= 4500
    assert cache.get(A, 1) is None and cache.get(A, 2) is None   # the oldest went
    assert cache.get(A, 0) is not None and cache.get(B, 1) is not None


def test_tables_and_metadata_are_never_evicted(tmp_path):
    cache = ChunkCache(tmp_path, max_bytes=2000)
    cache.put_table(A, b"t" * 32)
    cache.write_atomic(tmp_path / ("a" * 64) / "meta.json", b"{}")
    for i in range(5):
        cache.put(A, i, b"x" * 1000)
    assert cache.table(A) == b"t" * 32 and (tmp_path / ("a" * 64) / "meta.json").exists()
    assert cache.chunk_bytes() <= 2000


def test_bound_holds_across_processes_sharing_the_cache(tmp_path):
    first = ChunkCache(tmp_path, max_bytes=3000)
    for i in range(3):
        first.put(A, i, b"x" * 1000)
    second = ChunkCache(tmp_path, max_bytes=3000)   # counts what is already there
    second.put(B, 0, b"y" * 1000)
    assert second.chunk_bytes() <= 3000
