// The mwrt dashboard's page: polls /state every second and redraws (plots by uPlot).
"use strict";
const TOKEN = document.body.dataset.token;
const METRICS = { host_used: 1 << 20, rss: 1 << 20, gpu_used: 1 << 20, busy: 1, ops: 1, mb_in: 1, mb_out: 1 };
const COLORS = ["#4a7fd4", "#d4664a", "#3a9a5b", "#9a5bd4", "#c9a227", "#2aa6a6", "#d44a9a", "#777"];
const plots = {};

function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined) e.textContent = text;
  if (cls) e.className = cls;
  return e;
}
function mib(n) { return n == null ? "-" : (n / (1 << 20)).toFixed(0) + " MiB"; }
function secs(n) { return n == null ? "-" : n.toFixed(n < 10 ? 1 : 0) + " s"; }

function fillTable(id, rows) {
  const body = document.querySelector(`#${id} tbody`);
  body.replaceChildren(...rows.map(([attrs, cells]) => {
    const tr = el("tr");
    Object.entries(attrs).forEach(([k, v]) => tr.setAttribute(k, v));
    cells.forEach(c => tr.appendChild(c instanceof Node ? c : el("td", String(c))));
    return tr;
  }));
}

function workerRow(n) {
  const lost = n.lost != null;
  const state = el("td", lost ? "lost: " + n.lost : "live", lost ? "state-lost" : "state-live");
  const gpus = (n.gpus || []).map(g => `${g.name} ${mib(g.free_memory)} free`).join(", ") || "-";
  return [{ "data-node": n.node, class: lost ? "lost" : "live" },
    [n.node, state, n.address.replace("tcp://", ""), n.hostname || "-", n.pid || "-",
     secs(n.uptime), secs(n.heartbeat_age) + " ago", (n.sessions || []).length,
     n.streams_busy ?? "-", n.ops ?? "-", mib(n.rss), mib(n.host_free), gpus]];
}

function sessionRows(nodes) {
  return nodes.flatMap(n => (n.sessions || []).map(s =>
    [{ "data-node": n.node }, [n.node, s.id, s.master, s.tensors ?? "-", mib(s.bytes),
      s.streams_busy, secs(s.idle)]]));
}

function drawPlot(name, state) {
  const nodes = Object.keys(state.series).sort((a, b) => a - b);
  const times = nodes.length ? state.series[nodes[0]].t : [];
  // Align every node on the first node's sample times (the sampler reads all at once).
  const data = [times, ...nodes.map(n => {
    const s = state.series[n];
    return times.map((_, i) => s[name][i] == null ? null : s[name][i] / METRICS[name]);
  })];
  const key = nodes.join(",");
  let p = plots[name];
  if (!p || p.key !== key) {
    if (p) p.plot.destroy();
    const target = document.getElementById("plot-" + name);
    const opts = { width: 440, height: 160, legend: { show: true },
      axes: [{}, { size: 60, values: (u, ticks) => ticks.map(v => +v.toPrecision(3)) }],
      scales: { y: { range: (u, lo, hi) => [0, hi > 0 ? hi * 1.1 : 1] } },  // from 0, honestly
      series: [{}, ...nodes.map((n, i) => ({ label: "node " + n, stroke: COLORS[i % COLORS.length],
        spanGaps: false }))] };
    p = plots[name] = { key, plot: new uPlot(opts, data, target) };
  } else {
    p.plot.setData(data);
  }
}

function drawTimeline(state) {
  const box = document.getElementById("timeline");
  document.getElementById("timeline-note").textContent = state.timeline_note || "";
  const laneOf = s => s.lane || `node ${s.node} dev ${s.device} stream ${s.stream}`;
  const lanes = [...new Set(state.timeline.map(laneOf))].sort();
  const width = 900, lane = 18, left = 190, span = state.timeline_seconds, end = state.now;
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("width", width); svg.setAttribute("height", Math.max(lanes.length, 1) * lane + 20);
  lanes.forEach((name, i) => {
    const t = document.createElementNS(ns, "text");
    t.setAttribute("x", 0); t.setAttribute("y", i * lane + 13); t.textContent = name;
    svg.appendChild(t);
  });
  state.timeline.forEach(s => {
    const i = lanes.indexOf(laneOf(s));
    const x = left + (width - left) * (1 - (end - s.start) / span);
    const r = document.createElementNS(ns, "rect");
    r.setAttribute("x", Math.max(left, x)); r.setAttribute("y", i * lane + 2);
    r.setAttribute("width", Math.max(1, (width - left) * (s.end - s.start) / span));
    r.setAttribute("height", lane - 4);
    const title = document.createElementNS(ns, "title");
    title.textContent = `${s.op} ${((s.end - s.start) * 1e6).toFixed(0)} µs ${JSON.stringify(s.shapes)}`;
    r.appendChild(title); svg.appendChild(r);
  });
  [[left, `−${span} s`, "start"], [width - 2, "now", "end"]].forEach(([x, label, anchor]) => {
    const t = document.createElementNS(ns, "text");
    t.setAttribute("x", x); t.setAttribute("y", lanes.length * lane + 14);
    t.setAttribute("text-anchor", anchor); t.setAttribute("fill", "#777"); t.textContent = label;
    svg.appendChild(t);
  });
  if (!lanes.length) svg.appendChild(Object.assign(document.createElementNS(ns, "text"),
    { textContent: "no ops in the last " + span + " s" })).setAttribute("y", 13);
  box.replaceChildren(svg);
}

function drawErrors(state) {
  const items = state.nodes.flatMap(n => (n.errors || []).map(e => ({ ...e, where: `node ${n.node}` })))
    .concat(state.notes.map(e => ({ ...e, where: "dashboard" })))
    .sort((a, b) => b.time - a.time).slice(0, 20);
  const list = document.getElementById("errors");
  list.replaceChildren(...(items.length ? items.map(e => el("li",
    `${new Date(e.time * 1000).toLocaleTimeString()} ${e.where}` +
    (e.op ? ` stream ${e.stream} ${e.op}: ${e.type || ""} ` : ": ") + e.message +
    (e.count > 1 ? ` (${e.count} times)` : ""))) : [el("li", "none")]));
}

// The timeline's slices the page holds: each poll asks only for those added since `cursor`.
let slices = [], cursor = null;

function keepTimeline(state) {
  slices = state.timeline_reset ? state.timeline : slices.concat(state.timeline);
  slices = slices.filter(s => s.end >= state.now - state.timeline_seconds);
  cursor = state.timeline_cursor;
  state.timeline = slices;
}

async function poll() {
  try {
    const since = cursor == null ? "" : "&since=" + cursor;
    const response = await fetch("state?token=" + encodeURIComponent(TOKEN) + since, { cache: "no-store" });
    if (!response.ok) throw new Error(await response.text());
    const state = await response.json();
    keepTimeline(state);
    fillTable("workers", state.nodes.map(workerRow));
    fillTable("sessions", sessionRows(state.nodes));
    Object.keys(METRICS).forEach(name => drawPlot(name, state));
    drawTimeline(state);
    drawErrors(state);
    const live = state.nodes.filter(n => n.lost == null).length;
    document.getElementById("updated").textContent =
      `${live} of ${state.nodes.length} workers live · sampled ${new Date(state.sampled * 1000).toLocaleTimeString()}`;
  } catch (err) {
    document.getElementById("updated").textContent = "dashboard unreachable: " + err.message;
  }
  setTimeout(poll, 1000);
}
poll();
