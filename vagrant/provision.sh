#!/usr/bin/env bash
# Provision one VM of the switchml-xdp vagrant lab (run as root by the Vagrantfile).
#
#   provision.sh --role switch --ip IP --switch-ip IP --world N --job J --control-port C
#                --mtu M --elements K --slots S --port P --mode native|generic|auto
#   provision.sh --role worker --ip IP --switch-ip IP --world N --job J --control-port C
#                --mtu M --rank R
#   [--iface IFACE]   the lab interface; default: the one holding --ip
#
# 1. scripts/setup.sh, the project's own set-up (the one `make demo` runs), without
#    --torch: the VMs run the switch and `swml-worker bench`, they do not train.
# 2. /etc/switchml-xdp/vm.env: this VM's role, rank, addresses (the only place the
#    VM keeps them), and swml-nic.service, which readies the lab NIC at every boot
#    (MTU, queue pairs, offloads, multicast): packaging/swml-nic.service and
#    packaging/tune-nic.sh, installed as on a real machine (docs/real-network.md),
#    with /etc/swml/nic.env naming the NIC.
# 3. switch: swml-switch.service, `swml-switch up IFACE ...` in the foreground under
#    systemd. worker: /usr/local/bin/swml-bench, `swml-worker bench` with this VM's
#    --switch/--job/--rank/--world filled in from vm.env. Both: the venv's swml-*
#    commands linked into /usr/local/bin.
# Running it again changes nothing that is already right.
#
# SWML_PROVISION_ROOT=DIR writes the files under DIR and does nothing else (no set-up,
# no systemctl, no NIC changes): tests/unit/test_vagrant_plan.py reads what it would install.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
root=${SWML_PROVISION_ROOT:-}
venv=${SWML_VENV:-$repo/.venv}
say() { printf 'provision: %s\n' "$*"; }
warn() { printf 'provision: WARNING: %s\n' "$*" >&2; }
die() { printf 'provision: %s\n' "$*" >&2; exit 1; }

role='' ip='' switch_ip='' world='' job='' control_port='' mtu='' rank='' iface=''
elements='' slots='' port='' mode='' reinstalled=''
while [ $# -gt 0 ]; do
  [ $# -ge 2 ] || die "option $1 needs a value"
  case $1 in
    --role) role=$2 ;; --ip) ip=$2 ;; --switch-ip) switch_ip=$2 ;; --world) world=$2 ;;
    --job) job=$2 ;; --control-port) control_port=$2 ;; --mtu) mtu=$2 ;; --rank) rank=$2 ;;
    --iface) iface=$2 ;; --elements) elements=$2 ;; --slots) slots=$2 ;; --port) port=$2 ;;
    --mode) mode=$2 ;;
    *) die "unknown option $1" ;;
  esac
  shift 2
done

# --- check the arguments ---------------------------------------------------
is_ipv4() { [[ $1 =~ ^([0-9]{1,3})\.([0-9]{1,3})\.([0-9]{1,3})\.([0-9]{1,3})$ ]] &&
            for o in "${BASH_REMATCH[@]:1}"; do [ "$((10#$o))" -le 255 ] || return 1; done; }
int_in() {
  if ! [[ $2 =~ ^[0-9]{1,9}$ ]] || [ "$((10#$2))" -lt "$3" ] || [ "$((10#$2))" -gt "$4" ]; then
    die "--$1 must be an integer in $3..$4, got '$2'"
  fi
}
case $role in switch|worker) ;; *) die "--role must be switch or worker, got '$role'" ;; esac
is_ipv4 "$ip" || die "--ip must be an IPv4 address, got '$ip'"
is_ipv4 "$switch_ip" || die "--switch-ip must be an IPv4 address, got '$switch_ip'"
int_in world "$world" 1 64
int_in control-port "$control_port" 1 65535
int_in mtu "$mtu" 576 65535
[[ $job =~ ^[A-Za-z0-9._-]{1,64}$ ]] || die "--job must be 1-64 of [A-Za-z0-9._-], got '$job'"
if [ "$role" = switch ]; then
  [ "$ip" = "$switch_ip" ] || die "the switch's --ip $ip differs from --switch-ip $switch_ip"
  [ -z "$rank" ] || die "--rank is for workers"
  # the upper bound of k is the switch's to check (`swml-switch up --elements`: wire.MAX_K)
  int_in elements "$elements" 1 65535
  int_in slots "$slots" 1 65535
  int_in port "$port" 1 65535
  case $mode in native|generic|auto) ;; *) die "--mode must be native, generic or auto, got '$mode'" ;; esac
