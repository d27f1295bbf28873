#!/bin/bash
# a second quiet set, after the table: lte hermes x 3 and lte hermes-paper seeds 0-2 again (session-to-session spread)
cd /work/wt/calq
runs/cal11-tb/tb.sh lte-hermes3b lte hermes 3 0 180
for s in 0 1 2; do runs/cal11-tb/tb.sh lte-hp3b-s$s lte hermes-paper 1 $s 400; done
echo "$(date -u +%FT%TZ) DRIVE3 DONE" >> runs/cal11-tb/lock-load.log
