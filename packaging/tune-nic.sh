#!/usr/bin/env bash
# Ready a NIC for switchml-xdp, on the switch or on a worker; run by
# packaging/swml-nic.service at every boot (ethtool settings do not survive one),
# installed as /usr/local/sbin/swml-tune-nic (docs/real-network.md; the vagrant lab
# and `swml-lab vm` run it too). Reads SWML_IFACE, SWML_MTU and SWML_ROLE (switch or
# worker) from $SWML_ENV_FILE, /etc/swml/nic.env by default. Idempotent: it only
# touches what differs. Best effort: a setting the NIC does not support is reported,
# not fatal (the switch then falls back to generic XDP, which works anywhere).
#
# - MTU: SWML_MTU. Native XDP on virtio_net needs MTU <= 3506 (one page a frame), and
#   drops received frames over 3508 bytes: 3494 carries every frame (k <= 858).
# - Queue pairs (virtio_net): native XDP_TX/REDIRECT want one spare TX queue per CPU
#   on top of the pairs in use, else the driver falls back to a slower shared,
#   locked TX queue. Switch: as many pairs as vCPUs in use if the NIC has twice
#   that (the Vagrantfile offers 2 x vCPUs). Worker: one pair, because the AF_XDP
#   engine binds rx queue 0 and results arriving on another queue would miss it.
# - Offloads: LRO / hardware GRO (rx-gro-hw) off: virtio_net refuses native XDP
#   while the host may coalesce frames towards the guest. Software GRO off too.
# - Workers: allmulticast on, so the switch's result group reaches XDP whatever
#   multicast filter the NIC (or the hypervisor's model of it) keeps.
set -euo pipefail

# shellcheck source=/dev/null
. "${SWML_ENV_FILE:-/etc/swml/nic.env}"
iface=$SWML_IFACE
say() { printf 'swml-nic: %s: %s\n' "$iface" "$*"; }

[ -e "/sys/class/net/$iface" ] || { say "no such interface" >&2; exit 1; }
ip link set dev "$iface" up

# --- MTU -------------------------------------------------------------------
cur=$(cat "/sys/class/net/$iface/mtu")
if [ "$cur" != "$SWML_MTU" ]; then
  if ip link set dev "$iface" mtu "$SWML_MTU"; then say "mtu $cur -> $SWML_MTU"; else say "cannot set mtu $SWML_MTU (stays $cur)"; fi
fi
[ "$SWML_MTU" -le 3506 ] || say "mtu $SWML_MTU > 3506: virtio_net allows generic XDP only"

# --- queue pairs -----------------------------------------------------------
cpus=$(nproc)
# ethtool -l: the first "Combined:" is the maximum, the second the current count.
read -r max now < <(ethtool -l "$iface" 2>/dev/null | awk '/^Combined:/ { v[n++] = $2 } END { print v[0], v[1] }') || true
if [[ ${max:-} =~ ^[0-9]+$ && ${now:-} =~ ^[0-9]+$ ]]; then
  if [ "$SWML_ROLE" = worker ]; then
    want=1
  elif [ "$max" -ge $((2 * cpus)) ]; then
    want=$cpus
  elif [ "$max" -gt "$cpus" ]; then
    want=$((max - cpus))
  else
    want=$max
    say "only $max queue pair(s) for $cpus vCPUs: native XDP_TX will use a shared, locked queue (libvirt: driver queues >= $((2 * cpus)))"
  fi
  if [ "$now" != "$want" ]; then
    if ethtool -L "$iface" combined "$want"; then say "queue pairs $now -> $want (of $max)"; now=$want
    else say "cannot set $want queue pairs (stays $now of $max; virtio_net refuses while XDP is attached)"; fi
  fi
else
  max='' now=''
  say "no combined queue pairs to set (ethtool -l): left as they are"
fi

# --- offloads --------------------------------------------------------------
# ethtool -k names: rx-gro-hw, large-receive-offload (lro), generic-receive-offload (gro).
features=$(ethtool -k "$iface" 2>/dev/null || true)
for f in rx-gro-hw:rx-gro-hw large-receive-offload:lro generic-receive-offload:gro; do
  long=${f%%:*} short=${f##*:}
  if grep -q "^$long: on" <<<"$features"; then
    if grep -q "^$long: on \[fixed\]" <<<"$features"; then
      say "$long is on and fixed: native XDP may be refused"
    else
      if ethtool -K "$iface" "$short" off; then say "$long off"; else say "cannot turn $long off"; fi
    fi
  fi
done

# --- multicast -------------------------------------------------------------
if [ "$SWML_ROLE" = worker ] && ! ip -o link show dev "$iface" | grep -q ALLMULTI; then
  ip link set dev "$iface" allmulticast on && say "allmulticast on"
fi

say "ready: $SWML_ROLE, mtu $(cat "/sys/class/net/$iface/mtu")${now:+, $now of $max queue pairs}, $cpus vCPUs"
