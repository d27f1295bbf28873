#!/bin/bash
# benchmarks/combine_runs.sh NAME SRC:K ...: runs/NAME as one folder of symlinked run folders, runs/SRC's r0 as rK
# (benchmarks/edge_table.py reads OUT/runs/CELL/LABEL/rN; an invocation with --seed K --repeats 1 names its folder r0).
set -eu
cd "$(dirname "$0")/.."
if [ $# -lt 2 ] || [ -z "$1" ] || [[ "$1" == */* ]]; then
  echo "usage: $0 NAME SRC:K [SRC:K ...]   (NAME: a folder name under runs/)" >&2; exit 2
fi
NAME=$1; shift
# Only a folder this script made (its marker) is replaced: never a real run's results.
if [ -e "runs/$NAME" ] && [ ! -e "runs/$NAME/.combined" ]; then
  echo "runs/$NAME exists and was not made by $0: choose another NAME" >&2; exit 2
fi
rm -rf -- "runs/$NAME"
mkdir -p "runs/$NAME" && touch "runs/$NAME/.combined"
for pair in "$@"; do
  src=${pair%:*}; k=${pair#*:}
  for d in runs/"$src"/runs/*/*/r0; do
    [ -d "$d" ] || continue
    cell_label=${d#runs/$src/runs/}; cell_label=${cell_label%/r0}
    mkdir -p "runs/$NAME/runs/$cell_label"
    ln -sfn "$PWD/$d" "runs/$NAME/runs/$cell_label/r$k"
  done
done
