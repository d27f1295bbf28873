// Live view of a Hermes run. Vanilla JS, no library: the page must work on a network with no way out.
"use strict";

const POLL_MS = 1000;
const KEEP = 4096;  // points kept per series, like the server's ring
const PALETTE = ["#4263eb", "#f08c00", "#2f9e44", "#e64980", "#7048e8", "#1098ad", "#d9480f", "#5c940d",
                 "#ae3ec9", "#1c7ed6", "#c92a2a", "#087f5b"];
const SVG_NS = "http://www.w3.org/2000/svg";

// The token: from #token=... (a fragment never reaches the server's logs), else this tab's storage, else the
// form the page shows on a 401 (not window.prompt: a modal dialog stalls headless browsers and kiosks).
let token = new URLSearchParams(location.hash.slice(1)).get("token") || sessionStorage.getItem("hermes-token") || "";
let seq = 0;
let polls = 0;
const evaluations = [];
const cycles = [];
const colours = new Map();

class Unauthorized extends Error {}

function colourOf(name) {
  if (!colours.has(name)) colours.set(name, PALETTE[colours.size % PALETTE.length]);
  return colours.get(name);
}

async function getJSON(path) {
  const headers = token ? { Authorization: "Bearer " + token } : {};
  const r = await fetch(path, { headers, cache: "no-store" });
  if (r.status === 401) {
    document.getElementById("token-form").hidden = false;
    throw new Unauthorized("this server protects its data (--protect-reads): give its join or admin token");
  }
  if (!r.ok) throw new Error(path + ": HTTP " + r.status);
  return r.json();
}

function setText(id, value) {
  const el = document.getElementById(id);
  if (el) el.textContent = value;
}

function fmt(x, digits) {
  return x === null || x === undefined ? "-" : Number(x).toFixed(digits);
}

function bytes(n) {
  if (n === null || n === undefined) return "-";
  const units = ["B", "kB", "MB", "GB", "TB"];
  let i = 0;
  while (n >= 1000 && i < units.length - 1) { n /= 1000; i++; }
  return (i ? n.toFixed(1) : String(n)) + " " + units[i];
}

function duration(s) {
  s = Math.max(0, Math.round(s));
  const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60), sec = s % 60;
  return (h ? h + "h " : "") + (h || m ? m + "m " : "") + sec + "s";
}

function el(tag, attrs, text) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  return node;
}

// A line chart in a 600x220 SVG: series = [{name, colour, points: [[x, y], ...]}]; target: a y drawn dashed.
function lineChart(svgId, series, yFixed, target) {
  const svg = document.getElementById(svgId);
  svg.replaceChildren();
  const W = 600, H = 220, L = 48, R = 10, T = 10, B = 24;
  const all = series.flatMap(s => s.points);
  if (!all.length) {
    svg.appendChild(el("text", { x: W / 2, y: H / 2, "text-anchor": "middle" }, "waiting for data…"));
    return;
  }
  const xs = all.map(p => p[0]), ys = all.map(p => p[1]);
  const x0 = Math.min(...xs), x1 = Math.max(...xs, x0 + 1e-9);
  const hasTarget = target !== undefined && target !== null && Number.isFinite(target);
  let y0 = yFixed ? yFixed[0] : Math.min(...ys, ...(hasTarget ? [target] : [])),
      y1 = yFixed ? yFixed[1] : Math.max(...ys, ...(hasTarget ? [target] : []));
  // A flat series keeps a visible range instead of magnifying rounding noise into false variation.
  if (y1 - y0 < 1e-9) { y0 -= 0.5 * (Math.abs(y0) || 1); y1 += 0.5 * (Math.abs(y1) || 1); }
  const sx = x => L + (x - x0) / (x1 - x0 || 1) * (W - L - R);
  const sy = y => T + (1 - (y - y0) / (y1 - y0)) * (H - T - B);
  svg.appendChild(el("line", { x1: L, y1: H - B, x2: W - R, y2: H - B, stroke: "#ccd" }));
  svg.appendChild(el("line", { x1: L, y1: T, x2: L, y2: H - B, stroke: "#ccd" }));
  for (let i = 0; i <= 4; i++) {
    const y = y0 + (y1 - y0) * i / 4;
    svg.appendChild(el("line", { x1: L, y1: sy(y), x2: W - R, y2: sy(y), stroke: "#eef" }));
    svg.appendChild(el("text", { x: L - 4, y: sy(y) + 4, "text-anchor": "end" }, y.toPrecision(3)));
  }
  svg.appendChild(el("text", { x: L, y: H - 6 }, fmt(x0, 0)));
  svg.appendChild(el("text", { x: W - R, y: H - 6, "text-anchor": "end" }, fmt(x1, 0)));
  if (hasTarget) {
    svg.appendChild(el("line", { x1: L, y1: sy(target), x2: W - R, y2: sy(target), stroke: "#2f9e44",
                                 "stroke-dasharray": "6 4", "data-target": String(target) }));
    svg.appendChild(el("text", { x: W - R - 2, y: sy(target) - 4, "text-anchor": "end", fill: "#2f9e44",
                                 class: "target-label" }, "target " + target));
  }
  series.forEach((s, i) => {
    if (!s.points.length) return;
    const d = s.points.map(p => sx(p[0]).toFixed(1) + "," + sy(p[1]).toFixed(1)).join(" ");
    svg.appendChild(el("polyline", { points: d, fill: "none", stroke: s.colour, "stroke-width": 1.6 }));
    if (series.length > 1) {
      svg.appendChild(el("rect", { x: L + 8, y: T + 4 + i * 14, width: 9, height: 9, fill: s.colour }));
      svg.appendChild(el("text", { x: L + 21, y: T + 12 + i * 14 }, s.name));
    }
  });
}

