#!/bin/bash
# Hermes Table III in simulation, in the paper's setting (docs/simulation.md#hermes-table-iii-in-simulation):
# 12 Table II workers, the paper's MNIST CNN compute charged (cnn:1x28x28, 114,314 parameters) while the mnist1d
# CNN of the same size trains on mnist1d 200k to a high target (many BSP rounds, as the paper's 800), DSS 2500 and
# MBS 16 (Hermes Fig. 12's first sizes), plain SGD at lr 0.1 for every framework (Table I; our `hermes` preset's
# momentum 0.9 is overridden too), one seed. Each cell one hermes-sim process, one torch thread, under the sim
# lock, at most WALL s of wall time (default 480; a cell it stops has events but no summary).
#   benchmarks/sim_table3_paper.sh OUT [LABEL...]     then: python benchmarks/sim_table3_paper.py OUT
OUT=${1:-runs/t3}; shift
TARGET=${TARGET:-0.97}; MAXS=${MAXS:-400}; WALL=${WALL:-480}
mkdir -p "$OUT"
T=(--population table2 --dataset mnist1d --set num_samples=200000 --set 'model_kwargs={"hidden":320}'
   --charge-model cnn:1x28x28 --set cycle_samples=2500 --set batch_size=16 --set lr=0.1 --set momentum=0.0
   --set eval_interval_seconds=2.0 --set eval_max_samples=10000
   --target-accuracy "$TARGET" --seed 0 --quiet)
run() { # label preset extra...
  l=$1; p=$2; shift 2
  [ -f "$OUT/$l/summary.json" ] && return
  echo "== $l $(date -u +%FT%TZ) $(uptime)" >> "$OUT/log.txt"
  OMP_NUM_THREADS=1 flock -w 900 /work/locks/sim.lock timeout "$WALL" \
    python -m hermes.sim.cli "${T[@]}" --preset "$p" --max-seconds "$MAXS" --out "$OUT/$l" "$@" >> "$OUT/log.txt" 2>&1
  echo "   done $l rc=$? $(date -u +%FT%TZ) $(uptime)" >> "$OUT/log.txt"
}
cell() { # label -> preset and overrides
  case $1 in
    bsp) run bsp bsp ;;
    hermes-paper) run hermes-paper hermes-paper ;;
    hermes-paper-a1.6-b0.15) run "$1" hermes-paper --set zscore.alpha=-1.6 --set zscore.beta=0.15 ;;
    hermes-paper-a0.9-b0.1) run "$1" hermes-paper --set zscore.alpha=-0.9 --set zscore.beta=0.1 ;;
    asp) run asp asp ;;
    ssp) run ssp ssp --set ssp.staleness=125 ;;
    ebsp) run ebsp ebsp --set ebsp.lookahead=150 ;;
    hermes) run hermes hermes ;;
  esac
}
LABELS=("$@"); [ ${#LABELS[@]} -eq 0 ] && LABELS=(bsp hermes-paper hermes-paper-a1.6-b0.15 hermes-paper-a0.9-b0.1 asp ssp ebsp hermes)
for l in "${LABELS[@]}"; do cell "$l"; done
