#!/bin/sh
# Builds the microvm/vm guest artefacts (kernel, initramfs with busybox, modules and the
# dsec-agent) into build/guest, or the directory given; a second run is a no-op.
# Needs: qemu-system-x86 linux-image-amd64 busybox-static gcc (extlinux for the vm backend).
set -e
cd "$(dirname "$0")/../.."
PY=${PYTHON:-.venv/bin/python}
exec "$PY" -m dsec.node.backends.microvm.guest --out "${1:-build/guest}"
