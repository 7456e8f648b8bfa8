// flopwatch live page: polls /live/api every second and /live/api/heatmap every five, draws with uPlot.
// Every label from the wire goes in as text (textContent), never as HTML: workload names come from Kafka.
"use strict";

const POLL_MS = 1000;
const HEATMAP_MS = 5000;
const COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
                "#bcbd22", "#17becf", "#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173", "#3182bd"];

// What the page shows, for people and for the browser test: the uPlot instances, how often each drew,
// the last answers of both JSON pages.
const live = { charts: {}, drawn: {}, polls: 0, errors: 0, last: null, heatmap: null };
window.flopwatch = live;

function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = String(text);
  if (cls) e.className = cls;
  return e;
}

function num(v, digits, scale) {
  if (v === null || v === undefined) return "–";
  return (v * (scale || 1)).toFixed(digits);
}

// A rule's value and threshold span ratios (0.85) to FLOPS/W (8e11): four significant digits, SI above 1e4.
function sig(v) {
  if (v === null || v === undefined) return "–";
  const a = Math.abs(v);
  for (const [f, p] of [[1e12, "T"], [1e9, "G"], [1e6, "M"], [1e3, "k"]]) {
    if (a >= 10 * f) return `${(v / f).toPrecision(4)} ${p}`;
  }
  return a >= 1e-3 || a === 0 ? String(Number(v.toPrecision(4))) : v.toExponential(2);
}

function row(cells, cls) {
  const tr = el("tr", null, cls);
  for (const c of cells) {
    const td = typeof c === "object" && c !== null ? el("td", c.text, c.cls) : el("td", c);
    tr.appendChild(td);
  }
  return tr;
}

function fill(id, rows, cols, empty) {
  const body = document.querySelector(`#${id} tbody`);
  body.replaceChildren(...(rows.length ? rows : [row([{ text: empty, cls: "empty" }])]));
  if (!rows.length) body.firstChild.firstChild.colSpan = cols;
}

function clock(ns) {
  return new Date(ns / 1e6).toISOString().slice(11, 19);
}

// -- charts -------------------------------------------------------------------------------------------
function chartOpts(id, keys, unit) {
  const el = document.getElementById(id);
  return {
    width: Math.max(300, el.clientWidth - 4), height: 260,
    scales: { x: { time: true } },
    series: [{}, ...keys.map((k, i) => ({ label: k, stroke: COLORS[i % COLORS.length], width: 1.5, spanGaps: false }))],
    axes: [{}, { label: unit, size: 60 }],
    legend: { live: false },
    hooks: { draw: [() => { live.drawn[id] = (live.drawn[id] || 0) + 1; }] },
  };
}

function drawChart(id, keys, t, series, scale, unit) {
  const data = [t, ...series.map((ys) => ys.map((v) => (v === null ? null : v * scale)))];
  const old = live.charts[id];
  if (old && old.flopwatchKeys === keys.join("\n")) {
    old.setData(data);
    return;
  }
  if (old) old.destroy();
  const u = new uPlot(chartOpts(id, keys, unit), data, document.getElementById(id));
  u.flopwatchKeys = keys.join("\n");
  live.charts[id] = u;
}

// -- panels -------------------------------------------------------------------------------------------
function showIngest(s) {
  const box = document.getElementById("ingest");
  const fig = (label, value) => { const d = el("div", label); d.appendChild(el("b", value)); return d; };
  const i = s.ingest;
  box.replaceChildren(
    fig("samples/s", i.samples_per_s === null ? "–" : Math.round(i.samples_per_s).toLocaleString("en")),
    fig("consumer lag", i.lag === null ? "?" : i.lag.toLocaleString("en")),
    fig("samples in", i.samples.toLocaleString("en")),
    fig("frames written", i.frames_written.toLocaleString("en")),
    fig("rejects", i.rejects.toLocaleString("en")),
    fig("GPUs", s.gpus.length),
    fig("firing", s.firing.length),
  );
}

