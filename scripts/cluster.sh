#!/usr/bin/env bash
# A cluster in a box, for tests and benches of jobs across hosts: "hosts" made as network
# namespaces of this machine, each joined by a veth link to a bridge in a namespace of
# its own (the switch), each link's rate set in both directions by tc's tbf (no delay:
# these kernels have no netem). Every address is inside the namespaces made here
# (10.77.0.0/24); nothing is added to this machine's own namespace. Ranks in one
# namespace share memory; ranks in different ones talk TCP over the links only.
#
#   cluster.sh check
#       exits 0 where namespaces can be made here, else prints why and exits 1
#   cluster.sh run [-n HOSTS] [-s SLOTS] [-r RATE] -- MPIRUN_ARGS...
#       makes HOSTS hosts (2 to 4, default 2) of SLOTS slots each (default 2), their
#       links shaped to RATE (tc's units: 1gbit, 10gbit, 25gbit; default not shaped),
#       runs `mpirun -H h0:SLOTS,h1:SLOTS,... MPIRUN_ARGS` from host 0's namespace (its
#       daemons started in the other hosts' namespaces through an rsh agent that runs
#       `ip netns exec`), then removes the hosts, their processes and links, whatever
#       happened (also on SIGINT and SIGTERM). Exits with mpirun's status. Where the
#       hosts' slots outnumber this machine's cores, the ranks yield their core while
#       they wait in MPI (Open MPI's mpi_yield_when_idle, unless MPIRUN_ARGS or the
#       environment set it): mpirun sees hosts of SLOTS slots each and cannot tell that
#       they share one machine's cores, where a rank spinning in a wait takes the core
#       another host's rank computes on (real hosts have cores of their own).
#
# Needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN), iproute2 and Open MPI. Run as root, the
# job needs OMPI_ALLOW_RUN_AS_ROOT=1 and OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1, as any mpirun.
set -uo pipefail

usage() {
    sed -n '9,22p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
}

net=10.77.0
prefix=kvc$$
switch=${prefix}s
made=()
temp=

cleanup() {
    local ns pid
    for ns in "${made[@]}"; do
        for pid in $(ip netns pids "$ns" 2>/dev/null); do
            kill -9 "$pid" 2>/dev/null
        done
    done
    for ns in "${made[@]}"; do
        ip netns del "$ns" 2>/dev/null
    done
    made=()
    [ -n "$temp" ] && rm -rf "$temp"
}

# Makes namespace $1 (removed by cleanup).
add_ns() {
    ip netns add "$1" || return 1
    made+=("$1")
    ip -n "$1" link set lo up
}

# tbf on device $2 of namespace $1 at rate $3: a bucket of 8 ms at that rate (at least
# 64 KiB), so that the kernel's timer (250 Hz here) never leaves the link idle.
shape() {
    local bits burst
    bits=$(rate_bits "$3") || return 1
    burst=$((bits / 8 / 125))
    [ "$burst" -lt 65536 ] && burst=65536
    tc -n "$1" qdisc add dev "$2" root tbf rate "$3" burst "$burst" latency 100ms
}

# The bits per second of a rate in tc's units (1gbit, 10gbit, 500mbit, 1000000bit).
rate_bits() {
    local r=${1,,} n unit
    n=${r%%[a-z]*}
    unit=${r#"$n"}
    case $unit in
        bit) echo "$n" ;;
        kbit) echo $((n * 1000)) ;;
        mbit) echo $((n * 1000000)) ;;
        gbit) echo $((n * 1000000000)) ;;
        *) echo "cluster.sh: a rate is a number with kbit, mbit or gbit: $1" >&2; return 1 ;;
    esac
}

