#!/usr/bin/env bash
# A real Slurm on this one machine, for tests and for trying the slurm/ scripts without a cluster.
#
#   scripts/slurm-local.sh up [DIR]     install slurm+munge if missing, write a config into DIR (default: a new
#                                       temporary folder), start munged, slurmctld and two slurmd, wait until both
#                                       nodes are idle; prints DIR. Then:  source DIR/env   (sets SLURM_CONF)
#   scripts/slurm-local.sh down DIR     stop the daemons started for DIR, by the PIDs recorded in DIR/pids
#   scripts/slurm-local.sh status DIR   which of DIR's daemons are alive, and sinfo
#   scripts/slurm-local.sh install      only install Debian's slurm and munge (apt) when missing
#
# The cluster: partition "debug" with two nodes, node1 and node2, both on 127.0.0.1 (each slurmd on its own port),
# each advertising 4 CPUs and 8 fake GPUs (gres "gpu", backed by character devices in DIR/dev) so that GPU-style
# sbatch lines (--gpus-per-node, --gres=gpu:N) are accepted. Nothing is shared with a system Slurm or munge: own
# munge key and socket, own ports (bound to 0 by the kernel, then released), own state, logs and PID files, all
# under DIR (munge's in /tmp/coursekit-munge.*, named in DIR/munge-dir, removed by down). Must run as root
# (slurmd starts job processes as the submitting user).
#
# Environment: SLURM_LOCAL_CPUS (per node, default 4), SLURM_LOCAL_GPUS (per node, default 8),
#              SLURM_LOCAL_READY_TIMEOUT (seconds to wait for idle nodes, default 60).
set -euo pipefail

NODES=(node1 node2)
CPUS=${SLURM_LOCAL_CPUS:-4}
GPUS=${SLURM_LOCAL_GPUS:-8}
READY_TIMEOUT=${SLURM_LOCAL_READY_TIMEOUT:-60}

