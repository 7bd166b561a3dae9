# shellcheck shell=bash
# Sourced by every slurm/*.sbatch script, at the top of the job, on the job's first node.
#
# Nothing here is specific to one cluster: partitions, accounts, GPU counts and time limits come from sbatch options
# (on the command line or in the #SBATCH lines, which the command line overrides); software set-up comes from the
# environment that sbatch exports (by default the submitting shell's), or from a file named by COURSEKIT_SETUP.
#
# Knobs (all optional; environment variables of the submitting shell):
#   COURSEKIT_SETUP      a bash file sourced first on every job, e.g. `module load cuda; source ~/venv/bin/activate`
#   COURSEKIT_REPO       the repository checkout (default: the folder sbatch was run from, $SLURM_SUBMIT_DIR)
#   COURSEKIT_RUN_DIR    where this job writes results, traces and hostfiles (default: $COURSEKIT_REPO/runs/NAME-JOBID)
#   COURSEKIT_RESULTS_DIR  per-rank JSON results (default: $COURSEKIT_RUN_DIR/results)
#   COURSEKIT_NPROC_PER_NODE  processes per node (default: GPUs allocated on the node, $SLURM_GPUS_ON_NODE, else 1)
#   COURSEKIT_DEVICE=cpu run everything on CPU with gloo (tests on a machine without GPUs); nothing else changes
#   PYTHON               the interpreter (default: python from PATH)
#   MASTER_ADDR / MASTER_PORT  rendezvous host and port (default: first node of the allocation, 20000 + JOBID % 20000,
#                        the same rule coursekit.dist uses, so two jobs sharing a node do not collide)

if [[ -n ${COURSEKIT_SETUP:-} ]]; then
  # shellcheck source=/dev/null
  source "$COURSEKIT_SETUP"
fi

COURSEKIT_REPO=${COURSEKIT_REPO:-${SLURM_SUBMIT_DIR:-$PWD}}
PYTHON=${PYTHON:-python}
JOB_ID=${SLURM_ARRAY_JOB_ID:-$SLURM_JOB_ID}
export COURSEKIT_RUN_DIR=${COURSEKIT_RUN_DIR:-$COURSEKIT_REPO/runs/${SLURM_JOB_NAME:-job}-$JOB_ID}
export COURSEKIT_RESULTS_DIR=${COURSEKIT_RESULTS_DIR:-$COURSEKIT_RUN_DIR/results}
mkdir -p "$COURSEKIT_RUN_DIR" "$COURSEKIT_RESULTS_DIR"
cd "$COURSEKIT_REPO" || exit 1

# Rendezvous: the first host of the allocation (scontrol expands "gpu[01-04]" to gpu01 ... gpu04).
HEAD_NODE=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
export MASTER_ADDR=${MASTER_ADDR:-$HEAD_NODE}
export MASTER_PORT=${MASTER_PORT:-$((20000 + SLURM_JOB_ID % 20000))}
NPROC_PER_NODE=${COURSEKIT_NPROC_PER_NODE:-${SLURM_GPUS_ON_NODE:-1}}
NNODES=${SLURM_JOB_NUM_NODES:-${SLURM_NNODES:-1}}

# Slurm 22.05-23.02 srun does not inherit --cpus-per-task from sbatch: pass it on explicitly (harmless elsewhere).
if [[ -n ${SLURM_CPUS_PER_TASK:-} ]]; then
  export SRUN_CPUS_PER_TASK=$SLURM_CPUS_PER_TASK
fi
# One process per GPU shares the task's CPUs; torch would otherwise start one thread per core in every process.
if [[ -z ${OMP_NUM_THREADS:-} ]]; then
  OMP_NUM_THREADS=$(( ${SLURM_CPUS_PER_TASK:-1} / NPROC_PER_NODE ))
  export OMP_NUM_THREADS=$(( OMP_NUM_THREADS > 0 ? OMP_NUM_THREADS : 1 ))
fi
export PYTHONUNBUFFERED=1  # lines reach the job's output file as they are printed