// Gate decisions: one pair of bars per worker (pushed, skipped).
function gateChart(workers) {
  const svg = document.getElementById("chart-gate");
  svg.replaceChildren();
  const W = 600, H = 220, L = 10, B = 34, T = 14;
  const rows = workers.filter(w => w.gate_pushes + w.gate_skips > 0);
  // No empty charts: a preset that pushes every cycle has no gate decisions to draw.
  document.getElementById("figure-gate").hidden = !rows.length;
  if (!rows.length) return;
  const top = Math.max(...rows.map(w => Math.max(w.gate_pushes, w.gate_skips)), 1);
  const slot = (W - L) / rows.length, bar = Math.min(40, slot / 3);
  rows.forEach((w, i) => {
    const x = L + i * slot + slot / 2;
    [[w.gate_pushes, colourOf(w.name), -bar], [w.gate_skips, "#adb5bd", 0]].forEach(([n, c, dx]) => {
      const h = n / top * (H - T - B);
      svg.appendChild(el("rect", { x: x + dx, y: H - B - h, width: bar, height: h, fill: c }));
      svg.appendChild(el("text", { x: x + dx + bar / 2, y: H - B - h - 3, "text-anchor": "middle" }, String(n)));
    });
    svg.appendChild(el("text", { x, y: H - B + 14, "text-anchor": "middle" }, w.name));
  });
  svg.appendChild(el("text", { x: W - 4, y: H - 4, "text-anchor": "end" }, "coloured: pushed · grey: skipped"));
}

// The run's primary metric (what "best" and the target are about) and its target, from /v1/status.
let primary = "accuracy";
let target = null;  // {metric, value}

// One evaluation's value of a metric: the task's metrics, else the accuracy field (older servers send only that).
function metricOf(e, name) {
  if (e.metrics && e.metrics[name] !== undefined) return e.metrics[name];
  return name === "accuracy" ? e.accuracy : null;
}

function parseTarget(s) {
  if (s.target) {
    const at = s.target.lastIndexOf("=");
    const value = Number(s.target.slice(at + 1));
    if (at > 0 && Number.isFinite(value)) return { metric: s.target.slice(0, at), value };
  }
  if (s.target_accuracy !== null && s.target_accuracy !== undefined) return { metric: "accuracy", value: s.target_accuracy };
  return null;
}

function renderStatus(s) {
  setText("task", s.task ? "task " + s.task : "-");
  setText("preset", (s.preset || s.sync) + " · " + s.sync);
  setText("outcome", s.outcome + (s.stop_reason ? ": " + s.stop_reason : ""));
  setText("version", String(s.model_version));
  primary = s.best_metric || "accuracy";
  target = parseTarget(s);
  const ev = s.evaluation;
  setText("metric-label", "test " + primary);
  setText("metric", ev ? fmt(metricOf(ev, primary), 4) : "-");
  setText("loss", ev ? fmt(ev.loss, 4) : "-");
  setText("evaluated-version", ev ? String(ev.version) : "-");
  const best = s.best_metrics && s.best_metrics[primary] !== undefined ? s.best_metrics[primary]
    : (primary === "accuracy" ? s.best_accuracy : null);
  setText("best", fmt(best, 4));
  setText("target", target ? target.metric + " " + target.value : "none");
  setText("workers-active", String(s.workers_active));
  setText("workers-total", String(s.workers_total));
  setText("hl", s.heterogeneity ? fmt(s.heterogeneity.measured, 2) : "-");
  setText("elapsed", duration(s.elapsed_seconds));
  setText("progress", fmt(s.epoch_progress, 2));
}

function cell(tr, text, cls) {
  const td = document.createElement("td");
  td.textContent = text;
  if (cls) td.className = cls;
  tr.appendChild(td);
  return td;
}

