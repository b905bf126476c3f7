"""The built-in ``busybox`` image: a static busybox, its applet links and a minimal /etc."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess

from dsec.api.errors import Internal
from dsec.images.models import ImageConfig

__all__ = ["build_busybox_rootfs", "BUSYBOX_CONFIG"]

BUSYBOX_CONFIG = ImageConfig(
    env={"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
         "HOME": "/root"},
    cwd="/", user="root", entrypoint=["/bin/sh"],
    labels={"org.dsec.image": "busybox"},
)

_PASSWD = ("root:x:0:0:root:/root:/bin/sh\n"
           "nobody:x:65534:65534:nobody:/nonexistent:/bin/false\n")
_GROUP = "root:x:0:\nnobody:x:65534:\n"


def _busybox_binary() -> pathlib.Path:
    path = shutil.which("busybox")
    if path is None:
        raise Internal("busybox not found on PATH; install busybox-static")
    return pathlib.Path(path)


def build_busybox_rootfs(root: pathlib.Path) -> None:
    """Fill the empty directory ``root`` with the busybox image's files."""
    binary = _busybox_binary()
    for d in ("bin", "sbin", "usr/bin", "usr/sbin", "usr/local/bin", "etc", "root", "home",
              "proc", "sys", "dev", "var/tmp", "run"):
        (root / d).mkdir(parents=True, exist_ok=True)
    shutil.copyfile(binary, root / "bin/busybox")
    os.chmod(root / "bin/busybox", 0o755)
    applets = subprocess.run([str(binary), "--list-full"], capture_output=True, text=True,
                             check=True).stdout.split()
    for rel in applets:
        link = root / rel
        if rel == "bin/busybox" or link.exists() or link.is_symlink():
            continue
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to("/bin/busybox")
    (root / "etc/passwd").write_text(_PASSWD)
    (root / "etc/group").write_text(_GROUP)
    (root / "etc/hostname").write_text("sandbox\n")
    (root / "etc/resolv.conf").write_text("")
    (root / "tmp").mkdir()
    os.chmod(root / "tmp", 0o1777)
    os.chmod(root / "var/tmp", 0o1777)
    os.chmod(root / "root", 0o700)
