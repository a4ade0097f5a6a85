#!/usr/bin/env bash
# A bandwidth-bound cluster on one machine: N hosts in network namespaces joined by a bridge
# (in its own namespace), every link rate-limited with tc tbf on both ends; Open MPI or
# torch.distributed's gloo over TCP.
#
#   scripts/netns_cluster.sh up N [RATE]          create zenh0..zenh{N-1} (default 1gbit)
#   scripts/netns_cluster.sh down                 remove everything this script created
#   scripts/netns_cluster.sh run N[xL] [RATE] -- CMD
#                                                 up, mpirun -np N*L CMD across the hosts, L
#                                                 ranks on each (default 1: shared memory
#                                                 between them), down (also on error or
#                                                 Ctrl-C: trap)
#   scripts/netns_cluster.sh torchrun N[xL] [RATE] -- PYTHON SCRIPT|-m MODULE [ARGS]
#                                                 up, one torchrun agent per host (L processes
#                                                 each) running SCRIPT or MODULE, down
# Needs root. Addresses: a private subnet that exists only inside these namespaces.
set -euo pipefail

PREFIX=zenh
BRIDGE_NS=zenbr
SUBNET=10.213.7
CIDR=$SUBNET.0/24

host_ns() { echo "$PREFIX$1"; }
host_ip() { echo "$SUBNET.$(( $1 + 1 ))"; }

up() {
  local n=$1 rate=${2:-1gbit}
  ip netns add $BRIDGE_NS
  ip netns exec $BRIDGE_NS ip link add br0 type bridge
  ip netns exec $BRIDGE_NS ip link set br0 up
  for ((i = 0; i < n; i++)); do
    local ns; ns=$(host_ns $i)
    ip netns add "$ns"
    ip link add "v$ns" netns "$ns" type veth peer name "b$ns" netns $BRIDGE_NS
    ip netns exec "$ns" ip addr add "$(host_ip $i)/24" dev "v$ns"
    ip netns exec "$ns" ip link set "v$ns" up
    ip netns exec "$ns" ip link set lo up
    ip netns exec $BRIDGE_NS ip link set "b$ns" master br0
    ip netns exec $BRIDGE_NS ip link set "b$ns" up
    ip netns exec "$ns" tc qdisc add dev "v$ns" root tbf rate "$rate" burst 256kb latency 50ms
    ip netns exec $BRIDGE_NS tc qdisc add dev "b$ns" root tbf rate "$rate" burst 256kb latency 50ms
  done
}

down() {
  for ns in $(ip netns list | awk '{print $1}' | grep -E "^($PREFIX[0-9]+|$BRIDGE_NS)$" || true); do
    ip netns del "$ns" || true
  done
  rm -f "${AGENT:-}"
  if [ -n "${SESSIONS:-}" ]; then rm -rf "$SESSIONS"; fi
}

