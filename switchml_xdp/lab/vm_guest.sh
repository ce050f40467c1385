#!/bin/bash
# Stage two of a lab VM, PID 1 on the host's root (read-only; /tmp, /run writable).
# switchml_xdp/lab/vm.py starts it through vm_init.sh and talks to it through the
# run directory, shared at /run/swml-vm:
#   in:  <vm>.env (this VM's settings, shell words), go (workers may start),
#        stop (the switch may stop)
#   out: <vm>.log (all output), <vm>.booted (uptime on arrival here),
#        switch: sw.ready (the daemon's ready line), sw.xdp (ip -d link of its NIC),
#                sw.status.json; worker: <vm>.json (swml-worker bench --json);
#        <vm>.rc (exit status, written last, then the VM powers off)
# The NIC is set up by packaging/tune-nic.sh, the same script the Vagrant lab runs.
set -uo pipefail
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/tmp PYTHONDONTWRITEBYTECODE=1 TERM=dumb
share=/run/swml-vm
vm=$(sed -n 's/.*swml\.vm=\([^ ]*\).*/\1/p' /proc/cmdline)
export SWML_ENV_FILE=$share/$vm.env
set -a   # SWML_TOKEN and the rest reach the commands below
# shellcheck source=/dev/null
. "$SWML_ENV_FILE"
set +a
exec >>"$share/$vm.log" 2>&1
# Write stdin to <vm>.$1 in one rename: the host never reads half a file.
publish() { cat >"$share/.$vm.$1.tmp" && mv "$share/.$vm.$1.tmp" "$share/$vm.$1"; }
cut -d' ' -f1 /proc/uptime | publish booted

say() { printf '%s %s: %s\n' "$(cut -d' ' -f1 /proc/uptime)" "$vm" "$*"; }
finish() {
  say "done (status $1)"
  echo "$1" | publish rc
  sync
  echo o >/proc/sysrq-trigger   # power off: qemu exits
  sleep 60
}
# Wait up to SWML_WAIT_S for file $1 in the run directory; give up with status 3.
wait_for() {
  local deadline=$((SECONDS + SWML_WAIT_S))
  until [ -e "$share/$1" ]; do
    [ $SECONDS -lt $deadline ] || { say "no $1 after ${SWML_WAIT_S} s"; finish 3; }
    sleep 0.5
  done
}

say "stage two: role $SWML_ROLE, kernel $(uname -r), $(nproc) vCPUs"
mount -t bpf bpf /sys/fs/bpf
# devtmpfs has no /dev/fd (udev makes it): bash's <(...), which tune-nic.sh uses, needs it.
ln -sfn /proc/self/fd /dev/fd
mount -t tracefs tracefs /sys/kernel/tracing 2>/dev/null
mount -t debugfs debugfs /sys/kernel/debug 2>/dev/null
ip link set lo up
hostname "$vm"
modprobe virtio_net || finish 2
for _ in $(seq 50); do [ -e "/sys/class/net/$SWML_IFACE" ] && break; sleep 0.1; done
bash "$SWML_TUNE_NIC" || finish 2
ip addr add "$SWML_IP/$SWML_PREFIXLEN" dev "$SWML_IFACE" || finish 2

# A box with SWML_BOX_PORTS ports: the NIC and veths swp1.. (their peers
# have no traffic), members of bridge swbox, which takes the NIC's address.
box_ports() {
  local ports=$SWML_IFACE j
  [ "${SWML_BOX_PORTS:-1}" -gt 1 ] || { echo "$ports"; return; }
  ip link add swbox type bridge || finish 2
  ip link set swbox address "$(cat "/sys/class/net/$SWML_IFACE/address")"
  ip addr del "$SWML_IP/$SWML_PREFIXLEN" dev "$SWML_IFACE"
  ip link set "$SWML_IFACE" master swbox
  for j in $(seq 1 $((SWML_BOX_PORTS - 1))); do
    ip link add "swp$j" type veth peer name "swp${j}b" || finish 2
    ip link set "swp$j" master swbox up
    ip link set "swp${j}b" up
    ports="$ports swp$j"
  done
  ip addr add "$SWML_IP/$SWML_PREFIXLEN" dev swbox
  ip link set swbox up
  echo "$ports"
}

