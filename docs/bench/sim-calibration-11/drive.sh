#!/bin/bash
cd /work/wt/calq
T=runs/cal11-tb/tb.sh; S=runs/cal11-tb/sim.sh
for s in 0 1 2; do $T lte-hp3-s$s lte hermes-paper 1 $s 400; done
$S lte/hermes-paper --max-seconds 400
for s in 0 1 2; do $T lan-hp3-s$s lan hermes-paper 1 $s 400; done
$S lan/hermes-paper --max-seconds 400
$T lte-hermes3 lte hermes 3 0 180
$T lan-hermes3 lan hermes 3 0 180
$S lte/hermes,lan/hermes
$T lte-bsp3 lte bsp 3 0 300
$T lan-bsp3 lan bsp 3 0 300
$S lte/bsp,lan/bsp
$T lan-fedbuff3 lan fedbuff 3 0 300
$T lan-asp3 lan asp 3 0 300
$S lan/fedbuff,lan/asp
for s in 0 1 2; do $T lte-asp3-s$s lte asp 1 $s 400; done
$S lte/asp
for s in 0 1 2; do $T lte-fedbuff3-s$s lte fedbuff 1 $s 500; done
$S lte/fedbuff
echo "$(date -u +%FT%TZ) ALL DONE" >> runs/cal11-tb/lock-load.log
