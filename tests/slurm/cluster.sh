#!/usr/bin/env bash
# tests/slurm/cluster.sh — a real Slurm cluster for one test: Debian's munged, slurmctld and one
# slurmd per network-namespace host (tools/netns), started here, torn down on any exit.
#
#   tests/slurm/cluster.sh WORKDIR -- CMD...
#
# CMD runs on the first host (where slurmctld listens) with SLURM_CONF set, e.g.
# `sbatch --wait job.sbatch`. Hosts are named after their namespaces (smddp-<id>-h0, -h1) and
# resolve through /etc/netns/<ns>/hosts (tools/netns writes it), as a cluster's DNS would.
# WORKDIR keeps the config, the daemons' logs and spool; on failure the logs are printed.
# Needs root and the daemons (the trixie devenv has them: tools/devenv run -- ...).
set -euo pipefail
die() { echo "slurm-cluster: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "needs root"
for b in munged slurmctld slurmd sinfo; do command -v $b >/dev/null || die "$b is not installed"; done
[ $# -ge 3 ] && [ "$2" = -- ] || die "usage: cluster.sh WORKDIR -- CMD..."
work=$(realpath -m "$1")
shift 2
SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd -P)
NETNS=$SRC/tools/netns

mkdir -p "$work"/{state,log}
# Sockets live where their paths stay short (a unix socket path has 108 bytes at most).
run=$(mktemp -d /tmp/slurm.XXXXXX)
mkdir -p "$run/munge"
id=$("$NETNS" up 2)
pids=()
cleanup() {
  local rc=$?
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do
    for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$p" 2>/dev/null || true
  done
  # Job steps left behind by a failed test (slurmstepd, which renames itself, and its children)
  # run in the hosts' namespaces: `netns down` below kills every process in them.
  pkill -9 -f "$run" 2>/dev/null || true
  "$NETNS" down "$id" >/dev/null 2>&1 || true
  rm -rf "$run"
  if [ $rc -ne 0 ]; then
    for f in "$work"/log/*.log; do echo "== $f" >&2; tail -n 30 "$f" >&2 || true; done
  fi
  exit $rc
}
trap cleanup EXIT INT TERM

h0=smddp-$id-h0 h1=smddp-$id-h1
a0=$("$NETNS" addr "$id" 0)
cat >"$work/slurm.conf" <<EOF
ClusterName=smddp$id
SlurmctldHost=$(hostname -s)($a0)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$run/munge/socket
StateSaveLocation=$work/state
SlurmdSpoolDir=$run/%n
SlurmctldPidFile=$work/slurmctld.pid
SlurmdPidFile=$work/slurmd-%n.pid
SlurmctldLogFile=$work/log/slurmctld.log
SlurmdLogFile=$work/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
NodeName=$h0 NodeAddr=$a0 CPUs=2 State=UNKNOWN
NodeName=$h1 NodeAddr=$("$NETNS" addr "$id" 1) CPUs=2 State=UNKNOWN
PartitionName=test Nodes=$h0,$h1 Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE
EOF
# No cgroups: the hosts share one kernel (and a chroot may have no cgroup mount); processes are
# tracked by parentage (proctrack/linuxproc) instead.
echo "CgroupPlugin=disabled" >"$work/cgroup.conf"
export SLURM_CONF=$work/slurm.conf

# What a site sets up for its jobs, run before every task (TaskProlog prints "export" lines):
# the pretend hosts share one kernel, so each tells smddp which node it is (a real node is told
# apart by host name and boot id), and libfabric's tcp provider and gloo (the reference the
# tests compare with) take the host's link, since the machine's own name resolves to no host.
cat >"$work/task_prolog.sh" <<'EOF2'
#!/bin/sh
echo "export SMDDP_NODE_ID=$SLURMD_NODENAME"
echo "export FI_TCP_IFACE=eth0"
echo "export GLOO_SOCKET_IFNAME=eth0"
EOF2
chmod +x "$work/task_prolog.sh"
echo "TaskProlog=$work/task_prolog.sh" >>"$work/slurm.conf"

# One munged serves both hosts (its socket is a file; the hosts share this filesystem), with a
# key of this cluster's own.
mungekey -c -k "$run/munge/key" 2>/dev/null
munged -F -f --key-file="$run/munge/key" --socket="$run/munge/socket" --pid-file="$run/munge/pid" \
  --log-file="$work/log/munged.log" --seed-file="$run/munge/seed" >"$work/log/munged.out" 2>&1 &
pids+=($!)
ip netns exec "$h0" slurmctld -D -i >"$work/log/slurmctld.out" 2>&1 &
pids+=($!)
for h in "$h0" "$h1"; do
  mkdir -p "$run/$h"
  ip netns exec "$h" slurmd -D -N "$h" >"$work/log/slurmd-$h.out" 2>&1 &
  pids+=($!)
done

# Ready when both nodes are idle (slurmd registered with slurmctld).
for i in $(seq 150); do
  idle=$(ip netns exec "$h0" sinfo -h -N -o '%T' 2>/dev/null | grep -c '^idle' || true)
  [ "$idle" = 2 ] && break
  [ $i = 150 ] && die "the nodes did not come up in 30 s"
  sleep 0.2
done
echo "slurm-cluster: $h0 $h1 up ($(slurmctld -V))" >&2
# The command gets SMDDP_SLURM_TIMEOUT seconds (default 300): a job that hangs fails here, and
# the daemons still go (a caller's own timeout would kill this script before its cleanup).
timeout --kill-after=10 "${SMDDP_SLURM_TIMEOUT:-300}" ip netns exec "$h0" env SLURM_CONF="$SLURM_CONF" "$@"