# A rack box (SWML_TREE=1, docs/scale-out.md): its parent box runs in
# namespace swcore of this VM, behind veth uplink0 (10.98.0.2) - core0
# (10.98.0.1), natively in XDP on both ends, at the network's MTU; the
# parent takes the rack box's k (-k in SWML_SWITCH_ARGS); prints the rack
# box's options.
switch_k() {
  # shellcheck disable=SC2086  # SWML_SWITCH_ARGS: words on purpose
  set -- $SWML_SWITCH_ARGS
  while [ $# -gt 1 ]; do
    case $1 in -k|--elements) echo "-k $2"; return ;; esac
    shift
  done
}

tree_parent() {
  local out=$share/$vm.parent.out
  ip netns add swcore || finish 2
  ip link add uplink0 mtu "$SWML_MTU" type veth peer name core0 mtu "$SWML_MTU" || finish 2
  ip link set core0 netns swcore || finish 2
  ip addr add 10.98.0.2/24 dev uplink0
  ip link set uplink0 up
  ip netns exec swcore ip addr add 10.98.0.1/24 dev core0
  ip netns exec swcore ip link set core0 up
  ip netns exec swcore ip link set lo up
  # shellcheck disable=SC2046 # switch_k's words are two arguments
  ip netns exec swcore "$SWML_PYTHON" -m switchml_xdp.cli.switch up core0 --mode native \
    $(switch_k) >"$out" 2>&1 &
  local deadline=$((SECONDS + SWML_WAIT_S))
  until grep -q ' up on ' "$out"; do
    [ $SECONDS -lt $deadline ] || { say "parent not up after ${SWML_WAIT_S} s:"; cat "$out" >&2; finish 1; }
    sleep 0.5
  done
  echo "--uplink uplink0 --parent 10.98.0.1"
}

run_switch() {
  local out=$share/$vm.switch.out pid ports tree=""
  ports=$(box_ports)
  [ "${SWML_TREE:-0}" = 1 ] && tree=$(tree_parent)
  # --mode native: no silent fallback to generic XDP; this lab is about virtio's native path.
  # shellcheck disable=SC2086  # SWML_SWITCH_ARGS, ports: words on purpose
  "$SWML_PYTHON" -m switchml_xdp.cli.switch up $ports --mode native $SWML_SWITCH_ARGS $tree \
    >"$out" 2>&1 &
  pid=$!
  local deadline=$((SECONDS + SWML_WAIT_S))
  until grep -q ' up on ' "$out"; do
    kill -0 $pid 2>/dev/null || { say "swml-switch up exited:"; cat "$out"; finish 1; }
    [ $SECONDS -lt $deadline ] || { say "swml-switch not up after ${SWML_WAIT_S} s"; finish 1; }
    sleep 0.5
  done
  ip -d link show dev "$SWML_IFACE" | publish xdp
  grep ' up on ' "$out" | publish ready
  say "$(cat "$share/$vm.ready")"
  wait_for stop
  "$SWML_PYTHON" -m switchml_xdp.cli.switch status "$SWML_IFACE" --json | publish status.json
  kill -TERM $pid
  wait $pid
  finish $?
}

run_worker() {
  wait_for go
  say "bench: rank $SWML_RANK of $SWML_WORLD"
  # shellcheck disable=SC2086  # SWML_BENCH_ARGS: words on purpose
  "$SWML_PYTHON" -m switchml_xdp.cli.worker bench --switch "$SWML_SWITCH_IP" --job vm \
    --rank "$SWML_RANK" --world "$SWML_WORLD" --backend afxdp --json --quiet \
    --join-timeout "$SWML_WAIT_S" $SWML_BENCH_ARGS | publish json
  finish "${PIPESTATUS[0]}"
}

case $SWML_ROLE in
  switch) run_switch ;;
  worker) run_worker ;;
  *) say "unknown role $SWML_ROLE"; finish 2 ;;
esac
