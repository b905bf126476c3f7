"""The ``/init`` script of the microvm initramfs (busybox sh, PID 1 until switch_root).

Kernel command line words it reads (all set by the launcher):
  dsec.bare=1        print a marker and power off (the baseline boot of the benchmark)
  dsec.layers=N      N read-only EROFS disks with serials dsec-l0 (bottom) .. dsec-l<N-1>
  dsec.host=NAME     the guest's hostname
  dsec.root=disk     (vm backend) boot the disk with serial dsec-boot, partition 1, with
                     its own /sbin/init instead of composing layers
The writable disk has serial ``dsec-rw``; on a blank disk the script formats it (ext2 via
busybox, driven by the ext4 module). Any failure powers the guest off, which the launcher
turns into a paused QEMU the node reports as a failed sandbox.
"""

INIT_SCRIPT = r"""#!/bin/sh
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
cmdline=$(cat /proc/cmdline)
arg() { for w in $cmdline; do case "$w" in "$1="*) echo "${w#*=}";; esac; done; }
fail() { echo "dsec-init: FAILED: $*"; sync; poweroff -f; sleep 5; }
if [ -n "$(arg dsec.bare)" ]; then echo dsec-bare-boot-ok; poweroff -f; fi
for m in $(cat /etc/dsec-modules); do insmod /lib/modules/$m.ko 2>/dev/null; done
disk() {  # block device whose virtio serial is $1
  for d in /sys/block/vd*; do
    [ "$(cat $d/serial 2>/dev/null)" = "$1" ] && { echo /dev/${d##*/}; return 0; }
  done
  return 1
}
if [ "$(arg dsec.root)" = disk ]; then
  i=0; while [ $i -lt 50 ] && ! disk dsec-boot >/dev/null; do sleep 0.1; i=$((i+1)); done
  dev=$(disk dsec-boot) || fail "no boot disk"
  mount -t ext4 ${dev}1 /newroot || fail "mount ${dev}1"
  mount --move /dev /newroot/dev; mount --move /proc /newroot/proc; mount --move /sys /newroot/sys
  exec switch_root /newroot /sbin/init
fi
n=$(arg dsec.layers); n=${n:-0}
i=0; while [ $i -lt 50 ] && ! disk dsec-rw >/dev/null; do sleep 0.1; i=$((i+1)); done
rw=$(disk dsec-rw) || fail "no writable disk"
mkdir -p /rw
if ! mount -t ext4 $rw /rw 2>/dev/null; then
  mke2fs -q -m 0 $rw >/dev/null || fail "mke2fs $rw"
  mount -t ext4 $rw /rw || fail "mount $rw"
fi
mkdir -p /rw/upper /rw/work
lower=""
i=0
while [ $i -lt $n ]; do
  dev=$(disk dsec-l$i) || fail "no layer disk dsec-l$i"
  mkdir -p /layers/$i
  mount -t erofs -o ro $dev /layers/$i || fail "mount layer $i ($dev)"
  lower="/layers/$i${lower:+:$lower}"
  i=$((i+1))
done
[ -n "$lower" ] || { mkdir -p /layers/empty; lower=/layers/empty; }
mkdir -p /newroot
# redirect_dir and metacopy off (the kernel's defaults, said out loud): a packed upper dir
# must hold whole files and plain whiteouts.
mount -t overlay overlay \
  -o "lowerdir=$lower,upperdir=/rw/upper,workdir=/rw/work,redirect_dir=off,metacopy=off" \
  /newroot || fail "overlay mount"
for d in proc sys dev tmp .dsec; do mkdir -p /newroot/$d; done
mount -t tmpfs -o size=8m,mode=0755 dsec /newroot/.dsec
cp /bin/dsec-agent /newroot/.dsec/agent && cp /bin/busybox /newroot/.dsec/busybox \
  && cp /bin/dsec-opaque /newroot/.dsec/opaque \
  && cp /etc/dsec-seccomp.bpf /newroot/.dsec/seccomp.bpf || fail "copy agent"
# The writable disk stays reachable: pack_diff reads the upper dir there, via the agent.
mkdir -p /newroot/.dsec/rw && mount --move /rw /newroot/.dsec/rw
mount -o remount,ro /newroot/.dsec
mount --move /dev /newroot/dev
mount --move /proc /newroot/proc
mount --move /sys /newroot/sys
mkdir -p /newroot/dev/pts /newroot/dev/shm
mount -t devpts -o newinstance,ptmxmode=0666 devpts /newroot/dev/pts
mount -t tmpfs tmpfs /newroot/dev/shm
h=$(arg dsec.host); hostname "${h:-dsec}"
ip link set lo up
ip addr add 10.0.2.15/24 dev eth0 && ip link set eth0 up || fail "network"
ip route add default via 10.0.2.2
agent_port() {  # the virtio-serial port named dsec.agent (ports appear asynchronously)
  for p in /newroot/sys/class/virtio-ports/*; do
    [ "$(cat $p/name 2>/dev/null)" = dsec.agent ] && { echo /dev/${p##*/}; return 0; }
  done
  return 1
}
i=0; while [ $i -lt 50 ] && ! agent_port >/dev/null; do sleep 0.1; i=$((i+1)); done
port=$(agent_port) || fail "no agent port (virtio-serial dsec.agent)"
echo "dsec-init: agent on $port"
exec switch_root /newroot /.dsec/agent --confine /.dsec/seccomp.bpf serve-serial $port
"""
