#!/usr/bin/env bash
# Start one mwrt worker daemon per allocated node and print their addresses.
#   sbatch --nodes=4 --gres=gpu:8 worker/slurm_workers.sh
# The master then connects with MWRT_WORKERS=<printed list> MWRT_KEY_FILE=master.key.
#SBATCH --job-name=mwrt-workers
#SBATCH --ntasks-per-node=1
set -euo pipefail
PORT=${MWRT_PORT:-7070}
KEY=${MWRT_WORKER_KEY:-$HOME/mwrt-keys/worker.key}
nodes=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed "s/\$/:$PORT/" | paste -sd, -)
echo "MWRT_WORKERS=$nodes"
# Each task listens on its own node's address; the daemons stop when the job ends.
srun --ntasks-per-node=1 bash -c \
  'exec mwrt-worker --listen "$(hostname -I | cut -d" " -f1):'"$PORT"'" --key-file '"$KEY"
