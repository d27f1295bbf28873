"""report.md from a fixture results.json: the tables carry the summaries' numbers."""

from __future__ import annotations

import statistics

from bench_fixture import TIMES, make_results

from hermes.deploy.bench.report import render_report


def _rows(md: str, header_start: str) -> dict[str, list[str]]:
    """The table whose header starts with ``header_start``: first cell -> cells."""
    lines = md.splitlines()
    i = next(n for n, line in enumerate(lines) if line.startswith(header_start))
    rows = {}
    for line in lines[i + 2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0]] = cells
    return rows


def test_main_table_matches_the_summaries():
    res = make_results()
    md = render_report(res)
    rows = _rows(md, "| variant | reached")
    header = [c.strip() for c in md.splitlines()[md.splitlines().index(next(
        line for line in md.splitlines() if line.startswith("| variant | reached")))].strip("|").split("|")]
    col = {name: i for i, name in enumerate(header)}
    for label, ts in TIMES.items():
        row = rows[f"`{label}`"]
        reached = [t for t in ts if t is not None]
        assert row[col["reached"]] == f"{len(reached)}/3"
        if len(reached) > 1:
            assert row[col["time to target (s)"]] == \
                f"{statistics.median(reached):.1f} [{min(reached):.1f}–{max(reached):.1f}]"
        runs = [r["summary"] for r in res["runs"] if r["variant"] == label]
        upd = [s["model_updates"] for s in runs]
        assert row[col["model updates"]] == f"{statistics.median(upd):.0f} [{min(upd):.0f}–{max(upd):.0f}]"
        msgs = [s["messages_total"] for s in runs]
        assert row[col["messages"]] == f"{statistics.median(msgs):,.0f} [{min(msgs):,.0f}–{max(msgs):,.0f}]"
    bsp = statistics.median(TIMES["bsp"]) - 2.0  # training time: the fixture's start-up is 2 s
    assert rows["`hermes`"][col["speed-up vs bsp"]] == f"{bsp / 3.0:.2f}× [{bsp / 6.0:.2f}–{bsp / 2.0:.2f}]"
    assert rows["`asp`"][col["speed-up vs bsp"]] == "missed the target (0/3 reached)"
    assert rows["`ssp`"][col["speed-up vs bsp"]].endswith("(2/3 reached; over those)")


def test_speedup_statements_name_the_spread_and_the_misses():
    md = render_report(make_results())
    assert "`hermes`: 3.33× the speed of `bsp` to 0.85 accuracy (range 1.67–5.00× over 3 repeats): " \
           "3.0 s vs 10.0 s median training time." in md
    assert "`asp` did not reach 0.85 accuracy in any of its 3 runs" in md
    assert "only 2 of 3 runs reached the target" in md


def test_baseline_that_missed_gives_no_numbers():
    md = render_report(make_results({**TIMES, "bsp": [None, None, None]}))
    assert "n/a: bsp missed the target" in md
    assert "×" not in "".join(line for line in md.splitlines() if line.startswith("| `hermes`"))


def test_per_run_table_lists_every_run_and_machine():
    res = make_results()
    md = render_report(res)
    runs = _rows(md, "| run | seed")
    assert len(runs) == len(res["runs"])
    for r in res["runs"]:
        cells = runs[f"`{r['key']}`"]
        s = r["summary"]
        assert cells[3] == ("-" if s["seconds_to_target"] is None else f"{s['seconds_to_target']:.1f}")
        assert cells[6] == str(s["model_updates"])
    assert "Test CPU" in md and "| torch | 2.13.0 |" in md
    # load 1.5 on 2 CPUs counts as busy
    assert "The machine was busy" in md


def test_failed_runs_are_listed():
    res = make_results()
    res["runs"][0].update(status="failed", error="killed after 180s (see testbed.log)", summary=None)
    md = render_report(res)
    assert "killed after 180s" in md


def test_few_repeats_are_flagged():
    res = make_results()
    res["suite"]["repeats"] = 1
    assert "too few for claims" in render_report(res)


def test_report_is_a_pure_function_of_the_results():
    res = make_results()
    assert render_report(res) == render_report(make_results())


def test_a_suite_with_the_ddp_peer_gets_a_speedup_column_against_it():
    res = make_results({**TIMES, "ddp": [8.0, 9.0, 10.0]})
    res["suite"]["variants"][-1]["runner"] = "ddp"
    md = render_report(res)
    rows = _rows(md, "| variant | reached")
    header = next(line for line in md.splitlines() if line.startswith("| variant | reached"))
    col = {name.strip(): i for i, name in enumerate(header.strip("|").split("|"))}
    ddp = statistics.median([8.0, 9.0, 10.0]) - 2.0  # training time: the fixture's start-up is 2 s
    assert rows["`hermes`"][col["speed-up vs ddp"]] == f"{ddp / 3.0:.2f}× [{ddp / 6.0:.2f}–{ddp / 2.0:.2f}]"
    assert rows["`ddp`"][col["speed-up vs ddp"]] == "1.00× (peer)"
    assert rows["`asp`"][col["speed-up vs ddp"]] == "missed the target (0/3 reached)"
    assert "*Speed-up vs ddp* is the same against the `ddp` peer's median." in md
    # Without a peer, no such column.
    assert "speed-up vs ddp" not in render_report(make_results())
