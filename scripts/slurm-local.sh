#!/usr/bin/env bash
# A one-node Slurm cluster on this machine's loopback, for the table runner's Slurm launcher and its tests
# (python -m fairseq_sparse.tables NAME --launcher slurm).
#
#   bash scripts/slurm-local.sh start    install Debian's slurm-wlm and munge if missing (root), configure, start
#   bash scripts/slurm-local.sh stop     stop the daemons this script started (by their pid files)
#   bash scripts/slurm-local.sh status   whether the node answers
#
# The node is this machine (all its cores, 80% of its memory), in partitions "local" (the default) and
# "timed" (the same node, for a partition other than the default). No cgroups and no accounting
# database: the configuration that runs as root in a container (docs/tables.md, "On a cluster").
# Its state, spool and logs live in $SLURM_LOCAL_DIR (default /var/tmp/slurm-local).
set -euo pipefail

STATE=${SLURM_LOCAL_DIR:-/var/tmp/slurm-local}
CONF=/etc/slurm/slurm.conf

answers() {  # the node is up when sinfo lists it idle, mixed or allocated
    command -v sinfo >/dev/null && timeout 10 sinfo -h -N -o '%T' 2>/dev/null | grep -qE '^(idle|mixed|allocated|completing)'
}

install_packages() {
    if command -v slurmctld >/dev/null && command -v munged >/dev/null && command -v sbatch >/dev/null; then
        return
    fi
    if [ "$(id -u)" != 0 ]; then
        echo "slurm-local: slurm-wlm and munge are not installed, and installing them needs root" >&2
        exit 1
    fi
    echo "slurm-local: installing Debian's slurm-wlm and munge (a few minutes)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq slurm-wlm munge >/dev/null
}

write_config() {
    local host cpus memory
    host=$(hostname)
    cpus=$(nproc)
    memory=$(awk '/MemTotal/ {printf "%d", $2 / 1024 * 0.8}' /proc/meminfo)
    mkdir -p "$STATE"/{state,spool,log} /etc/slurm
    cat > "$CONF.new" <<EOF
# written by scripts/slurm-local.sh: a one-node cluster on the loopback
ClusterName=local
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
ReturnToService=2
JobRequeue=1
MinJobAge=600
KillWait=5
StateSaveLocation=$STATE/state
SlurmdSpoolDir=$STATE/spool
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd.log
# a job that asks no memory gets its cores' share, not the whole node's
DefMemPerCPU=$((memory / cpus))
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$memory State=UNKNOWN
PartitionName=local Nodes=$host Default=YES MaxTime=INFINITE State=UP
PartitionName=timed Nodes=$host Default=NO MaxTime=INFINITE State=UP
EOF
    mv "$CONF.new" "$CONF"
}

start_munge() {
    if [ -f /run/munge/munged.pid ] && kill -0 "$(cat /run/munge/munged.pid)" 2>/dev/null; then
        return
    fi
    if [ ! -s /etc/munge/munge.key ]; then
        mkdir -p /etc/munge
        dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key status=none
    fi
    mkdir -p /run/munge /var/log/munge /var/lib/munge
    chown munge:munge /etc/munge/munge.key /run/munge /var/log/munge /var/lib/munge 2>/dev/null || true
    chmod 400 /etc/munge/munge.key
    # as root munged warns that its log folder is not its user's: the warning is harmless
    munged --force 2>/dev/null
}

running() {  # a daemon started by this script still alive
    [ -f "$STATE/$1.pid" ] && kill -0 "$(cat "$STATE/$1.pid")" 2>/dev/null
}

start() {
    if answers; then
        echo "slurm-local: the cluster is up ($(sinfo -h -o '%P %D %T' | tr '\n' ';'))"
        return
    fi
    install_packages
    write_config
    start_munge
    running slurmctld || slurmctld
    running slurmd || slurmd
    for _ in $(seq 60); do
        if answers; then
            # a node that was down when the controller last ran comes back with ReturnToService=2
            echo "slurm-local: the cluster is up ($(sinfo -h -o '%P %D %T' | tr '\n' ';'))"
            return
        fi
        sleep 1
    done
    echo "slurm-local: the node did not come up within 60 s; logs in $STATE/log" >&2
    exit 1
}

alive() {  # a process that has not exited (a zombie nobody reaped has)
    [ -d "/proc/$1" ] && ! grep -q '^State:.*Z' "/proc/$1/status" 2>/dev/null
}

stop() {
    local pids=()
    for daemon in slurmd slurmctld; do
        if running "$daemon"; then
            pids+=("$(cat "$STATE/$daemon.pid")")
        fi
    done
    if [ -f /run/munge/munged.pid ] && kill -0 "$(cat /run/munge/munged.pid)" 2>/dev/null; then
        pids+=("$(cat /run/munge/munged.pid)")
    fi
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${pids[@]}"; do  # gone before a start that follows looks for a controller
        for _ in $(seq 50); do alive "$pid" || break; sleep 0.2; done
    done
    echo "slurm-local: stopped"
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    status) if answers; then sinfo; else echo "slurm-local: no cluster answers" >&2; exit 1; fi ;;
    *) echo "usage: bash scripts/slurm-local.sh start|stop|status" >&2; exit 2 ;;
esac
