#!/bin/bash
# usage: tb.sh NAME LINK VARIANT REPEATS SEED MAXS  -- one testbed invocation under the bench lock, normal priority
cd /work/wt/calq; export PATH=/work/wt/calq/.venv/bin:$PATH
NAME=$1 LINK=$2 VAR=$3 REP=$4 SEED=$5 MAXS=$6
LOG=runs/cal11-tb/lock-load.log
echo "$(date -u +%FT%TZ) $NAME waiting for lock (load $(cut -d' ' -f1-3 /proc/loadavg))" >> $LOG
flock -w 900 /work/locks/bench.lock bash -c '
  s=$(date -u +%T); l0=$(cut -d" " -f1 /proc/loadavg); ag=$(cat /proc/self/autogroup)
  hermes-bench run benchmarks/suites/sim-calibration.toml --out runs/cal11-tb/'$NAME' \
    --links '$LINK' --variants '$VAR' --repeats '$REP' --seed '$SEED' --max-seconds '$MAXS' \
    --slowdown-mode nominal --pace 3 --nominal-sample-ms 0.051602 > runs/cal11-tb/'$NAME'.log 2>&1
  rc=$?; e=$(date -u +%T); l1=$(cut -d" " -f1 /proc/loadavg)
  echo "TESTBED '$NAME' lock $s load1 $l0 -> end $e load1 $l1 rc $rc ($ag; loadavg at end: $(cat /proc/loadavg))" >> '$LOG'
'
