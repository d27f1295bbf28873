#!/bin/bash
# Scale runs of hermes-sim (issue 27): N generated devices with churn, fedbuff and hermes to 0.9 on mnist1d,
# each in its own process (one torch thread), side by side; wall time and peak RSS per run.
#   OUT=DIR benchmarks/sim_scale.sh [LIMIT_S]   (run from the repository root, the package installed or
#   importable through .typecheck)
LIMIT=${1:-540}
OUT=${OUT:-runs/sim-scale}
mkdir -p "$OUT"
PY=${PY:-python}
run() {  # preset devices
  local out="$OUT/$1-$2"
  "$PY" - "$1" "$2" "$out" "$LIMIT" > "$out.log" 2>&1 <<'PYEOF' &
import json, resource, signal, sys, time
preset, n, out, limit = sys.argv[1], int(sys.argv[2]), sys.argv[3], float(sys.argv[4])
t0 = time.time()
def report(why):
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"preset": preset, "devices": n, "why": why, "wall_s": round(time.time() - t0, 1), "peak_rss_mb": round(rss, 1)}), flush=True)
signal.signal(signal.SIGALRM, lambda *_: (report("time limit"), sys.exit(3)))
signal.alarm(int(limit))
from hermes.sim.cli import main
rc = main(["--quiet", "--population", "generated", "--devices", str(n), "--preset", preset, "--dataset", "mnist1d",
           "--target-accuracy", "0.9", "--max-seconds", "3600", "--out", out])
report(f"rc {rc}")
PYEOF
}
run fedbuff 1000; run hermes 1000; run fedbuff 100; run hermes 100; run fedbuff 10000
wait
for f in "$OUT"/*.log; do echo "== $f"; tail -2 "$f"; done
for d in "$OUT"/*/; do
  "$PY" -c "
import json, sys, collections
d = sys.argv[1]
try:
    s = json.load(open(d + 'summary.json'))
    print(d, s['outcome'], 'to_target', s['seconds_to_target'], 'msgs', s['messages_total'], 'acc', s['final_accuracy'], 'wall', s['wall_seconds'], 'virtual', s['virtual_seconds'], 'updates', s['model_updates'])
except OSError:
    ev = [json.loads(l) for l in open(d + 'events.jsonl')]
    evals = [e for e in ev if e['event'] == 'evaluation']
    c = collections.Counter(e['event'] for e in ev)
    print(d, 'unfinished; last evaluation', evals[-1] if evals else None, dict(c.most_common(6)))
" "$d"
done
