"""Hermes Table III (MNIST, CNN) beside ``hermes-sim`` runs in the paper's setting: one folder per framework.

    python benchmarks/sim_table3_paper.py RUNS_DIR

``RUNS_DIR/<label>/summary.json``, labels as in benchmarks/sim_table3.py (bsp, asp, ssp, ebsp, hermes-paper,
hermes-paper-a1.6-b0.15, hermes-paper-a0.9-b0.1, hermes): the paper's columns and the simulation's (virtual
seconds to target, speed-up over bsp, iterations = local cycles over all devices, WI = Hermes Eq. 7 mean over
devices, messages = every request a device sent, the paper's API calls, and their ratio to bsp's).
Markdown on stdout.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sim_table3 import NAMES, PAPER, fmt  # type: ignore[import-not-found]  # noqa: E402 (a sibling script)

ORDER = ("bsp", "hermes-paper", "hermes-paper-a1.6-b0.15", "hermes-paper-a0.9-b0.1", "asp", "ssp", "ebsp", "hermes")


def metrics(summary: dict[str, Any]) -> dict[str, Any]:
    ws = summary["workers"]
    return {"reached": summary["reached_target"], "t": summary["seconds_to_target"],
            "iterations": sum(w["cycles"] for w in ws), "wi": sum(w["wi"] or 0 for w in ws) / len(ws),
            "messages": summary["messages_total"], "accuracy": summary["final_accuracy"],
            "virtual": summary["virtual_seconds"]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs_dir")
    a = p.parse_args(argv)
    got = {lab: metrics(json.loads((Path(a.runs_dir) / lab / "summary.json").read_text()))
           for lab in ORDER if (Path(a.runs_dir) / lab / "summary.json").exists()}
    base = got.get("bsp")
    print("| framework | paper: iterations | paper: WI | paper: API calls (M) | paper: API calls / BSP's | "
          "paper: speed-up | sim: reached | sim: virtual s | sim: speed-up | sim: iterations | sim: WI | "
          "sim: messages | sim: messages / bsp's | sim: final accuracy |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for lab, m in got.items():
        paper = PAPER.get(lab)
        cols = ([f"{paper[0]:,}", fmt(paper[2]), fmt(paper[4], 1), fmt(paper[4] / PAPER["bsp"][4]),
                 f"{paper[5]:.2f}×"] if paper else ["-"] * 5)
        speed = (f"{base['t'] / m['t']:.2f}×" if base and base["t"] and m["reached"] and m["t"]
                 else f"missed (< {base['t'] / m['virtual']:.2f}×)" if base and base["t"] else "-")
        print(" | ".join([f"| {NAMES.get(lab, '`' + lab + '`')}", *cols, "yes" if m["reached"] else "no",
                          fmt(m["t"], 1), speed, f"{m['iterations']:,}", fmt(m["wi"]), f"{m['messages']:,}",
                          fmt(m["messages"] / base["messages"] if base else None), fmt(m["accuracy"], 3)]) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