function showTables(s) {
  const firing = s.firing.map((a) => {
    const tr = row([clock(a.onset_ts_ns), a.rule, a.severity, `${a.node}/${a.gpu}`,
      `${a.namespace || ""}/${a.workload || ""}`, { text: sig(a.value), cls: "num" },
      { text: sig(a.threshold), cls: "num" }, { text: num(a.usd_per_h, 2), cls: "num" }, a.cause || ""], "firing");
    tr.dataset.id = a.id;
    tr.dataset.rule = a.rule;
    return tr;
  });
  fill("firing", firing, 9, "nothing firing");
  fill("alerts", s.alerts.map((a) => row([clock(a.ts_ns), { text: a.state, cls: a.state }, a.rule,
    `${a.node}/${a.gpu}`, { text: sig(a.value), cls: "num" }])), 5, "no alerts yet");
  fill("decisions", s.decisions.map((d) => row([clock(d.ts_ns), { text: d.outcome, cls: d.outcome }, d.action,
    `${d.namespace}/${d.workload}`, `${d.current} → ${d.desired}`, d.reasons.join(", "), d.gate || ""])), 7,
    "no decisions yet");
  fill("gpus", s.gpus.map((g) => {
    const tr = row([g.node, g.gpu, `${g.namespace}/${g.workload}`, g.model, g.region, clock(g.tick_ns),
      { text: num(g.tflops, 1), cls: "num" }, { text: num(g.flops_per_watt, 2, 1e-9), cls: "num" },
      { text: num(g.cost_per_tflops, 4), cls: "num" }, { text: num(g.cost_usd_per_h, 2), cls: "num" },
      g.idle === null ? "?" : (g.idle === 1 ? "yes" : "")]);
    tr.dataset.key = `${g.node}/${g.gpu}`;
    tr.dataset.tickNs = String(g.tick_ns);
    return tr;
  }), 11, "no frames yet");
}

function heat(v, lo, hi) {
  // green (cheap) to red (dear), by the cell's place between the cheapest and the dearest
  const f = hi > lo ? (v - lo) / (hi - lo) : 0;
  return `hsl(${Math.round(120 * (1 - f))}, 70%, 75%)`;
}

function showHeatmap(h) {
  const win = document.getElementById("heatmap-window");
  const table = document.getElementById("heatmap");
  table.dataset.fromMs = String(h.from_ms);
  table.dataset.toMs = String(h.to_ms);
  if (h.error) {
    win.textContent = h.error;
    return;
  }
  win.textContent = `frames from ${new Date(h.from_ms).toISOString().slice(11, 19)} to ` +
    `${new Date(h.to_ms).toISOString().slice(11, 19)} UTC (gpu_frames, the cost_heatmap view's measure)`;
  const models = [...new Set(h.rows.map((r) => r.gpu_model))];
  const regions = [...new Set(h.rows.map((r) => r.region))].sort();
  const values = h.rows.map((r) => r.usd_per_tflops_h).filter((v) => v !== null);
  const lo = Math.min(...values), hi = Math.max(...values);
  const head = el("tr");
  head.appendChild(el("th", "model \\ region"));
  for (const r of regions) head.appendChild(el("th", r));
  table.tHead.replaceChildren(head);
  const at = new Map(h.rows.map((r) => [`${r.gpu_model}\n${r.region}`, r]));
  const rows = models.map((m) => {
    const tr = el("tr");
    tr.appendChild(el("th", m));
    for (const region of regions) {
      const r = at.get(`${m}\n${region}`);
      const td = el("td", r ? num(r.usd_per_tflops_h, 4) : "", "cell");
      if (r && r.usd_per_tflops_h !== null) {
        td.style.background = heat(r.usd_per_tflops_h, lo, hi);
        td.title = `${r.frames} frames, ${num(r.usd, 4)} USD, ${num(r.flops_per_watt, 2, 1e-9)} GFLOPS/W`;
        td.dataset.model = m;
        td.dataset.region = region;
        td.dataset.usdPerTflopsH = String(r.usd_per_tflops_h);
        td.dataset.frames = String(r.frames);
      }
      tr.appendChild(td);
    }
    return tr;
  });
  fill("heatmap", rows, regions.length + 1, "no frames in the window yet");
}

// -- polling ------------------------------------------------------------------------------------------
async function getJson(path) {
  const r = await fetch(path, { cache: "no-store" });
  const body = await r.json();
  if (!r.ok && !body.error) throw new Error(`${path}: HTTP ${r.status}`);
  return body;
}

function setStatus(text, stale) {
  const s = document.getElementById("status");
  s.textContent = text;
  s.classList.toggle("stale", stale);
}

async function poll() {
  try {
    const s = await getJson("/live/api");
    live.last = s;
    live.polls += 1;
    showIngest(s);
    showTables(s);
    const keys = s.series.keys;
    if (keys.length) {
      drawChart("chart-fpw", keys, s.series.t, s.series.flops_per_watt, 1e-9, "GFLOPS/W");
      drawChart("chart-cpt", keys, s.series.t, s.series.cost_per_tflops, 1, "USD/TFLOP/s-h");
    }
    setStatus(`updated ${clock(s.now_ns)} UTC`, false);
  } catch (err) {
    live.errors += 1;
    setStatus(`no answer from the worker (${err.message}); retrying`, true);
  }
  setTimeout(poll, POLL_MS);
}

async function pollHeatmap() {
  try {
    live.heatmap = await getJson("/live/api/heatmap");
    showHeatmap(live.heatmap);
  } catch (err) {
    document.getElementById("heatmap-window").textContent = `heatmap: ${err.message}`;
  }
  setTimeout(pollHeatmap, HEATMAP_MS);
}

poll();
pollHeatmap();
