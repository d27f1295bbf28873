#!/bin/bash
# Hermes Table III in simulation, in the paper's setting (docs/simulation.md#hermes-table-iii-in-simulation):
# 12 Table II workers, the paper's MNIST CNN compute charged (cnn:1x28x28, 114,314 parameters) while the mnist1d
# CNN of the same size trains, DSS 2500 and MBS 16 (Hermes Fig. 12's first sizes), one seed, at most 65 virtual s.
#   benchmarks/sim_table3_paper.sh [OUT]     then: python benchmarks/sim_table3_paper.py OUT
OUT=${1:-runs/t3}
mkdir -p "$OUT"
T=(--population table2 --dataset mnist1d --set num_samples=20000 --set 'model_kwargs={"hidden":320}'
   --charge-model cnn:1x28x28 --set cycle_samples=2500 --set batch_size=16 --set eval_interval_seconds=1.0
   --target-accuracy 0.9 --seed 0 --quiet)
run() { # label preset max-seconds extra...
  l=$1; p=$2; m=$3; shift 3
  [ -f "$OUT/$l/summary.json" ] && return
  echo "== $l $(date -u +%T) $(uptime)" >> "$OUT/log.txt"
  nice -n 15 python -m hermes.sim.cli "${T[@]}" --preset "$p" --max-seconds "$m" --out "$OUT/$l" "$@" >> "$OUT/log.txt" 2>&1
  echo "   done $l $(date -u +%T) $(uptime)" >> "$OUT/log.txt"
}
run bsp bsp 65
run hermes-paper hermes-paper 65
run asp asp 65
run hermes-paper-a1.6-b0.15 hermes-paper 65 --set zscore.alpha=-1.6 --set zscore.beta=0.15
run hermes-paper-a0.9-b0.1 hermes-paper 65 --set zscore.alpha=-0.9 --set zscore.beta=0.1
run ssp ssp 65 --set ssp.staleness=125
run hermes hermes 65
run ebsp ebsp 65 --set ebsp.lookahead=150
