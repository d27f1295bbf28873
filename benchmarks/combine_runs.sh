#!/bin/bash
# benchmarks/combine_runs.sh NAME SRC:K ...: one folder of symlinked run folders, SRC's r0 as rK (edge_table.py reads
# OUT/runs/CELL/LABEL/rN; each invocation ran --seed K --repeats 1, which names its folder r0)
cd "$(dirname "$0")/.."; NAME=$1; shift; rm -rf runs/$NAME
for pair in "$@"; do src=${pair%:*}; k=${pair#*:}
  for d in runs/$src/runs/*/*/r0; do
    cell_label=${d#runs/$src/runs/}; cell_label=${cell_label%/r0}
    mkdir -p runs/$NAME/runs/$cell_label; ln -sfn $PWD/$d runs/$NAME/runs/$cell_label/r$k; done; done