function renderWorkers(workers) {
  const tbody = document.querySelector("#workers tbody");
  tbody.replaceChildren();
  let pushes = 0, skips = 0, messages = 0, bytesIn = 0, bytesOut = 0;
  workers.sort((a, b) => a.name.localeCompare(b.name));
  for (const w of workers) {
    pushes += w.gate_pushes; skips += w.gate_skips; messages += w.messages;
    bytesIn += w.server_bytes_in; bytesOut += w.server_bytes_out;
    const tr = document.createElement("tr");
    tr.dataset.worker = w.name;
    const name = cell(tr, w.name, "name");
    const sw = document.createElement("span");
    sw.className = "swatch";
    sw.style.background = colourOf(w.name);
    name.prepend(sw);
    cell(tr, w.state, "state-" + w.state);
    cell(tr, w.device);
    cell(tr, fmt(w.speed, 2));
    cell(tr, fmt(w.throughput, 1));
    cell(tr, w.dss === null ? "-" : String(w.dss), "dss");
    // ``mbs`` before issue 26: an older server's workers still show theirs.
    const batchSize = w.batch_size !== undefined ? w.batch_size : w.mbs;
    cell(tr, batchSize === null || batchSize === undefined ? "-" : String(batchSize), "batch_size");
    cell(tr, String(w.accumulation));
    cell(tr, fmt(100 * w.utilization, 1) + "%");
    cell(tr, String(w.cycles));
    const last = w.cycle_log.length ? w.cycle_log[w.cycle_log.length - 1][3] : null;
    cell(tr, fmt(last, 3));
    cell(tr, String(w.gate_pushes));
    cell(tr, String(w.gate_skips));
    cell(tr, fmt(w.wi, 2));
    cell(tr, String(w.messages));
    cell(tr, bytes(w.server_bytes_in));
    cell(tr, bytes(w.server_bytes_out));
    tbody.appendChild(tr);
  }
  setText("gate-pushes", String(pushes));
  setText("gate-skips", String(skips));
  setText("messages", String(messages));
  setText("bytes-in", bytes(bytesIn));
  setText("bytes-out", bytes(bytesOut));
  gateChart(workers);
}

// The metrics the evaluations report, in the order they first appear (the primary and the target's first).
function metricNames() {
  const names = [];
  const add = n => { if (!names.includes(n)) names.push(n); };
  for (const e of evaluations) {
    for (const n of Object.keys(e.metrics || {})) add(n);
    if (e.accuracy !== null && e.accuracy !== undefined) add("accuracy");
  }
  const first = [primary, target && target.metric].filter(n => n && names.includes(n));
  return [...new Set([...first, ...names])];
}

// The chart of one metric, created the first time the metric is seen.
function metricChart(name) {
  const id = "chart-" + name.replace(/[^A-Za-z0-9_-]/g, "_");
  if (!document.getElementById(id)) {
    const fig = document.createElement("figure");
    fig.className = "metric";
    fig.dataset.metric = name;
    const cap = document.createElement("figcaption");
    cap.textContent = "Test " + name + " over time (s)";
    const svg = document.createElementNS(SVG_NS, "svg");
    svg.id = id;
    svg.setAttribute("viewBox", "0 0 600 220");
    fig.append(cap, svg);
    const charts = document.getElementById("charts");
    const metrics = charts.querySelectorAll("figure.metric");
    charts.insertBefore(fig, metrics.length ? metrics[metrics.length - 1].nextSibling : charts.firstChild);
  }
  return id;
}

function renderHistory() {
  for (const name of metricNames()) {
    const points = evaluations.map(e => [e.elapsed, metricOf(e, name)]).filter(p => p[1] !== null && p[1] !== undefined);
    const goal = target && target.metric === name ? target.value : null;
    lineChart(metricChart(name), [{ name, colour: "#4263eb", points }], name === "accuracy" ? [0, 1] : null, goal);
  }
  lineChart("chart-loss", [{ name: "loss", colour: "#e64980", points: evaluations.map(e => [e.elapsed, e.loss]) }]);
  const byWorker = new Map();
  for (const c of cycles) {
    if (!byWorker.has(c.worker)) byWorker.set(c.worker, []);
    byWorker.get(c.worker).push([c.elapsed, c.compute_seconds]);
  }
  lineChart("chart-cycles", [...byWorker].map(([name, points]) => ({ name, colour: colourOf(name), points })));
}

function keep(list, more) {
  list.push(...more);
  if (list.length > KEEP) list.splice(0, list.length - KEEP);
}

async function poll() {
  try {
    const [status, workers, history] = await Promise.all([
      getJSON("v1/status"), getJSON("v1/workers"), getJSON("v1/history?since=" + seq),
    ]);
    // A restarted server numbers its points from 0 again: start over rather than miss them.
    if (history.seq < seq) {
      evaluations.length = 0;
      cycles.length = 0;
      seq = 0;
    } else {
      keep(evaluations, history.evaluations);
      keep(cycles, history.cycles);
      seq = history.seq;
    }
    renderStatus(status);
    renderWorkers(workers);
    renderHistory();
    polls += 1;
    document.body.dataset.loaded = String(polls);
    const conn = document.getElementById("connection");
    conn.className = "muted";
    conn.textContent = "updated " + new Date().toLocaleTimeString();
  } catch (err) {
    const conn = document.getElementById("connection");
    conn.className = "error";
    conn.textContent = err.message;
    document.body.dataset.error = err.message;
  }
  setTimeout(poll, POLL_MS);
}

document.getElementById("token-form").addEventListener("submit", event => {
  event.preventDefault();
  token = document.getElementById("token-input").value.trim();
  sessionStorage.setItem("hermes-token", token);
  document.getElementById("token-form").hidden = true;
});

poll();