# The rsh agent Open MPI calls as `agent [options] HOST CMD...`: run CMD in HOST's namespace.
write_agent() {
  AGENT=$(mktemp /tmp/zen_netns_agent.XXXXXX)
  SESSIONS=$(mktemp -d /tmp/zen_netns_sessions.XXXXXX)
  cat > "$AGENT" <<EOF
#!/bin/sh
TMPDIR_BASE=$SESSIONS
while [ \$# -gt 0 ]; do case "\$1" in -*) shift;; *) break;; esac; done
host=\$1; shift
ns=$PREFIX\$(( \${host##*.} - 1 ))
# Every host's daemon gets its own session directory (the hosts share /tmp, and two daemons
# creating the same directory at once fail: "File exists") and its own host name (a UTS
# namespace named as the host): Open MPI, Horovod and zen_hvd tell hosts apart by name.
mkdir -p "\$TMPDIR_BASE/\$ns"
exec ip netns exec "\$ns" unshare --uts env OMPI_MCA_orte_tmpdir_base="\$TMPDIR_BASE/\$ns" \\
  ZEN_NETNS_HOST="\$ns" /bin/sh -c 'hostname "\$ZEN_NETNS_HOST" && exec /bin/sh -c "\$1"' agent "\$*"
EOF
  chmod +x "$AGENT"
}

# "N" or "NxL": N hosts, L ranks on each (default 1).
hosts_of() { echo "${1%%x*}"; }
per_host_of() { if [[ $1 == *x* ]]; then echo "${1##*x}"; else echo 1; fi; }

run() {
  local n per; n=$(hosts_of "$1"); per=$(per_host_of "$1"); shift
  local rate=1gbit
  if [ $# -gt 0 ] && [ "$1" != "--" ]; then rate=$1; shift; fi
  [ "${1:-}" = "--" ] && shift
  trap down EXIT INT TERM
  down
  up "$n" "$rate"
  write_agent
  # The hosts share this machine's cores: benchmarks size their thread pools by this.
  export ZEN_HVD_RANKS_SHARING_CORES=$(( n * per ))
  local envs="-x PATH -x ZEN_HVD_RANKS_SHARING_CORES"
  for v in VIRTUAL_ENV PYTHONPATH; do [ -n "${!v:-}" ] && envs="$envs -x $v"; done
  for v in $(compgen -e | grep -E '^(ZEN_HVD|HOROVOD)_' || true); do envs="$envs -x $v"; done
  local hosts=""
  for ((i = 0; i < n; i++)); do hosts="$hosts${hosts:+,}$(host_ip $i):$per"; done
  # Every host has L slots, so Open MPI thinks no core is shared and busy-polls; the hosts
  # do share this machine's cores, so ranks must yield while they wait. All ranks talk over
  # TCP: ranks of one host reach each other's address through the namespace's loopback,
  # unshaped, and the others over the shaped links. Host 0 is mpirun's own namespace; it runs
  # under the machine's host name, the others under their namespace's.
  ip netns exec "$(host_ns 0)" mpirun --allow-run-as-root --oversubscribe --bind-to none \
    -np $(( n * per )) --host "$hosts" --map-by slot --mca plm_rsh_agent "$AGENT" \
    --mca btl tcp,self --mca btl_tcp_if_include $CIDR --mca oob_tcp_if_include $CIDR \
    --mca mpi_yield_when_idle 1 \
    $envs --wdir "$PWD" "$@"
}

# One torchrun agent per host, all started in the background and waited for: host i is node
# rank i of N, host 0's agent holds the rendezvous store. The hosts share one host name, so gloo
# is pinned to each host's own link (GLOO_SOCKET_IFNAME). The first agent to fail ends the rest.
torchrun_hosts() {
  local n per; n=$(hosts_of "$1"); per=$(per_host_of "$1"); shift
  local rate=1gbit
  if [ $# -gt 0 ] && [ "$1" != "--" ]; then rate=$1; shift; fi
  [ "${1:-}" = "--" ] && shift
  local python=$1; shift
  AGENTS=()
  trap 'for pid in "${AGENTS[@]}"; do kill "$pid" 2>/dev/null || true; done; down' EXIT INT TERM
  down
  up "$n" "$rate"
  # The hosts share this machine's cores: benchmarks size their thread pools by this.
  export ZEN_HVD_RANKS_SHARING_CORES=$(( n * per ))
  for ((i = 0; i < n; i++)); do
    local ns; ns=$(host_ns $i)
    ip netns exec "$ns" env GLOO_SOCKET_IFNAME="v$ns" "$python" -m torch.distributed.run \
      --nnodes "$n" --node-rank "$i" --nproc-per-node "$per" \
      --master-addr "$(host_ip 0)" --master-port 29500 "$@" &
    AGENTS+=($!)
  done
  local rc=0
  for ((i = 0; i < n; i++)); do
    if ! wait -n; then
      rc=1
      break
    fi
  done
  return $rc
}

cmd=${1:-}; shift || true
case "$cmd" in
  up) up "$@" ;;
  down) down ;;
  run) run "$@" ;;
  torchrun) torchrun_hosts "$@" ;;
  *) echo "usage: $0 up N [RATE] | down | run N[xL] [RATE] -- CMD... | torchrun N[xL] [RATE] -- PYTHON SCRIPT|-m MODULE [ARGS]" >&2
     exit 2 ;;
esac