else
  [ "$ip" != "$switch_ip" ] || die "a worker cannot have the switch's address $ip"
  [ -z "$elements$slots$port$mode" ] || die "--elements/--slots/--port/--mode are for the switch"
  int_in rank "$rank" 0 $((world - 1))
fi

# --- the lab interface -----------------------------------------------------
if [ -z "$iface" ]; then
  # Vagrant configured the private network before provisioning: find its NIC.
  iface=$(ip -o -4 addr show | awk -v ip="$ip" '{ split($4, a, "/"); if (a[1] == ip) { print $2; exit } }')
  [ -n "$iface" ] || die "no interface holds $ip (did Vagrant configure the private network?)"
fi
[[ $iface =~ ^[A-Za-z0-9._-]{1,15}$ ]] || die "bad interface name '$iface'"

[ -n "$root" ] || [ "$(id -u)" = 0 ] || die "must run as root"

# --- 1. the project's set-up -------------------------------------------------
if [ -z "$root" ]; then
  # bcc compiles against this kernel's headers; the box's kernel may be older than
  # the one linux-headers-amd64 (from setup.sh) is for. Get the exact ones if apt can.
  kh=linux-headers-$(uname -r)
  if ! dpkg-query -W -f='${Status}' "$kh" 2>/dev/null | grep -q 'install ok installed'; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    if apt-cache show "$kh" >/dev/null 2>&1; then
      say "installing $kh"
      apt-get install -y -qq --no-install-recommends "$kh" >/dev/null
    else
      warn "apt has no $kh; setup.sh will use Debian's generic headers"
    fi
  fi
  # setup.sh touches this stamp when it (re)installs the package: then a running
  # switch daemon has old code and gets restarted below.
  stamp_before=$(stat -c %Y "$venv/.swml-installed" 2>/dev/null || true)
  SWML_VENV=$venv bash "$repo/scripts/setup.sh"
  [ "$(stat -c %Y "$venv/.swml-installed" 2>/dev/null || true)" = "$stamp_before" ] || reinstalled=1
fi

# --- 2./3. files -----------------------------------------------------------
changed=()
# put DEST MODE: install stdin as DEST (under $root) unless it already has that content.
put() {
  local dest=$root$1 tmp
  mkdir -p "$(dirname "$dest")"
  tmp=$(mktemp "$dest.XXXXXX")
  cat >"$tmp"
  chmod "$2" "$tmp"
  if cmp -s "$tmp" "$dest"; then rm -f "$tmp"; else mv -f "$tmp" "$dest"; changed+=("$1"); fi
}

env_text=$(
  echo "# Written by $repo/vagrant/provision.sh: this VM's part in the vagrant lab."
  echo "SWML_ROLE=$role"
  echo "SWML_IFACE=$iface"
  echo "SWML_IP=$ip"
  echo "SWML_SWITCH_IP=$switch_ip"
  echo "SWML_WORLD=$world"
  echo "SWML_JOB=$job"
  echo "SWML_CONTROL_PORT=$control_port"
  echo "SWML_MTU=$mtu"
  if [ "$role" = worker ]; then
    echo "SWML_RANK=$rank"
  else
    echo "SWML_ELEMENTS=$elements"
    echo "SWML_SLOTS=$slots"
    echo "SWML_PORT=$port"
    echo "SWML_MODE=$mode"
  fi
  echo "SWML_REPO=$repo"
  echo "SWML_VENV=$venv"
)
put /etc/switchml-xdp/vm.env 0644 <<<"$env_text"

