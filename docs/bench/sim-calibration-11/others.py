"""Per testbed run (lock -> end, from lock-load.log): the sampler's 1-min loads and other people's processes (>5% CPU over 2 s)."""
import re

log = open("runs/cal11-tb/lock-load.log").read().splitlines()
samples = []  # (hh:mm:ss, load1, [lines])
for line in open("runs/cal11-tb/sampler.log"):
    if line.startswith("== "):
        p = line.split()
        samples.append([p[1], float(p[2]), []])
    elif samples and "ni " in line and "cpu " in line:
        samples[-1][2].append(line.strip())
for entry in log:
    m = re.match(r"TESTBED (\S+) lock (\S+) load1 (\S+) -> end (\S+) load1 (\S+)", entry)
    if not m:
        continue
    name, a, la, b, lb = m.groups()
    inside = [s for s in samples if a <= s[0] <= b]
    others = sorted({re.sub(r"^\d+ ni \S+ cpu \S+ ", "", x)[:90] for s in inside for x in s[2]
                     if "/work/wt/calq" not in x and "top -b" not in x})
    loads = [s[1] for s in inside]
    rng = f"{min(loads):.2f}-{max(loads):.2f}" if loads else "-"
    n_busy = sum(1 for s in inside if any("/work/wt/calq" not in x and "top -b" not in x for x in s[2]))
    print(f"{name}: {a}-{b} load1 {la} -> {lb}; sampled load1 {rng}; samples {len(inside)}, {n_busy} with other work"
          + ("".join(f"\n    {o}" for o in others) if others else ""))