log() { printf '[slurm-local] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

need_root() { [[ $(id -u) -eq 0 ]] || die "run as root (slurmd must be able to start jobs as any user)"; }

have_binaries() {
  command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v sbatch >/dev/null \
    && command -v munged >/dev/null && command -v mungekey >/dev/null
}

cmd_install() {
  need_root
  if have_binaries; then
    return 0
  fi
  log "installing slurm and munge from Debian (apt)"
  # Keep the packages' maintainer scripts from starting system daemons we would not own: policy-rc.d exit 101
  # means "do not start services". Only added when absent, and removed again.
  local policy=/usr/sbin/policy-rc.d
  if [[ ! -e $policy ]]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy"
    trap 'rm -f /usr/sbin/policy-rc.d' EXIT  # whatever happens below
  fi
  export DEBIAN_FRONTEND=noninteractive
  # An empty package list (fresh machine) makes install fail: update first then. A stale one (versions gone from
  # the mirror after a security update) fails the download: update and try once more.
  if ! apt-cache show slurmd >/dev/null 2>&1; then
    apt-get update -qq
  fi
  local pkgs=(slurmctld slurmd slurm-client munge)
  if ! apt-get install -y -qq --no-install-recommends "${pkgs[@]}" >/dev/null; then
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${pkgs[@]}" >/dev/null || die "apt-get install ${pkgs[*]} failed"
  fi
  have_binaries || die "slurm/munge binaries still missing after install"
}

free_port() {
  # Ask the kernel for a free TCP port (bind to 0), as in the rest of the course; released before slurm binds it.
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

ensure_hosts() {
  # Node names must resolve: torchrun's rendezvous endpoint and coursekit.dist use the first node's name.
  local n
  for n in "${NODES[@]}"; do
    if ! getent hosts "$n" >/dev/null; then
      printf '127.0.0.1 %s # added by coursekit scripts/slurm-local.sh\n' "$n" >>/etc/hosts
    fi
  done
}

write_config() {
  local dir=$1 ctld_port port1 port2 host
  host=$(hostname -s)
  ctld_port=$(free_port); port1=$(free_port); port2=$(free_port)
  while [[ $port1 == "$ctld_port" ]]; do port1=$(free_port); done
  while [[ $port2 == "$ctld_port" || $port2 == "$port1" ]]; do port2=$(free_port); done
  mkdir -p "$dir"/{state,log,pids,dev}
  # munged runs as the munge user, which may not be able to enter DIR (pytest's temporary folders are private to
  # root): its key, socket and log live in a folder of their own, recorded in DIR/munge-dir.
  MUNGE_DIR=$(mktemp -d /tmp/coursekit-munge.XXXXXX)
  echo "$MUNGE_DIR" >"$dir/munge-dir"
  local i
  for ((i = 0; i < GPUS; i++)); do
    [[ -e $dir/dev/gpu$i ]] || mknod "$dir/dev/gpu$i" c 1 3  # same major/minor as /dev/null: harmless
  done
  cat >"$dir/slurm.conf" <<EOF
# Written by scripts/slurm-local.sh: a two-node Slurm on one machine, for tests. Not for production.
ClusterName=coursekit-local
SlurmctldHost=${host}(127.0.0.1)
SlurmctldPort=${ctld_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# cred_expire: how long a job credential lives, and so how long a requeued job waits before it may start again
# (default 120 s). 10 s is plenty on one machine.
AuthInfo=socket=${MUNGE_DIR}/munge.socket,cred_expire=10
StateSaveLocation=${dir}/state
SlurmdSpoolDir=${dir}/state/slurmd-%n
SlurmctldPidFile=${dir}/pids/slurmctld.pid
SlurmdPidFile=${dir}/pids/slurmd-%n.pid
SlurmctldLogFile=${dir}/log/slurmctld.log
SlurmdLogFile=${dir}/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
# No cgroups in a container: track job processes by parent PID, no CPU binding.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
LaunchParameters=use_interactive_step
# Both "nodes" share this machine: take the node sizes from this file, not from the hardware.
SlurmdParameters=config_overrides
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
GresTypes=gpu
# No accounting database: job end states and exit codes go to a text file.
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/filetxt
JobCompLoc=${dir}/log/jobcomp.txt
# Fast turnaround for tests: forget finished jobs after 5 s (sbatch --wait polls slowly otherwise), kill 2 s after
# SIGTERM, look at pending jobs every second (a requeued job becomes eligible without any event that would wake
# the scheduler; the default pass is every 60 s).
MinJobAge=5
KillWait=2
InactiveLimit=0
SlurmdTimeout=30
SlurmctldTimeout=30
MessageTimeout=10
ReturnToService=2
JobRequeue=1
MailProg=/bin/true
SchedulerParameters=sched_interval=1,nohold_on_prolog_fail
NodeName=node1 NodeAddr=127.0.0.1 NodeHostname=node1 Port=${port1} CPUs=${CPUS} RealMemory=4096 Gres=gpu:${GPUS} State=UNKNOWN
NodeName=node2 NodeAddr=127.0.0.1 NodeHostname=node2 Port=${port2} CPUs=${CPUS} RealMemory=4096 Gres=gpu:${GPUS} State=UNKNOWN
PartitionName=debug Nodes=node[1-2] Default=YES MaxTime=60 DefaultTime=10 State=UP
EOF
  cat >"$dir/gres.conf" <<EOF
NodeName=node[1-2] Name=gpu File=${dir}/dev/gpu[0-$((GPUS - 1))]
EOF
  cat >"$dir/env" <<EOF
export SLURM_CONF=${dir}/slurm.conf
EOF
}

start_munge() {
  local dir=$1 m=$MUNGE_DIR
  # munged refuses to run as root and insists on a key and socket folder that only its user can write.
  id munge >/dev/null 2>&1 || die "no munge user (is the munge package installed?)"
  mungekey --create --keyfile="$m/munge.key" >/dev/null 2>&1 \
    || dd if=/dev/urandom of="$m/munge.key" bs=1024 count=1 status=none
  chown -R munge:munge "$m"
  chmod 0400 "$m/munge.key"
  chmod 0755 "$m"  # every user that runs slurm commands must reach the socket
  # -F: foreground, so that $! is munged's own PID (setpriv execs, runuser would stay in between).
  setsid setpriv --reuid=munge --regid=munge --init-groups -- munged -F \
    --key-file="$m/munge.key" --socket="$m/munge.socket" \
    --pid-file="$m/munged.pid" --log-file="$m/munged.log" \
    --seed-file="$m/munged.seed" --num-threads=2 </dev/null >>"$dir/log/munged.stdout" 2>&1 &
  echo $! >"$dir/pids/munged.pid"
  wait_for 10 test -S "$m/munge.socket" || die "munged did not start; see $m/munged.log"
}

wait_for() {
  # wait_for SECONDS CMD...: retry CMD every 0.2 s until it succeeds or SECONDS pass.
  local deadline=$((SECONDS + $1)); shift
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < deadline)) || return 1
    sleep 0.2
  done
}

nodes_idle() {
  local states
  states=$(sinfo -h -N -o '%N %t' 2>/dev/null) || return 1
  local n
  for n in "${NODES[@]}"; do
    grep -qE "^$n idle$" <<<"$states" || return 1
  done
}

start_slurm() {
  local dir=$1 n
  export SLURM_CONF=$dir/slurm.conf
  # -D: stay in the foreground so that $! is the daemon's own PID; -i: ignore stale state; -c: clear old jobs.
  setsid slurmctld -D -i -c -f "$SLURM_CONF" </dev/null >>"$dir/log/slurmctld.stdout" 2>&1 &
  echo $! >"$dir/pids/slurmctld.run.pid"
  wait_for 20 scontrol ping || { tail -20 "$dir/log/slurmctld.log" >&2; die "slurmctld did not answer"; }
  for n in "${NODES[@]}"; do
    setsid slurmd -D -N "$n" -f "$SLURM_CONF" </dev/null >>"$dir/log/slurmd-$n.stdout" 2>&1 &
    echo $! >"$dir/pids/slurmd-$n.run.pid"
  done
  if ! wait_for "$READY_TIMEOUT" nodes_idle; then
    sinfo -N >&2 || true
    tail -20 "$dir/log/"slurmd-*.log >&2 || true
    die "nodes not idle after ${READY_TIMEOUT}s"
  fi
}

cmd_up() {
  need_root
  local dir=${1:-}
  if [[ -z $dir ]]; then
    dir=$(mktemp -d /tmp/coursekit-slurm.XXXXXX)
  fi
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  [[ -e $dir/pids/slurmctld.run.pid ]] && alive "$dir/pids/slurmctld.run.pid" && die "already running in $dir"
  cmd_install
  ensure_hosts
  write_config "$dir"
  start_munge "$dir"
  start_slurm "$dir"
  log "ready: two idle nodes; source $dir/env  (stop: $0 down $dir)"
  echo "$dir"
}

alive() { local pid; pid=$(cat "$1" 2>/dev/null) && [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null; }

stop_pidfiles() {
  # Stop daemons by the PIDs we recorded: SIGTERM to all at once, wait up to 10 s, then SIGKILL what is left.
  local f pid pids=() i
  for f in "$@"; do
    [[ -e $f ]] || continue
    pid=$(cat "$f" 2>/dev/null) || continue
    [[ -n $pid ]] && kill -TERM "$pid" 2>/dev/null && pids+=("$pid")
    rm -f "$f"
  done
  for ((i = 0; i < 50; i++)); do
    local left=()
    for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && left+=("$pid"); done
    ((${#left[@]})) || return 0
    pids=("${left[@]}")
    sleep 0.2
  done
  kill -KILL "${pids[@]}" 2>/dev/null || true
}

queue_empty() { [[ -z $(squeue -h -o %A 2>/dev/null) ]]; }

leftover_steps() {
  # slurmstepd processes of this cluster (they inherit SLURM_CONF from our slurmd) and everything below them.
  local conf=$1 p roots=()
  for p in /proc/[0-9]*; do
    [[ $(cat "$p/comm" 2>/dev/null) == slurmstepd ]] || continue
    tr '\0' '\n' <"$p/environ" 2>/dev/null | grep -qxF "SLURM_CONF=$conf" || continue
    roots+=("${p#/proc/}")
  done
  ((${#roots[@]})) || return 0
  ps -eo pid=,ppid= | awk -v roots="${roots[*]}" '
    { parent[$1] = $2 }
    END {
      n = split(roots, r, " "); for (i = 1; i <= n; i++) keep[r[i]] = 1
      do { grew = 0; for (p in parent) if (!(p in keep) && (parent[p] in keep)) { keep[p] = 1; grew = 1 } } while (grew)
      for (p in keep) print p
    }'
}

cmd_down() {
  local dir=${1:?usage: $0 down DIR}
  [[ -d $dir/pids ]] || die "$dir has no pids/ folder: not a slurm-local folder"
  export SLURM_CONF=$dir/slurm.conf
  # Cancel whatever is still queued or running and let slurmd end the job processes (slurmstepd outlives
  # slurmd by design), so no job outlives the cluster.
  if alive "$dir/pids/slurmctld.run.pid"; then
    local ids
    mapfile -t ids < <(squeue -h -o %A 2>/dev/null)
    ((${#ids[@]} == 0)) || scancel --quiet "${ids[@]}" 2>/dev/null || true
    wait_for 15 queue_empty || log "jobs still listed after 15 s: $(squeue -h 2>&1)"
  fi
  stop_pidfiles "$dir"/pids/slurmd-*.run.pid "$dir/pids/slurmctld.run.pid"
  # A job step whose slurmd is gone never ends by itself: end what is left of this cluster's jobs.
  local left
  mapfile -t left < <(leftover_steps "$dir/slurm.conf")
  if ((${#left[@]})); then
    log "killing ${#left[@]} leftover job process(es) of this cluster: ${left[*]}"
    kill -KILL "${left[@]}" 2>/dev/null || true
  fi
  stop_pidfiles "$dir/pids/munged.pid"
  rm -f "$dir"/pids/slurmd-*.pid "$dir/pids/slurmctld.pid"
  local m
  m=$(cat "$dir/munge-dir" 2>/dev/null) || m=
  if [[ $m == /tmp/coursekit-munge.* && -d $m ]]; then
    rm -rf "$m"
  fi
  log "stopped daemons of $dir"
}

cmd_status() {
  local dir=${1:?usage: $0 status DIR} f rc=0
  for f in "$dir"/pids/*.run.pid "$dir/pids/munged.pid"; do
    [[ -e $f ]] || continue
    if alive "$f"; then echo "$(basename "$f" .pid): running (pid $(cat "$f"))"; else echo "$(basename "$f" .pid): dead"; rc=1; fi
  done
  SLURM_CONF=$dir/slurm.conf sinfo -N || rc=1
  return $rc
}

case ${1:-} in
  up) shift; cmd_up "$@" ;;
  down) shift; cmd_down "$@" ;;
  status) shift; cmd_status "$@" ;;
  install) cmd_install ;;
  *) sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
