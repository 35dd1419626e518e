#!/bin/sh
# Naive Slurm prolog/epilog, kept only as a yardstick for bench/slurm_hooks.py.
# Do NOT deploy it: it appends and edits the dcgm-exporter mapping files in place
# (a scrape can read a half-written or briefly missing file), takes no lock (two
# jobs on one GPU can lose each other's id), validates nothing, and its exit
# status is whatever the last command returned.
#
# usage: naive_slurm_hook.sh prolog|epilog
# env:   MAPPING_DIR, TEXTFILE_DIR and the usual SLURM_JOB_* variables.

IFS=,
if [ "$1" = prolog ]; then
    for g in $SLURM_JOB_GPUS; do
        echo "$SLURM_JOB_ID" >>"$MAPPING_DIR/$g"
    done
    cat >"$TEXTFILE_DIR/hpcobs_slurm_job_$SLURM_JOB_ID.prom" <<EOF
# TYPE hpcobs_slurm_job_info gauge
hpcobs_slurm_job_info{hpc_job="$SLURM_JOB_ID",user="$SLURM_JOB_USER",account="$SLURM_JOB_ACCOUNT",partition="$SLURM_JOB_PARTITION"} 1
EOF
else
    for g in $SLURM_JOB_GPUS; do
        sed -i "/^$SLURM_JOB_ID\$/d" "$MAPPING_DIR/$g"
    done
    rm -f "$TEXTFILE_DIR/hpcobs_slurm_job_$SLURM_JOB_ID.prom"
fi
