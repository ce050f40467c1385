#!/bin/busybox sh
# Stage one of a lab VM (switchml_xdp/lab/vm_boot.py puts this in the initramfs
# as /init, next to a static busybox and the modules listed in /modules/order).
# Loads what mounting the host's root needs, mounts it read-only over 9p with
# writable /tmp, /run and /var/tmp, mounts the run's shared directory at
# /run/swml-vm and hands PID 1 to stage two (swml.guest=, a script on the host's
# root). Kernel command line: swml.probe=1 (print a token and power off: the
# KVM probe), swml.guest=PATH, swml.share=TAG:PATH,... (host directories that
# the tmpfs would hide, shared again). Any failure powers the VM off, saying why.
# shellcheck shell=sh
/bin/busybox --install -s /bin
export PATH=/bin

fail() { echo "swml-vm init: $*"; poweroff -f; }
arg() { sed -n "s/.*swml\.$1=\([^ ]*\).*/\1/p" /proc/cmdline; }

mkdir -p /proc /sys /dev /newroot
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev

if [ -n "$(arg probe)" ]; then
  echo swml-probe-ok
  poweroff -f
fi

while read -r m; do
  insmod "/modules/$m" || fail "insmod $m"
done < /modules/order

# cache=loose: the root does not change under a short-lived lab VM, and every
# python import and shared library costs 9p round trips without a cache.
mount -t 9p -o trans=virtio,version=9p2000.L,ro,cache=loose,msize=262144 hostroot /newroot \
  || fail "cannot mount the host's root (9p tag hostroot)"
for d in tmp run var/tmp; do
  mount -t tmpfs -o mode=1777 tmpfs "/newroot/$d" || fail "tmpfs on /$d"
done
# Host directories under those tmpfs that the guest needs (a checkout in
# /tmp): swml.share=TAG:PATH,... (vm.py's hidden_host_paths), read-only.
for share in $(arg share | tr ',' ' '); do
  tag=${share%%:*}
  path=${share#*:}
  mkdir -p "/newroot$path" || fail "mkdir $path"
  mount -t 9p -o trans=virtio,version=9p2000.L,ro,cache=loose,msize=262144 "$tag" "/newroot$path" \
    || fail "cannot mount $path (9p tag $tag)"
done
mkdir -p /newroot/run/swml-vm
# No cache: the host writes files here (go, stop) that the guest polls for.
mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 swmlrun /newroot/run/swml-vm \
  || fail "cannot mount the run directory (9p tag swmlrun)"
guest=$(arg guest)
for d in dev proc sys; do
  mount --move "/$d" "/newroot/$d" || fail "move /$d"
done
[ -f "/newroot${guest:-/nonexistent}" ] || fail "no stage two: swml.guest=$guest"
exec switch_root /newroot /bin/bash "$guest"
