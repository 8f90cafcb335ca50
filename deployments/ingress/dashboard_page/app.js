// hbmserve ops dashboard: polls /hbm/dashboard/data (the DashboardSnapshot of
// deployments/ingress/dashboard.py) and draws it. Charts are plain SVG drawn here rather than a vendored
// chart library: six small line charts need ~60 lines, the page stays self-contained, and each
// chart states in its DOM how many points it drew (data-points), which the browser test checks.
// All text from the cluster goes in through textContent, never innerHTML.
"use strict";

const TOKEN_KEY = "hbmserve.adminToken";
const REFRESH_MS = 2000;
const SVG = "http://www.w3.org/2000/svg";
const COLOURS = ["#2563eb", "#d97706", "#059669", "#dc2626", "#7c3aed", "#0891b2", "#be185d", "#4d7c0f"];
const ROLES = ["starting", "active", "standby", "draining"];

const $ = (sel) => document.querySelector(sel);

function el(tag, attrs = {}, text = null, ns = null) {
  const node = ns ? document.createElementNS(ns, tag) : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (text !== null) node.textContent = text;
  return node;
}

// series: [{name, points: [[t, v|null]...], reference: bool}]; reference lines (SLOs) are drawn
// dashed and not counted as data.
function drawChart(svg, series, unit) {
  svg.replaceChildren();
  const W = 360, H = 150, L = 40, R = 8, T = 8, B = 18;
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  const all = series.flatMap((s) => s.points.filter((p) => p[1] !== null && p[1] !== undefined));
  const data = series.filter((s) => !s.reference).flatMap((s) => s.points.filter((p) => p[1] !== null));
  svg.dataset.points = String(data.length);
  svg.dataset.series = String(series.filter((s) => !s.reference).length);
  if (!all.length) {
    svg.append(el("text", { x: L, y: H / 2 }, "no data yet", SVG));
    return;
  }
  const t0 = Math.min(...all.map((p) => p[0])), t1 = Math.max(...all.map((p) => p[0]), t0 + 1);
  const vmax = Math.max(...all.map((p) => p[1]), 1e-9) * 1.1;
  const x = (t) => L + ((t - t0) / (t1 - t0)) * (W - L - R);
  const y = (v) => H - B - (v / vmax) * (H - T - B);
  svg.append(el("line", { x1: L, y1: H - B, x2: W - R, y2: H - B, stroke: "#ccc" }, null, SVG));
  svg.append(el("line", { x1: L, y1: T, x2: L, y2: H - B, stroke: "#ccc" }, null, SVG));
  svg.append(el("text", { x: 2, y: T + 8 }, fmt(vmax) + unit, SVG));
  svg.append(el("text", { x: 2, y: H - B }, "0", SVG));
  svg.append(el("text", { x: L, y: H - 4 }, `${Math.round(t1 - t0)} s`, SVG));
  series.forEach((s, i) => {
    const colour = COLOURS[(s.colour ?? i) % COLOURS.length];  // an SLO line takes its model's colour
    const pts = s.points.filter((p) => p[1] !== null && p[1] !== undefined);
    if (!pts.length) return;
    const line = el("polyline", {
      points: pts.map((p) => `${x(p[0]).toFixed(1)},${y(p[1]).toFixed(1)}`).join(" "),
      fill: "none", stroke: colour, "stroke-width": s.reference ? 1 : 1.6,
      "stroke-dasharray": s.reference ? "4 3" : "none", "data-series": s.name,
    }, null, SVG);
    svg.append(line);
    svg.append(el("text", { x: W - R - 110, y: T + 10 + 11 * i, fill: colour, style: `fill:${colour}` },
      s.name, SVG));
  });
}

function fmt(v) {
  if (v === null || v === undefined) return "–";
  if (Number.isInteger(v)) return String(v);
  return v >= 100 ? v.toFixed(0) : v >= 1 ? v.toFixed(1) : v.toFixed(3);
}

function seriesOf(history, models, pick) {
  return models.map((m, i) => ({
    name: m, colour: i,
    points: history.map((s) => {
      const ms = s.models.find((x) => x.model === m);
      return [s.at, ms ? pick(ms) : null];
    }),
  }));
}

// The prefix cache's hit rate between two samples, from the counters' differences (prompt tokens
// looked up, found); none where no prompt came or a replica left (a counter went down).
function prefixRates(history, models) {
  return models.map((m, i) => ({
    name: m, colour: i,
    points: history.map((s, k) => {
      const now = s.models.find((x) => x.model === m), before = k ? history[k - 1].models.find((x) => x.model === m) : null;
      if (!now || !before) return [s.at, null];
      const looked = now.prompt_tokens - before.prompt_tokens, found = now.prefix_hit_tokens - before.prefix_hit_tokens;
      return [s.at, looked > 0 && found >= 0 ? (100 * found) / looked : null];
    }),
  }));
}

