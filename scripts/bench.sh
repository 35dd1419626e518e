#!/bin/sh
# Benchmarks (make bench). Figures depend on the machine's load: run on a quiet machine and report what you saw.
#   Slurm hooks: prolog + epilog of a job on 8 GPUs, 1000 runs, p50/p99/max (target pair p99 <= 5 ms)
#   GPU simulator: scrape time for 8 GPUs x 30 fields, 100 scrapes, median/p90/max
set -eu
cd "$(dirname "$0")/.."
echo "== load average: $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) cores"
echo "== Slurm hooks (bench/slurm_hooks.py)"
python3 bench/slurm_hooks.py --runs "${RUNS:-1000}" --gpus 8
echo
echo "== GPU simulator scrape (bench/gpusim_scrape.py)"
python3 bench/gpusim_scrape.py --gpus 8 --fields 30 --scrapes 100
