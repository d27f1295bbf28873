#!/bin/bash
# 10 seeds a cell, nominal rule, bf16 as the testbed agents chose; $1 cells, $2 extra args
cd /work/wt/t12
echo 19 > /proc/self/autogroup 2>/dev/null
nice -n 19 .venv/bin/python benchmarks/sim_host_calibration.py sim --out /work/runs12/simq --cells "$1" \
  --seeds 0,1,2,3,4,5,6,7,8,9 --target 0.9 --background 0 --jitter 0 --nominal --nominal-settings 0.051602,3 \
  --precision bf16 --device-link queue:0.65 --earlier /work/main/docs/bench/sim-calibration-11/table-nominal-quiet.json:lan/asp,lan/bsp,lan/fedbuff,lan/hermes,lan/hermes-paper,lte/asp,lte/bsp,lte/fedbuff,lte/hermes,lte/hermes-paper $2