# Makes the switch and $1 hosts with links of rate $2 (empty: not shaped).
up() {
    local hosts=$1 rate=$2 i h
    add_ns "$switch" || return 1
    ip -n "$switch" link add br0 type bridge || return 1
    ip -n "$switch" link set br0 up || return 1
    for ((i = 0; i < hosts; i++)); do
        h=${prefix}h$i
        add_ns "$h" || return 1
        ip -n "$switch" link add "p$i" type veth peer name eth0 netns "$h" || return 1
        ip -n "$switch" link set "p$i" master br0 up || return 1
        ip -n "$h" addr add "$net.$((i + 1))/24" dev eth0 || return 1
        ip -n "$h" link set eth0 up || return 1
        if [ -n "$rate" ]; then
            shape "$h" eth0 "$rate" || return 1
            shape "$switch" "p$i" "$rate" || return 1
        fi
    done
}

check() {
    command -v ip >/dev/null || { echo "no ip command (iproute2)"; return 1; }
    command -v tc >/dev/null || { echo "no tc command (iproute2)"; return 1; }
    temp=$(mktemp -d)
    if up 2 1gbit 2>"$temp/why"; then
        cleanup
        return 0
    fi
    echo "network namespaces cannot be made here: $(head -c 300 "$temp/why")"
    cleanup
    return 1
}

run() {
    local hosts=2 slots=2 rate= i list= agent status
    while [ $# -gt 0 ]; do
        case $1 in
            -n) hosts=$2; shift 2 ;;
            -s) slots=$2; shift 2 ;;
            -r) rate=$2; shift 2 ;;
            --) shift; break ;;
            *) usage ;;
        esac
    done
    [ "$hosts" -ge 2 ] && [ "$hosts" -le 4 ] || { echo "cluster.sh: 2 to 4 hosts" >&2; exit 2; }
    [ $# -gt 0 ] || usage
    trap cleanup EXIT
    trap 'cleanup; exit 130' INT
    trap 'cleanup; exit 143' TERM
    if ! up "$hosts" "$rate"; then
        echo "cluster.sh: could not make the hosts" >&2
        exit 1
    fi
    temp=$(mktemp -d)
    agent=$temp/agent.sh
    {
        echo '#!/bin/sh'
        echo '# mpirun runs "AGENT HOST COMMAND...": the command in the host'"'"'s namespace.'
        echo 'host=$1; shift'
        echo 'case $host in'
        for ((i = 0; i < hosts; i++)); do
            echo "  $net.$((i + 1))) ns=${prefix}h$i ;;"
        done
        echo '  *) echo "cluster.sh: no host $host" >&2; exit 1 ;;'
        echo 'esac'
        # (A host name of its own, in a UTS namespace of its own: Open MPI names its
        # shared-memory files in /dev/shm, which the hosts share, by the host's name.)
        echo 'exec ip netns exec "$ns" unshare --uts sh -c "hostname $ns && $*"'
    } >"$agent"
    chmod 755 "$agent"
    for ((i = 0; i < hosts; i++)); do
        list+=${list:+,}$net.$((i + 1)):$slots
    done
    local shared=()
    if [ $((hosts * slots)) -gt "$(nproc)" ] && [ -z "${OMPI_MCA_mpi_yield_when_idle:-}" ] &&
        [[ " $* " != *" mpi_yield_when_idle "* ]]; then
        shared=(--mca mpi_yield_when_idle 1)
    fi
    # (Open MPI 4.1's daemon on a second host can crash writing its topology into the
    # shared memory of the first: kvstore-run passes the same setting.)
    ip netns exec "${prefix}h0" unshare --uts sh -c 'hostname "$0" && exec mpirun "$@"' "${prefix}h0" \
        --mca plm_rsh_agent "$agent" --mca oob_tcp_if_include "$net.0/24" --mca btl_tcp_if_include "$net.0/24" \
        --mca rtc_hwloc_vmhole none "${shared[@]}" -H "$list" "$@"
    status=$?
    cleanup
    trap - EXIT INT TERM
    exit "$status"
}

case ${1:-} in
    check) shift; check ;;
    run) shift; run "$@" ;;
    *) usage ;;
esac
