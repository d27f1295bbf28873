#!/bin/bash
# usage: sim.sh CELLS [extra args] -- sims of the cells, seeds 0,1,2, under the bench lock, nice 15 (own autogroup at 15)
cd /work/wt/calq; export PATH=/work/wt/calq/.venv/bin:$PATH
CELLS=$1; shift
LOG=runs/cal11-tb/lock-load.log
flock -w 900 /work/locks/bench.lock setsid -w bash -c 'echo 15 > /proc/$$/autogroup
  s=$(date -u +%T); l0=$(cut -d" " -f1 /proc/loadavg)
  nice -n 15 python benchmarks/sim_host_calibration.py sim --out runs/sim-cal11 --cells '$CELLS' --seeds 0,1,2 \
    --target 0.9 --background 0 --jitter 0 --nominal --nominal-settings 0.051602,3 '"$*"' >> runs/sim-cal11/sim.log 2>&1
  rc=$?; e=$(date -u +%T); l1=$(cut -d" " -f1 /proc/loadavg)
  echo "SIM '$CELLS' '"$*"' lock $s load1 $l0 -> end $e load1 $l1 rc $rc" >> '$LOG'
'
