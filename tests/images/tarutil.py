"""Build tar archives entry by entry for the import tests."""

from __future__ import annotations

import gzip
import io
import tarfile


def entry(name, data=b"", type=tarfile.REGTYPE, mode=0o644, linkname="", uid=0, gid=0,
          devmajor=0, devminor=0, size=None):
    ti = tarfile.TarInfo(name)
    ti.type, ti.mode, ti.linkname, ti.uid, ti.gid = type, mode, linkname, uid, gid
    ti.devmajor, ti.devminor = devmajor, devminor
    ti.size = len(data) if size is None else size
    ti.mtime = 1_700_000_000
    return ti, data


def make_tar(entries, compress=False) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for ti, data in entries:
            tar.addfile(ti, io.BytesIO(data) if ti.isreg() else None)
    raw = buf.getvalue()
    return gzip.compress(raw, mtime=0) if compress else raw


def d(name, mode=0o755):
    return entry(name, type=tarfile.DIRTYPE, mode=mode)
