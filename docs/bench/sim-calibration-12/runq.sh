#!/bin/bash
cd /work/runs12
( ./simq.sh lte/hermes,lan/hermes; ./simq.sh lte/hermes-paper,lan/hermes-paper "--max-seconds 400"; ./simq.sh lte/asp; ./simq.sh lte/fedbuff ) > simqA.log 2>&1 &
( ./simq.sh lan/bsp,lte/bsp,lan/asp,lan/fedbuff; ./simqr.sh lte/fedbuff; ./simqr.sh lte/asp ) > simqB.log 2>&1 &
wait
