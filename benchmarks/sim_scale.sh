#!/bin/bash
# Scale runs of hermes-sim (issue 27; docs/simulation.md, "Scale"): generated devices with churn, mnist1d to 0.9,
# one process and one torch thread per run, ONE RUN AT A TIME (each under $LOCK when set, e.g. the machine's
# sim lock), each run's wall time, virtual seconds, messages and peak RSS (/usr/bin/time -v) with the load
# average before and after it.
#
#   LOCK=/work/locks/sim.lock OUT=runs/sim-scale benchmarks/sim_scale.sh goal|table|growth|RUN...
#
#   goal    fedbuff and hermes on 1,000 devices to 0.9; fedbuff on 10,000
#   table   the 1,000-device table: hermes, fedbuff, fedasync, bsp, and the fastest device alone
#   growth  fedbuff on 100, 1,000, 10,000 devices to 0.9 and 100,000 for a bounded 10 virtual seconds
#   bounded fedbuff on 1,000, 10,000 and 100,000 devices for 10 virtual seconds each (fedbuff-N-b10)
#   RUN     one of the names below (e.g. fedbuff-1000; hermes-1000-c10: hermes with C = 10, the goal run)
#
# Every asynchronous run bounds concurrency (concurrency.limit, FedBuff's C) at $C (default 100): unbounded,
# fedbuff on 1,000 devices collapsed (docs/simulation.md). A run name ending in -nohold sets
# concurrency.hold_pull=false (a registration's pull answered at once, before the device waits for a slot).
# Runs are one torch thread (OMP_NUM_THREADS=1; hermes-sim sets torch's itself).
set -u
OUT=${OUT:-runs/sim-scale}
PY=${PY:-python}
C=${C:-100}
LIMIT=${LIMIT:-2400}  # wall seconds a run may take before it is killed (a run normally ends at its target)
EVAL=${EVAL:-1}  # eval_interval_seconds (virtual): the resolution of every time to target (the table: 0.25)
C_EXTRA=()
mkdir -p "$OUT"

one() {  # name devices preset max_virtual_s [extra hermes-sim args...]
  local name=$1 n=$2 preset=$3 budget=$4; shift 4
  local out="$OUT/$name"
  if [ -e "$out/summary.json" ]; then echo "== $name: done before ($out)"; return; fi
  rm -rf "$out"
  local lock=()
  [ -n "${LOCK:-}" ] && lock=(flock -w "${LOCK_WAIT:-1900}" "$LOCK")
  echo "== $name: $(date -u +%FT%TZ) load before: $(cut -d' ' -f1-3 /proc/loadavg)"
  OMP_NUM_THREADS=1 "${lock[@]}" /usr/bin/time -v -o "$out.time" timeout "$LIMIT" "$PY" -m hermes.sim.cli --quiet --population generated \
    --devices "$n" --preset "$preset" --dataset mnist1d --target-accuracy 0.9 --max-seconds "$budget" --seed 0 \
    --set eval_interval_seconds="$EVAL" --out "$out" "$@" "${C_EXTRA[@]}" > "$out.log" 2>&1
  echo "   rc $? $(date -u +%FT%TZ) load after: $(cut -d' ' -f1-3 /proc/loadavg)"
  "$PY" - "$out" <<'PYEOF'
import json, re, sys
out = sys.argv[1]
rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", open(out + ".time").read())
try:
    s = json.load(open(out + "/summary.json"))
except OSError:
    print("   no summary.json (killed at the wall limit?)", "peak RSS MB", rss and int(rss.group(1)) // 1024)
    sys.exit()
cycles = sum((w.get("device") or {}).get("cycles", 0) for w in s["workers"])
mem = s.get("sim", {}).get("device_memory") or {}
print(f"   reached {s['reached_target']} to_target {s['seconds_to_target']} virtual {s['virtual_seconds']:.1f} "
      f"wall {s['wall_seconds']:.1f} messages {s['messages_total']} acc {s['final_accuracy']} "
      f"updates {s.get('model_updates')} cycles {cycles} peak_rss_MB {rss and int(rss.group(1)) // 1024}")
if mem:
    print("   device memory at", mem["at_virtual_s"], "virtual s:", {k: (mem[k]["devices"], mem[k]["with_version"],
          mem[k]["bytes_per_device"]) for k in ("training", "waiting", "idle")}, "versions", mem["versions_held"])
PYEOF
}

run() {
  C_EXTRA=()
  case $1 in *-nohold) C_EXTRA=(--set concurrency.hold_pull=false) ;; esac
  local name=$1
  set -- "${1%-nohold}"
  case $1 in
    fedbuff-100) one "$name" 100 fedbuff 600 --set concurrency.limit="$C" ;;
    fedbuff-1000) one "$name" 1000 fedbuff 600 --set concurrency.limit="$C" ;;
    hermes-1000) one "$name" 1000 hermes 600 --set concurrency.limit="$C" ;;
    hermes-1000-c10) one "$name" 1000 hermes 60 --set concurrency.limit=10 ;;  # C = 2m (docs: Hermes at 1,000 devices)
    fedasync-1000) one "$name" 1000 fedasync 600 --set concurrency.limit="$C" ;;
    bsp-1000) one "$name" 1000 bsp 600 ;;
    alone-1000) one "$name" 1000 asp 3600 --alone ;;
    alone-hermes-1000) one "$name" 1000 hermes 3600 --alone ;;
    alone-best-1000) one "$name" 1000 asp 3600 --alone --set momentum=0.9 --set lr=0.1 ;;  # alone's best (docs)
    bsp-1000-b20) one "$name" 1000 bsp 20 ;;  # bounded: 20 virtual s
    fedbuff-10000) one "$name" 10000 fedbuff 600 --set concurrency.limit="$C" ;;
    fedbuff-100000) one "$name" 100000 fedbuff 20 --set concurrency.limit="$C" ;;
    fedbuff-*-b10) n=${1#fedbuff-}; one "$name" "${n%-b10}" fedbuff 10 --set concurrency.limit="$C" ;;  # bounded: 10 virtual s
    fedbuff-*-b2) n=${1#fedbuff-}; one "$name" "${n%-b2}" fedbuff 2 --set concurrency.limit="$C" ;;  # bounded: 2 virtual s
    fedbuff-1000-unbounded) one "$name" 1000 fedbuff 60 ;;
    *) echo "unknown run $1"; exit 2 ;;
  esac
}

for what in "${@:-goal}"; do
  case $what in
    goal) for r in fedbuff-1000 hermes-1000 fedbuff-10000; do run $r; done ;;
    table) for r in hermes-1000 fedbuff-1000 fedasync-1000 bsp-1000-b20 alone-best-1000 alone-1000 alone-hermes-1000; do
             run $r; done ;;
    growth) for r in fedbuff-10000 fedbuff-100000-b10 fedbuff-1000 fedbuff-100; do run $r; done ;;
    bounded) for r in fedbuff-1000-b10 fedbuff-10000-b10 fedbuff-100000-b10; do run $r; done ;;
    *) run "$what" ;;
  esac
done
