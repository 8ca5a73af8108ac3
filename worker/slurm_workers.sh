#!/usr/bin/env bash
# A master-worker job on a SLURM allocation: one mwrt worker daemon per node, and your
# script, the master, on the first node (where sbatch runs this file).
#
#   sbatch --nodes=4 --gres=gpu:8 worker/slurm_workers.sh train.py [ARGS...]
#
# The daemons announce themselves in a directory every node sees (MWRT_RUN_DIR, default
# ~/.mwrt/job-$SLURM_JOB_ID), and init_master_worker() in the script waits for all of them
# there: no addresses to type. A fresh key pair per job admits only this job's master.
#SBATCH --job-name=mwrt
#SBATCH --ntasks-per-node=1
set -euo pipefail
RUN=${MWRT_RUN_DIR:-$HOME/.mwrt/job-$SLURM_JOB_ID}
PORT=${MWRT_PORT:-7070}
PYTHON=${PYTHON:-python3}
mkdir -p "$RUN"
mwrt-worker keygen "$RUN/keys" >/dev/null
export MWRT_REGISTRY=$RUN/workers MWRT_NUM_WORKERS=$SLURM_NNODES
srun --ntasks-per-node=1 --kill-on-bad-exit=1 \
  mwrt-worker --listen "0.0.0.0:$PORT" --key-file "$RUN/keys/worker.key" --register "$MWRT_REGISTRY" &
workers=$!
trap 'code=$?; kill "$workers" 2>/dev/null; wait "$workers" 2>/dev/null || true; rm -rf "$RUN"; exit $code' EXIT
MWRT_KEY_FILE=$RUN/keys/master.key "$PYTHON" "$@"
