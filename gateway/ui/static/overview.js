// The overview page: last hour's cache hit rate, TTFT percentiles and tokens/s per worker,
// three small SVG line charts (no library), refreshed every 10 s while shown.

import {el, svg, fmtInt, fmt1, fmtPct, fmtCompact, fmtClock} from "./format.js";
import {getJSON, isAbort} from "./api.js";
import {showError, clearError} from "./status.js";

const REFRESH_MS = 10000;
const W = 420, H = 180, ML = 40, MR = 10, MT = 8, MB = 22;
const PW = W - ML - MR, PH = H - MT - MB;

function niceMax(v) {
  if (!(v > 0)) return 1;
  const p = Math.pow(10, Math.floor(Math.log10(v)));
  for (const m of [1, 2, 2.5, 5, 10]) if (m * p >= v) return m * p;
  return 10 * p;
}

/**
 * series: [{name, values: [number|null per bucket]}]; xs: bucket mid-times (ms);
 * domain: [t0, t1]; yMax (fixed) or derived; fmtY: axis label.
 */
function lineChart(name, label, xs, domain, series, {yMax, fmtY}) {
  const max = yMax ?? niceMax(Math.max(0, ...series.flatMap((s) => s.values.filter((v) => v != null))));
  const [t0, t1] = domain;
  const sx = (t) => ((t - t0) / Math.max(1, t1 - t0)) * PW;
  const sy = (v) => PH - (Math.min(v, max) / max) * PH;
  const root = svg("svg", {class: "chart", viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": label,
    dataset: {chart: name}});
  root.append(svg("title", {text: label}));
  for (const f of [0, 0.5, 1]) {
    const yy = MT + PH - f * PH;
    root.append(svg("line", {class: "grid", x1: ML, x2: ML + PW, y1: yy, y2: yy}),
      svg("text", {class: "axis", x: ML - 6, y: yy + 4, "text-anchor": "end", text: fmtY(f * max)}));
  }
  for (const f of [0, 0.5, 1]) {
    const t = t0 + f * (t1 - t0);
    root.append(svg("text", {class: "axis", x: ML + f * PW, y: H - 6,
      "text-anchor": f === 0 ? "start" : f === 1 ? "end" : "middle", text: fmtClock(t)}));
  }
  const plot = svg("svg", {class: "plot", x: ML, y: MT, width: PW, height: PH, viewBox: `0 0 ${PW} ${PH}`});
  let any = false;
  series.forEach((s, k) => {
    let d = "";
    s.values.forEach((v, i) => {
      if (v == null) return;
      any = true;
      const prev = i > 0 ? s.values[i - 1] : null;
      d += `${prev == null ? "M" : "L"}${sx(xs[i]).toFixed(1)} ${sy(v).toFixed(1)}`;
      const next = i + 1 < s.values.length ? s.values[i + 1] : null;
      if (prev == null && next == null) {
        plot.append(svg("circle", {class: `dot s${k % 6}`, cx: sx(xs[i]).toFixed(1), cy: sy(v).toFixed(1), r: 3.5}));
      }
    });
    if (d) plot.append(svg("path", {class: `line s${k % 6}`, d, dataset: {series: s.name}}));
  });
  if (!any) {
    plot.append(svg("text", {class: "axis empty", x: PW / 2, y: PH / 2, "text-anchor": "middle",
      text: "no turns in this window"}));
  }
  root.append(plot);
  return root;
}

function legend(series) {
  return el("div", {class: "legend"}, series.map((s, k) =>
    el("span", {class: "legend-item"}, el("span", {class: `swatch s${k % 6}`}), s.name)));
}

function stat(label, name, value, unit) {
  return el("div", {class: "stat"}, el("div", {class: "stat-label", text: label}),
    el("div", {class: "stat-value"}, el("span", {dataset: {stat: name}, text: value}),
      unit ? el("span", {class: "unit", text: ` ${unit}`}) : null));
}

export class OverviewPage {
  constructor(view) {
    this.view = view;
    this.ctrl = new AbortController();
    this.stats = el("div", {class: "stats"});
    this.charts = el("div", {class: "charts"});
    this.updated = el("span", {class: "muted"});
    view.replaceChildren(el("section", {id: "overview", class: "overview-page"},
      el("div", {class: "toolbar"}, el("h2", {text: "Overview"}),
        el("span", {class: "muted", text: "last hour, this gateway, per minute"}), this.updated),
      this.stats, this.charts));
    this.timer = setInterval(() => { if (!document.hidden) this.load(); }, REFRESH_MS);
  }

  dispose() {
    clearInterval(this.timer);
    this.ctrl.abort();
  }

  start() { return this.load(); }

  async load() {
    if (this.busy) return;
    this.busy = true;
    try {
      const data = await getJSON("/v1/ui/overview?window_s=3600", {signal: this.ctrl.signal});
      this.render(data);
      clearError();
    } catch (e) {
      if (!isAbort(e)) showError(e, "Overview");
    } finally {
      this.busy = false;
    }
  }

  render(data) {
    const totals = data.totals || {};
    const buckets = data.buckets || [];
    const bucketMs = (data.bucket_s || 60) * 1000;
    const now = data.now_ms || Date.now();
    const domain = [now - (data.window_s || 3600) * 1000, now];
    const xs = buckets.map((b) => b.start_ms + bucketMs / 2);
    const workerTotals = totals.tokens_per_s || {};
    this.stats.replaceChildren(
      stat("Cache hit rate", "hit_rate", fmtPct(totals.hit_rate)),
      stat("TTFT p50", "ttft_p50", fmt1(totals.ttft_ms?.p50), "ms"),
      stat("TTFT p99", "ttft_p99", fmt1(totals.ttft_ms?.p99), "ms"),
      stat("Turns", "num_turns", fmtInt(totals.num_turns ?? 0)),
      el("div", {class: "stat workers"}, el("div", {class: "stat-label", text: "Output tokens/s per worker"}),
        el("div", {class: "stat-list"}, Object.keys(workerTotals).length
          ? Object.entries(workerTotals).map(([w, v]) => el("div", {}, el("code", {text: w}), ` ${v != null && v < 10 ? Number(v).toFixed(2) : fmt1(v)}`))
          : el("span", {class: "muted", text: "–"}))));
    const hit = [{name: "hit rate", values: buckets.map((b) => b.hit_rate ?? null)}];
    const ttft = ["p50", "p90", "p99"].map((p) => ({name: p, values: buckets.map((b) => b.ttft_ms?.[p] ?? null)}));
    const workers = [...new Set(buckets.flatMap((b) => Object.keys(b.tokens_per_s || {})))].sort();
    const tps = workers.map((w) => ({name: w, values: buckets.map((b) => b.tokens_per_s?.[w] ?? null)}));
    const card = (title, chart, series) => el("figure", {class: "card chart-card"},
      el("figcaption", {text: title}), chart, series.length > 1 || series === tps ? legend(series) : null);
    this.charts.replaceChildren(
      card("Prefix-cache hit rate", lineChart("hit_rate", "cache hit rate per minute", xs, domain, hit,
        {yMax: 1, fmtY: (v) => `${Math.round(v * 100)}%`}), hit),
      card("Time to first token (ms)", lineChart("ttft", "TTFT p50/p90/p99 per minute", xs, domain, ttft,
        {fmtY: fmtCompact}), ttft),
      card("Output tokens/s per worker", lineChart("tokens_per_s", "tokens per second per worker per minute",
        xs, domain, tps, {fmtY: fmtCompact}), tps));
    this.updated.textContent = `updated ${new Date().toLocaleTimeString()}`;
  }
}
