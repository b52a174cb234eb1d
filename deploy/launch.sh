#!/usr/bin/env bash
# Supervisor-facing launcher for a ddtree-engine job (systemd, Kubernetes, Slurm): starts
#   mpirun -np N [mpirun options] ddtree-rank [ddtree-rank options]
# and turns the supervisor's SIGTERM / SIGINT into a graceful drain. mpirun itself would turn SIGTERM into
# a kill of every rank; SIGUSR1, which mpirun forwards, makes rank 0 refuse new requests, finish the running
# ones and end the job with exit 0. If the drain takes longer than DRAIN_TIMEOUT_S (default 60), the job is
# terminated (SIGTERM to mpirun, then SIGKILL after 10 s). Exits with the job's status.
#
# usage: deploy/launch.sh -np N [--hostfile F] [other mpirun options] -- ddtree-rank options...
#   env: DDTREE_RANK (the ddtree-rank binary; default build/bin/ddtree-rank), DRAIN_TIMEOUT_S
# e.g.  deploy/launch.sh -np 8 --hostfile hosts -- --model /models/kimi --listen 0.0.0.0:50051
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
rank_bin=${DDTREE_RANK:-$root/build/bin/ddtree-rank}
mpi_args=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do mpi_args+=("$1"); shift; done
[ "${1:-}" = "--" ] || { echo "usage: deploy/launch.sh [mpirun options] -- ddtree-rank options" >&2; exit 2; }
shift
[ -x "$rank_bin" ] || { echo "launch.sh: $rank_bin is not built (set DDTREE_RANK)" >&2; exit 2; }
[ "$(id -u)" -eq 0 ] && mpi_args+=(--allow-run-as-root)

mpirun "${mpi_args[@]}" "$rank_bin" "$@" &
job=$!
drained=0
drain() {
  echo "launch.sh: draining the job (SIGUSR1 to mpirun, timeout ${DRAIN_TIMEOUT_S:-60} s)" >&2
  kill -USR1 "$job" 2>/dev/null
  local waited=0
  while kill -0 "$job" 2>/dev/null && [ $waited -lt $(( ${DRAIN_TIMEOUT_S:-60} * 10 )) ]; do
    sleep 0.1
    waited=$((waited + 1))
  done
  if kill -0 "$job" 2>/dev/null; then
    echo "launch.sh: drain timed out; terminating the job" >&2
    kill -TERM "$job" 2>/dev/null
    for _ in $(seq 100); do kill -0 "$job" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$job" 2>/dev/null
  fi
  wait "$job"  # reap it here: the main `wait` below was interrupted by this signal
  rc=$?
  drained=1
}
trap drain TERM INT
rc=0
wait "$job"
status=$?
[ "$drained" = 1 ] || rc=$status
exit "$rc"
