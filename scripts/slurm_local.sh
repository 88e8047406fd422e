#!/usr/bin/env bash
# A real single-node SLURM cluster on localhost, for testing `hydra/launcher=slurm` sweeps
# (tests/test_sweeps.py, marker `slurm`) without a site cluster. Container-friendly: no
# systemd, no cgroups (proctrack/linuxproc, task/none), state and logs under one folder.
#   sudo bash scripts/slurm_local.sh start    # install (apt) if missing, configure, start, wait idle
#   sudo bash scripts/slurm_local.sh status   # sinfo; exit 0 iff the node answers
#   sudo bash scripts/slurm_local.sh stop     # stop the daemons this script started (pid files)
# Idempotent: `start` on a running cluster only checks it (and restarts it if slurm.conf
# changed). Needs root (daemons, apt-get).
# No slurmdbd: `sacct` is unavailable (accounting_storage/none); finished jobs are in
# $ATLAS_SLURM_DIR/log/jobcomp.txt and, for MinJobAge seconds, in `scontrol show job`.
# Env: ATLAS_SLURM_DIR (default /tmp/atlas-slurm), ATLAS_SLURM_CONF (default
# /etc/slurm/slurm.conf; a slurm.conf we did not write is never overwritten).
set -euo pipefail

D=${ATLAS_SLURM_DIR:-/tmp/atlas-slurm}
CONF=${ATLAS_SLURM_CONF:-/etc/slurm/slurm.conf}
MARK="# atlas-local-slurm: written by scripts/slurm_local.sh"
MUNGE_SOCKET_DIR=/run/munge
CHANGED=0
export SLURM_CONF=$CONF

say() { echo "[slurm_local] $*"; }
die() { echo "[slurm_local] error: $*" >&2; exit 1; }

need_root() {
  [ "$(id -u)" = 0 ] || die "must run as root (it installs packages and starts daemons); try: sudo bash $0 $1"
}

install_packages() {
  if command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null \
     && command -v sinfo >/dev/null; then
    return
  fi
  command -v apt-get >/dev/null || die "slurm-wlm/munge missing and no apt-get: install SLURM >= 20.11 and munge by hand"
  say "installing slurm-wlm and munge (apt-get, about a minute)"
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge) \
    >"/tmp/atlas-slurm-apt.log" 2>&1 || die "apt-get install slurm-wlm munge failed, see /tmp/atlas-slurm-apt.log"
}

write_conf() {
  if [ -f "$CONF" ] && ! grep -qF "$MARK" "$CONF"; then
    die "$CONF exists and was not written by this script; move it away or set ATLAS_SLURM_CONF=<other path>"
  fi
  local cpus mem
  cpus=$(nproc --all)
  # slurmd refuses a node that claims more memory than it has: leave ~5% slack
  mem=$(awk '/MemTotal/ {printf "%d", $2 / 1024 * 0.95}' /proc/meminfo)
  mkdir -p "$D/state" "$D/spool" "$D/log" "$(dirname "$CONF")"
  cat >"$CONF.tmp" <<EOF
$MARK
# One node (this machine, called localhost), one partition 'debug'. Regenerated on each start.
ClusterName=atlaslocal
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
# A requeued job may start again cred_expire+1 s after the requeue (default 120 s); short
# here so pre-emption tests take seconds. Fine on one node; leave the default on real clusters.
AuthInfo=cred_expire=10
CredType=cred/munge
MpiDefault=none
# No cgroups: containers rarely expose a writable cgroup tree.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$D/log/jobcomp.txt
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2
ReturnToService=2
# Keep finished jobs visible to scontrol for 10 minutes (no sacct without slurmdbd).
MinJobAge=600
# Seconds between SIGTERM and SIGKILL when a job hits its time limit.
KillWait=10
InactiveLimit=0
SlurmctldTimeout=60
SlurmdTimeout=60
StateSaveLocation=$D/state
SlurmdSpoolDir=$D/spool
SlurmctldPidFile=$D/slurmctld.pid
SlurmdPidFile=$D/slurmd.pid
SlurmctldLogFile=$D/log/slurmctld.log
SlurmdLogFile=$D/log/slurmd.log
NodeName=localhost NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
EOF
  if cmp -s "$CONF.tmp" "$CONF"; then rm -f "$CONF.tmp"; else mv "$CONF.tmp" "$CONF"; CHANGED=1; fi
}

