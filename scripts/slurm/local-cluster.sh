#!/usr/bin/env bash
# A one-node Slurm cluster on this machine, for the srun tests and for trying the recipes in
# docs/distributed.md without a cluster: munged, slurmctld and slurmd as root, on the loopback
# address, with every file (config, state, logs, sockets) in one folder of its own.
#
#   scripts/slurm/local-cluster.sh start DIR   # prints the SLURM_CONF line to export
#   scripts/slurm/local-cluster.sh stop DIR
#
# Needs root and Debian's slurmd, slurmctld, slurm-client and munge packages (CI installs
# them: .ci/run). It writes nothing outside DIR, and takes only a new or empty DIR or one it
# made before; the node is this machine (hostname -s) with
# its CPUs, one partition `local`, PMI2 as srun's default (the `mpi` extra's MPICH speaks it).
set -euo pipefail

usage() { echo "usage: $0 start|stop DIR" >&2; exit 2; }
[[ $# == 2 ]] || usage
action=$1
dir=$(mkdir -p "$2" && cd "$2" && pwd)
conf=$dir/slurm.conf

stop() {  # SIGTERM to the daemons of DIR, then up to 20 s for them to be gone
    local pids=() file pid
    for file in slurmd.pid slurmctld.pid munge/munged.pid; do
        if [[ -s $dir/$file ]]; then pids+=("$(cat "$dir/$file")"); fi
    done
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    for _ in $(seq 100); do
        for pid in "${pids[@]}"; do
            if kill -0 "$pid" 2>/dev/null; then sleep 0.2; continue 2; fi
        done
        return 0
    done
    echo "the local Slurm daemons of $dir did not stop: ${pids[*]}" >&2
    return 1
}

case $action in
start)
    for tool in munged slurmctld slurmd srun; do
        command -v "$tool" >/dev/null || {
            echo "$tool not found: apt-get install slurmd slurmctld slurm-client munge" >&2
            exit 1
        }
    done
    if [[ -n $(ls -A "$dir") ]] && ! grep -qx "ClusterName=rustyflow-local" "$conf" 2>/dev/null
    then
        echo "$dir holds files that are not a local cluster's: pass a new or empty folder" >&2
        exit 1
    fi
    stop
    host=$(hostname -s)
    mkdir -p "$dir/state" "$dir/spool" "$dir/munge"
    rm -rf "${dir:?}/state/"*  # a fresh controller: no jobs of an earlier start
    # Job ids that no earlier start used: MPICH names its shared-memory segments after the
    # job and step (PMI2's KVS name), and a killed job leaves its segment in /dev/shm, where
    # a later job of the same id would find it and hang or fail in MPI_Init.
    first_job=$(( $(date +%s) % 6000000 * 10 + 1 ))
    cat > "$conf" <<CONF
ClusterName=rustyflow-local
SlurmctldHost=$host(127.0.0.1)
AuthType=auth/munge
AuthInfo=socket=$dir/munge/munge.socket
SlurmUser=root
SlurmdUser=root
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmdSpoolDir=$dir/spool
StateSaveLocation=$dir/state
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
ProctrackType=proctrack/pgid
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=pmi2
ReturnToService=2
FirstJobId=$first_job
NodeName=$host NodeAddr=127.0.0.1 CPUs=$(nproc) State=UNKNOWN
PartitionName=local Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE
CONF
    munged --force --socket="$dir/munge/munge.socket" --pid-file="$dir/munge/munged.pid" \
        --log-file="$dir/munge/munged.log" --seed-file="$dir/munge/seed"
    slurmctld -f "$conf"
    slurmd -f "$conf"
    for _ in $(seq 100); do  # up to 20 s for the node to be idle
        if [[ $(SLURM_CONF=$conf sinfo -h -o %t 2>/dev/null) == idle ]]; then
            echo "export SLURM_CONF=$conf"
            exit 0
        fi
        sleep 0.2
    done
    echo "the local Slurm node did not come up; see $dir/slurmctld.log and slurmd.log" >&2
    stop
    exit 1
    ;;
stop) stop ;;
*) usage ;;
esac
