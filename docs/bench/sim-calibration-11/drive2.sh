#!/bin/bash
# after drive.sh: lan hermes-paper again, its first three ran with the driver's autogroup at nice 15 (sim.sh's slip)
cd /work/wt/calq
while kill -0 616 2>/dev/null; do sleep 5; done
for s in 0 1 2; do runs/cal11-tb/tb.sh lan-hp3r-s$s lan hermes-paper 1 $s 400; done
echo "$(date -u +%FT%TZ) DRIVE2 DONE" >> runs/cal11-tb/lock-load.log