alive() {  # alive <pidfile>: the process in the pid file is running
  [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null
}

start_munge() {
  if munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; then
    return
  fi
  if [ ! -s /etc/munge/munge.key ]; then
    say "creating a munge key"
    mkdir -p /etc/munge
    if command -v mungekey >/dev/null; then mungekey --create --force --keyfile=/etc/munge/munge.key
    else dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none; fi
  fi
  mkdir -p "$MUNGE_SOCKET_DIR" /var/lib/munge /var/log/munge
  chown munge:munge /etc/munge /etc/munge/munge.key "$MUNGE_SOCKET_DIR" /var/lib/munge /var/log/munge
  chmod 0700 /etc/munge
  chmod 0400 /etc/munge/munge.key
  chmod 0755 "$MUNGE_SOCKET_DIR"
  say "starting munged"
  runuser -u munge -- /usr/sbin/munged --force
  for _ in $(seq 50); do
    munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1 && return
    sleep 0.2
  done
  die "munged did not answer; see /var/log/munge/munged.log"
}

node_state() {
  sinfo -h -N -n localhost -o '%T' 2>/dev/null | head -1 || true
}

cmd_start() {
  need_root start
  install_packages
  local was_up=0
  alive "$D/slurmctld.pid" && alive "$D/slurmd.pid" && was_up=1
  write_conf
  if [ "$CHANGED" = 1 ] && [ "$was_up" = 1 ]; then
    # a restart, not `scontrol reconfigure`: some settings (AuthInfo) are read only at start
    say "slurm.conf changed: restarting the daemons"
    stop_daemons
  fi
  start_munge
  if ! alive "$D/slurmctld.pid"; then
    say "starting slurmctld (log $D/log/slurmctld.log)"
    /usr/sbin/slurmctld -f "$CONF" || die "slurmctld failed to start; see $D/log/slurmctld.log"
  fi
  if ! alive "$D/slurmd.pid"; then
    say "starting slurmd (log $D/log/slurmd.log)"
    /usr/sbin/slurmd -f "$CONF" -N localhost || die "slurmd failed to start; see $D/log/slurmd.log"
  fi
  local state=""
  for _ in $(seq 60); do
    state=$(node_state)
    case "$state" in
      idle|mixed|allocated|completing) say "up: node localhost is $state"; return ;;
      down*|drain*) scontrol update NodeName=localhost State=RESUME >/dev/null 2>&1 || true ;;
    esac
    sleep 1
  done
  die "node localhost not idle after 60 s (state '${state:-no answer}'); see $D/log/slurmctld.log and $D/log/slurmd.log"
}

stop_daemons() {
  local f pid
  for f in "$D/slurmd.pid" "$D/slurmctld.pid"; do
    if alive "$f"; then
      pid=$(cat "$f")
      say "stopping $(basename "$f" .pid) (pid $pid)"
      kill "$pid"
      for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
      kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
    fi
    rm -f "$f"
  done
}

cmd_stop() {
  need_root stop
  stop_daemons
  # munged is left running on purpose: other tools on the machine may use it.
  say "stopped"
}

cmd_status() {
  command -v sinfo >/dev/null || { say "not installed"; exit 1; }
  local state
  state=$(node_state)
  if [ -z "$state" ]; then say "down (sinfo gets no answer)"; exit 1; fi
  sinfo
  case "$state" in idle|mixed|allocated|completing) exit 0 ;; *) exit 1 ;; esac
}

case "${1:-}" in
  start) cmd_start ;;
  stop) cmd_stop ;;
  status) cmd_status ;;
  *) die "usage: $0 {start|stop|status}" ;;
esac