# The NIC unit and its script, from packaging/ (the unit names where they go).
put /etc/systemd/system/swml-nic.service 0644 <"$repo/packaging/swml-nic.service"
put /usr/local/sbin/swml-tune-nic 0755 <"$repo/packaging/tune-nic.sh"
put /etc/swml/nic.env 0644 <<EOF
# Written by $repo/vagrant/provision.sh: the NIC swml-nic.service readies.
SWML_IFACE=$iface
SWML_MTU=$mtu
SWML_ROLE=$role
EOF

# link NAME TARGET: NAME (under $root) a symlink to TARGET.
link() {
  mkdir -p "$root$(dirname "$1")"
  if [ "$(readlink "$root$1" 2>/dev/null)" != "$2" ]; then ln -sfn "$2" "$root$1"; changed+=("$1"); fi
}
# The CLIs on root's PATH (sudo swml-switch status, sudo swml-worker bench ...).
for b in swml-switch swml-worker swml-lab; do link "/usr/local/bin/$b" "$venv/bin/$b"; done

if [ "$role" = switch ]; then
  mode_arg=
  [ "$mode" = auto ] || mode_arg=" --mode $mode"
  put /etc/systemd/system/swml-switch.service 0644 <<EOF
[Unit]
Description=switchml-xdp aggregation switch on $iface ($switch_ip)
After=network-online.target swml-nic.service
Wants=network-online.target
Requires=swml-nic.service

[Service]
ExecStart=$venv/bin/swml-switch up $iface --elements $elements --slots $slots --port $port --control-port $control_port$mode_arg --verbose
Restart=on-failure
RestartSec=3
TimeoutStopSec=20

[Install]
WantedBy=multi-user.target
EOF
else
  link /usr/local/bin/swml-bench "$here/swml-bench"
fi

if [ ${#changed[@]} -gt 0 ]; then say "wrote ${changed[*]}"; else say "files already in place"; fi
[ -z "$root" ] || exit 0

# --- bring it up -----------------------------------------------------------
systemctl daemon-reload
systemctl enable --quiet swml-nic.service
systemctl restart swml-nic.service   # oneshot; re-applies the NIC settings now
journalctl -u swml-nic.service -b -o cat -n 20 --no-pager | grep '^swml-nic' | tail -n 8 || true

if [ "$role" = switch ]; then
  systemctl enable --quiet swml-switch.service
  if [ -n "$reinstalled" ] || [[ " ${changed[*]} " =~ " /etc/"(switchml-xdp/vm.env|systemd/system/swml-switch.service)" " ]]; then
    systemctl restart swml-switch.service
  else
    systemctl start swml-switch.service   # nothing new: leave a running switch (and its jobs) alone
  fi
  for _ in $(seq 120); do
    ss -Hltn "sport = :$control_port" | grep -q . && break
    systemctl is-failed --quiet swml-switch.service && break
    sleep 0.5
  done
  if ! ss -Hltn "sport = :$control_port" | grep -q .; then
    journalctl -u swml-switch.service -b -n 30 --no-pager >&2 || true
    die "swml-switch did not come up on $iface (journalctl -u swml-switch)"
  fi
  journalctl -u swml-switch.service -b -o cat --no-pager | grep -E 'up on|native XDP|libbpf' | tail -n 3 || true
  say "switch serving on $switch_ip:$control_port; workers: sudo swml-bench"
else
  via=$(ip -o route get "$switch_ip" 2>/dev/null | sed -n 's/.* dev \([^ ]*\).*/\1/p')
  [ "$via" = "$iface" ] || warn "the route to the switch $switch_ip goes via '$via', not $iface"
  say "worker rank $rank of $world, switch $switch_ip: run 'sudo swml-bench' on every worker (or vagrant/bench.sh)"
fi