function drawCharts(snap) {
  const h = snap.history, models = snap.slo.map((s) => s.model);
  const ms = (v) => (v === null ? null : v * 1000);
  const slo = (key) => snap.slo.map((s, i) => ({
    name: `${s.model} SLO`, reference: true, colour: i,
    points: h.length ? [[h[0].at, s[key] * 1000], [h[h.length - 1].at, s[key] * 1000]] : [],
  }));
  const sum = (pick) => [{ name: "cluster", points: h.map((s) => [s.at, s.models.reduce((a, m) => a + (pick(m) ?? 0), 0)]) }];
  const charts = {
    ttft: [seriesOf(h, models, (m) => ms(m.ttft_p95_s)).concat(slo("ttft_p95_s")), " ms"],
    tpot: [seriesOf(h, models, (m) => ms(m.tpot_p95_s)).concat(slo("tpot_p95_s")), " ms"],
    queue: [seriesOf(h, models, (m) => m.queue_depth), ""],
    roles: [ROLES.map((r) => ({ name: r, points: h.map((s) => [s.at, s.models.reduce((a, m) => a + m.roles[r], 0)]) })), ""],
    tokens: [seriesOf(h, models, (m) => m.tokens_per_s), "/s"],
    prefix: [prefixRates(h, models), " %"],
    cost: [sum((m) => m.usd_per_hour), " $/h"],
  };
  for (const [name, [series, unit]] of Object.entries(charts)) {
    drawChart(document.querySelector(`svg[data-chart="${name}"]`), series, unit);
    const last = series.filter((s) => !s.reference).map((s) => `${s.name} ${fmt(s.points.length ? s.points[s.points.length - 1][1] : null)}`);
    document.querySelector(`[data-last="${name}"]`).textContent = last.length ? `(now: ${last.join(", ")})` : "";
  }
}

function drawDecisions(snap) {
  const current = $("#current");
  current.replaceChildren(...snap.current.map(({ model, decision: d }) => {
    const row = el("div", { "data-model": model, "data-target-active": d.target_active,
      "data-serve-target": d.serve_target, "data-active": d.active_replicas.join(" "),
      "data-not-in-time": d.not_in_time ?? 0, "data-prior-hold": d.prior_hold ?? 0 });
    row.append(el("b", {}, `${model}: `), el("span", {}, `${d.target_active} active, ${d.active_replicas.length} serving now; `));
    // The autoscaler's memory (issue 38): what the prior holds, and replicas withheld as too late.
    const memory = [d.prior_source ? `prior ${d.prior_source} holds ${d.prior_hold}` : "", d.not_in_time ? `${d.not_in_time} not in time` : ""];
    if (memory.some(Boolean)) row.append(el("span", { class: "memory" }, `${memory.filter(Boolean).join("; ")}; `));
    row.append(el("span", { class: "reason" }, d.reason));
    return row;
  }));
  $("#decisions tbody").replaceChildren(...snap.decisions.map(({ model, decision: d }) => {
    const tr = el("tr", { "data-model": model, "data-at": d.at, "data-target-active": d.target_active,
      "data-serve-target": d.serve_target });
    tr.append(el("td", {}, new Date(d.at * 1000).toLocaleTimeString()), el("td", {}, model),
      el("td", {}, String(d.target_active)), el("td", {}, String(d.target_standby.hot ?? 0)),
      el("td", {}, String(d.serve_target)), el("td", { class: "reason" }, d.reason));
    return tr;
  }));
}

function drawKv(snap) {
  $("#kv tbody").replaceChildren(...snap.kv.map(({ model, index: k }) => {
    const tr = el("tr", { "data-model": model, "data-hbm-blocks": k.hbm_blocks });
    tr.append(...[model, k.streams, k.hbm_blocks, k.host_blocks, k.untrusted, `${k.max_lag_s.toFixed(2)} s`,
      `${k.lost} of ${k.batches}`, `${k.hash_ms.toFixed(2)} ms`].map((v) => el("td", {}, String(v))));
    return tr;
  }));
}

function drawAdapters(snap) {
  $("#adapters tbody").replaceChildren(...snap.adapters.map((a) => {
    const tr = el("tr", { "data-adapter": a.adapter, "data-requests": a.requests, "data-loads": a.loads });
    const ttft = a.ttft_p95_s === null ? "-" : `${(a.ttft_p95_s * 1000).toFixed(0)} ms`;
    tr.append(...[a.model, a.adapter, a.requests, a.failed, a.prompt_tokens + a.completion_tokens, ttft, a.loads,
      a.unloads, a.resident].map((v) => el("td", {}, String(v))));
    return tr;
  }));
}