# ---- NCCL: what the communication library does ------------------------------------------------------------------
# WARN prints only problems. INFO shows, per rank, the NCCL version, which network it picked (look for
# "NET/IB" versus "NET/Socket": a multi-node job on Socket over a slow NIC is the classic 10x slowdown), the
# rings/trees it built and the P2P/SHM transports inside a node. TRACE logs every call (huge).
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}
# export NCCL_DEBUG_SUBSYS=INIT,NET,GRAPH      # narrow INFO down to initialisation, network and topology
# export NCCL_DEBUG_FILE=$COURSEKIT_RUN_DIR/nccl.%h.%p.log   # one file per host and process instead of stderr
# Network selection is cluster-specific, so it is only documented here; ask the admins or read `ibv_devinfo`:
# export NCCL_SOCKET_IFNAME=ib0               # interface for bootstrap and the socket transport (^lo,docker0 excludes)
# export NCCL_IB_HCA=mlx5_0,mlx5_1            # which InfiniBand/RoCE adapters to use (=^mlx5_2 excludes one)
# export NCCL_IB_DISABLE=1                    # no InfiniBand: tells an IB fault from anything else (slow, but runs)
# export NCCL_IB_GID_INDEX=3                  # RoCE v2 needs the right GID index
# export NCCL_IB_TIMEOUT=22                   # raise on large or lossy fabrics ("NCCL WARN NET/IB : Got completion
#                                             # ... error 12": retry timeout)
# export NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1  # isolate intra-node transport problems (NVLink/PCIe, /dev/shm)

# ---- PyTorch c10d: turn hangs into errors, and keep evidence ------------------------------------------------------
# On a collective timeout or NCCL error the watchdog tears the process down (3 = without aborting the
# communicators; torch's default since 2.2, set here so older versions behave the same). Slurm then sees the job
# fail, which is what lets slurm/requeue.sbatch requeue it, instead of a job hanging until its time limit.
export TORCH_NCCL_ASYNC_ERROR_HANDLING=${TORCH_NCCL_ASYNC_ERROR_HANDLING:-3}
# Flight recorder: a ring buffer of the last N collectives per rank (op, sizes, sequence number, state, Python
# stack). On a timeout every rank dumps it to TORCH_FR_DUMP_TEMP_FILE<rank>; compare them with
#   python -m torch.distributed.flight_recorder.fr_trace $COURSEKIT_RUN_DIR/flight-recorder/  (or `torchfrtrace`)
# to see which rank never joined which collective. (Older torch names: TORCH_NCCL_TRACE_BUFFER_SIZE and
# TORCH_NCCL_DEBUG_INFO_TEMP_FILE.)
export TORCH_FR_BUFFER_SIZE=${TORCH_FR_BUFFER_SIZE:-2000}
export TORCH_NCCL_DUMP_ON_TIMEOUT=${TORCH_NCCL_DUMP_ON_TIMEOUT:-1}
export TORCH_FR_DUMP_TEMP_FILE=${TORCH_FR_DUMP_TEMP_FILE:-$COURSEKIT_RUN_DIR/flight-recorder/rank_}
mkdir -p "$(dirname "$TORCH_FR_DUMP_TEMP_FILE")"
# More, when hunting a bug (all slow down training):
# export TORCH_DISTRIBUTED_DEBUG=DETAIL       # checks that ranks call the same collectives with the same shapes
# export TORCH_NCCL_DESYNC_DEBUG=1            # on a timeout, names the rank that is behind
# export TORCH_NCCL_BLOCKING_WAIT=1           # make wait() block and raise on timeout in the calling thread
# export TORCH_NCCL_ENABLE_MONITORING=1 TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC=600  # kill a stuck watchdog
# export TORCH_CPP_LOG_LEVEL=INFO TORCH_SHOW_CPP_STACKTRACES=1
# export CUDA_LAUNCH_BLOCKING=1               # report a CUDA error at the op that caused it (very slow)

ck_banner() {
  # One block at the top of the job's output: what ran where, so a log is readable on its own.
  echo "== coursekit job ${SLURM_JOB_NAME:-?} ${SLURM_JOB_ID}${SLURM_ARRAY_TASK_ID:+ (array task $SLURM_ARRAY_TASK_ID)}" \
    "attempt ${SLURM_RESTART_COUNT:-0} on $NNODES node(s): $SLURM_JOB_NODELIST"
  echo "   processes/node=$NPROC_PER_NODE master=$MASTER_ADDR:$MASTER_PORT device=${COURSEKIT_DEVICE:-auto}" \
    "python=$(command -v "$PYTHON")"
  echo "   run dir=$COURSEKIT_RUN_DIR  NCCL_DEBUG=$NCCL_DEBUG TORCH_FR_BUFFER_SIZE=$TORCH_FR_BUFFER_SIZE"
}

ck_program() {
  # The program is the script's arguments (python's: "-m module args..." or "file.py args...");
  # with none, the check job python -m coursekit.dist.
  # shellcheck disable=SC2034  # PROGRAM is used by the sbatch script that sources this file
  if (($# == 0)); then
    PROGRAM=(-m coursekit.dist)
  else
    PROGRAM=("$@")
  fi
}