function drawRollouts(snap) {
  if (!snap.rollouts.length) return;
  $("#rollouts").replaceChildren(...snap.rollouts.map((r) => {
    const box = el("div", { class: "rollout", "data-model": r.model, "data-phase": r.phase, "data-to": r.to_app });
    const took = Math.round(r.at - r.started_at);
    box.append(el("b", {}, `${r.model}: ${r.from_app} → ${r.to_app}, ${r.phase.replace("_", " ")} (${took} s; ` +
      `at most ${r.max_in_use} of ${r.target} replicas held)`));
    const head = el("tr");
    head.append(...["time", "old replicas", "new replicas", "reason"].map((h) => el("th", {}, h)));
    const table = el("table"), body = el("tbody");
    table.append(el("thead"), body);
    table.tHead.append(head);
    for (const s of r.steps) {
      const tr = el("tr", { "data-old": s.old_replicas, "data-new": s.new_replicas });
      tr.append(el("td", {}, new Date(s.at * 1000).toLocaleTimeString()), el("td", {}, String(s.old_replicas)),
        el("td", {}, String(s.new_replicas)), el("td", { class: "reason" }, s.reason));
      body.append(tr);
    }
    table.append(body);
    box.append(table);
    return box;
  }));
}

function verdict(v) {
  if (v === null || v === undefined) return el("span", { class: "muted" }, "not planned");
  return v ? el("span", { class: "ok" }, "✓ verified") : el("span", { class: "bad" }, "✗ crossed");
}

function drawPlacement(snap) {
  const islands = [...new Set(snap.placement.nodes.flatMap((n) => n.gpus.map((g) => g.island)))];
  $("#nodes").replaceChildren(...snap.placement.nodes.map((n) => {
    const box = el("div", { class: "node", "data-node": n.node });
    box.append(el("b", {}, n.node));
    const row = el("div", { class: "gpus" });
    for (const g of n.gpus) {
      const colour = COLOURS[islands.indexOf(g.island) % COLOURS.length];
      const cell = el("div", { class: g.replica ? "gpu" : "gpu free", style: `border-color:${colour}`,
        "data-node": n.node, "data-gpu": g.gpu, "data-island": g.island, "data-replica": g.replica ?? "",
        "data-rank": g.rank ?? "", "data-plan-index": g.plan_index ?? "", "data-verified": g.verified === null ? "" : String(g.verified) });
      cell.append(el("div", {}, `GPU ${g.gpu} · ${g.island}`));
      if (g.replica) {
        cell.append(el("div", {}, `${g.model} r${g.plan_index} rank ${g.rank}`), verdict(g.verified));
      }
      row.append(cell);
    }
    box.append(row);
    return box;
  }));
  $("#replicas tbody").replaceChildren(...snap.placement.replicas.map((r) => {
    const tr = el("tr", { "data-model": r.model, "data-replica": r.replica, "data-role": r.role,
      "data-ranks": r.ranks.join(" "), "data-verified": r.verified === null ? "" : String(r.verified) });
    const v = el("td");
    v.append(verdict(r.verified));
    tr.append(el("td", {}, r.model), el("td", {}, r.replica), el("td", {}, r.role),
      el("td", {}, r.node_id.slice(0, 12)), el("td", {}, r.ranks.join(", ") || "–"), v,
      el("td", { class: "reason" }, r.reason));
    return tr;
  }));
}

function render(snap) {
  $("#door").textContent = `front door on node ${snap.door.slice(0, 12)} · ${snap.doors} front door(s) · auth ${snap.auth ? "on" : "off"}`;
  $("#scope").textContent = snap.doors > 1
    ? `Latency and tokens/s are measured at this front door (client side), one of ${snap.doors}: its share of the traffic.`
    : "Latency and tokens/s are measured at the front door (client side: queue and network included).";
  $("#updated").textContent = `updated ${new Date(snap.at * 1000).toLocaleTimeString()}`;
  document.body.dataset.snapshotAt = String(snap.at);
  drawCharts(snap);
  drawDecisions(snap);
  drawRollouts(snap);
  drawKv(snap);
  drawAdapters(snap);
  drawPlacement(snap);
}

function askForToken(message) {
  $("#main").hidden = true;
  $("#login").hidden = false;
  $("#forget").hidden = true;
  $("#login-error").textContent = message || "";
}

async function refresh() {
  const token = sessionStorage.getItem(TOKEN_KEY);
  const headers = token ? { Authorization: `Bearer ${token}` } : {};
  try {
    const resp = await fetch("/hbm/dashboard/data", { headers, cache: "no-store" });
    if (resp.status === 401 || resp.status === 403) {
      sessionStorage.removeItem(TOKEN_KEY);
      const body = await resp.json().catch(() => ({}));
      askForToken(token ? (body.error && body.error.message) || "token refused" : "");
      return;
    }
    if (!resp.ok) throw new Error(`HTTP ${resp.status}`);
    const snap = await resp.json();
    $("#login").hidden = true;
    $("#main").hidden = false;
    $("#forget").hidden = !token;
    render(snap);
  } catch (err) {
    $("#updated").textContent = `update failed: ${err.message}`;
  }
}

$("#login").addEventListener("submit", (ev) => {
  ev.preventDefault();
  sessionStorage.setItem(TOKEN_KEY, $("#token").value.trim());
  $("#token").value = "";
  refresh();
});
$("#forget").addEventListener("click", () => { sessionStorage.removeItem(TOKEN_KEY); askForToken(""); });
refresh();
setInterval(() => { if ($("#login").hidden) refresh(); }, REFRESH_MS);
