// The turn tree: a git-graph layout computed once per data change (O(n)), drawn virtualized.

import {el, svg, fmtInt, fmt1, fmtAgo, shortId} from "./format.js";
import {computeLayout} from "./layout.js";

const OVERSCAN = 12; // rows drawn above and below the viewport
const MAX_LANE_W = 14;
const PAD = 6;


const LANE_COLORS = 8;

function metric(field, value, before, after) {
  return el("span", {class: "m"}, before ? el("span", {class: "unit", text: before}) : null,
    el("span", {dataset: {field}, text: value}), after ? el("span", {class: "unit", text: after}) : null);
}

function cacheBar(usage) {
  const cached = Number(usage?.cached_tokens) || 0;
  const computed = Number(usage?.computed_tokens) || 0;
  const total = cached + computed;
  const pct = total ? (cached / total) * 100 : 0;
  return el("span", {class: "cache-bar", title: `${cached} cached / ${computed} computed prompt tokens`,
    role: "img", "aria-label": `${pct.toFixed(0)}% of the prompt cached`},
  el("span", {class: "cached", style: {width: pct.toFixed(1) + "%"}}));
}

/** One row element for a tree turn. */
export function buildRow(turn, sessionId, heads) {
  const isRoot = turn.role === "root";
  const a = el("a", {class: `turn-row role-${turn.role}`, href: `#/s/${encodeURIComponent(sessionId)}/t/${encodeURIComponent(turn.id)}`,
    title: turn.id,
    dataset: {turnId: turn.id, parentId: turn.parent_id ?? undefined, role: turn.role, seq: turn.seq}});
  const line1 = el("div", {class: "line1"});
  for (const name of heads || []) {
    line1.append(el("span", {class: "head-label", dataset: {headBranch: name, headTurn: turn.id}, text: name}));
  }
  line1.append(el("span", {class: "role", dataset: {field: "role"}, text: turn.role}));
  const summary = turn.summary || (isRoot ? "session start" : "");
  line1.append(el("span", {class: "summary", dataset: {field: "summary"}, text: summary}));
  const line2 = el("div", {class: "line2"});
  if (turn.role === "assistant") {
    const u = turn.usage || {};
    line2.append(cacheBar(u),
      metric("cached_tokens", fmtInt(u.cached_tokens), null, "cached"),
      metric("computed_tokens", fmtInt(u.computed_tokens), null, "computed"),
      metric("output_tokens", fmtInt(u.output_tokens), null, "out"),
      metric("ttft_ms", fmt1(u.ttft_ms), "TTFT", "ms"),
      metric("decode_tokens_per_s", fmt1(u.decode_tokens_per_s), null, "tok/s"),
      el("span", {class: "m"}, el("span", {class: "unit", text: "draft"}),
        el("span", {dataset: {field: "drafted_tokens"}, text: fmtInt(u.drafted_tokens)}),
        el("span", {class: "unit", text: "/"}),
        el("span", {dataset: {field: "accepted_tokens"}, text: fmtInt(u.accepted_tokens)})),
      el("span", {class: "m tools", dataset: {field: "tool_calls"},
        text: (turn.tool_calls || []).map((c) => c.name).join(", ")}),
      el("span", {class: "m finish", dataset: {field: "finish_reason"}, text: turn.finish_reason || ""}));
  } else {
    line2.append(el("span", {class: "m", text: isRoot ? `seq 0 · ${shortId(turn.id)}` : `${fmtInt(turn.num_tokens)} tokens`}));
    if (turn.role === "tool") line2.append(el("span", {class: "m unit", text: "tool result"}));
  }
  line2.append(el("span", {class: "m unit ago", text: fmtAgo(turn.created_ms)}));
  a.append(line1, line2);
  return a;
}

export class TreeView {
  constructor(root, {sessionId}) {
    this.root = root;
    this.sessionId = sessionId;
    this.turns = [];
    this.layout = computeLayout([]);
    this.heads = new Map();
    this.selected = null;
    this.generating = null;
    this.rendered = new Map();
    this.frame = 0;
    this.spacer = el("div", {class: "tree-spacer"});
    this.graph = svg("svg", {class: "tree-graph", "aria-hidden": "true"});
    this.rows = el("div", {class: "tree-rows"});
    this.spacer.append(this.graph, this.rows);
    root.prepend(this.spacer);
    this.onScroll = () => this.schedule();
    root.addEventListener("scroll", this.onScroll, {passive: true});
    this.graph.addEventListener("click", (e) => {
      const id = e.target?.dataset?.node;
      if (id) location.hash = `#/s/${encodeURIComponent(this.sessionId)}/t/${encodeURIComponent(id)}`;
    });
    this.resize = new ResizeObserver(() => { this.measure(); this.schedule(); });
    this.resize.observe(root);
    this.measure();
  }

  destroy() {
    cancelAnimationFrame(this.frame);
    this.resize.disconnect();
    this.root.removeEventListener("scroll", this.onScroll);
  }

  measure() {
    const h = parseFloat(getComputedStyle(this.root).getPropertyValue("--row-h")) || 44;
    if (h !== this.rowH) { this.rowH = h; this.clearRows(); }
    const lanes = this.layout.numLanes;
    const maxW = Math.max(60, (this.root.clientWidth || 800) * 0.3);
    this.laneW = Math.max(2, Math.min(MAX_LANE_W, (maxW - 2 * PAD) / lanes));
    this.graphW = Math.ceil(Math.min(maxW, 2 * PAD + lanes * this.laneW));
    this.spacer.style.height = `${this.layout.n * this.rowH}px`;
    this.spacer.style.setProperty("--graph-w", `${this.graphW}px`);
  }

  /** New data: turns sorted by seq, their layout, and the session's branches. */
  update(turns, layout, branches, defaultBranch) {
    this.turns = turns;
    this.layout = layout;
    this.heads = new Map();
    const names = Object.keys(branches || {}).sort((a, b) =>
      (a === defaultBranch ? -1 : b === defaultBranch ? 1 : a.localeCompare(b)));
    for (const name of names) {
      const tid = branches[name];
      if (!this.heads.has(tid)) this.heads.set(tid, []);
      this.heads.get(tid).push(name);
    }
    this.clearRows();
    this.measure();
    this.draw();
  }

  clearRows() {
    for (const node of this.rendered.values()) node.remove();
    this.rendered.clear();
  }

  schedule() {
    if (this.frame) return;
    this.frame = requestAnimationFrame(() => { this.frame = 0; this.draw(); });
  }

  setSelected(tid) {
    this.selected = tid;
    for (const [id, node] of this.rendered) node.classList.toggle("selected", id === tid);
    this.schedule();
  }

  setGenerating(tid) {
    this.generating = tid;
    for (const [id, node] of this.rendered) node.classList.toggle("generating", id === tid);
    this.schedule();
  }

  rowOf(tid) {
    const i = this.layout.index.get(tid);
    return i === undefined ? -1 : this.layout.row[i];
  }

  /** Scrolls so the turn's row is visible (centred when it was not). */
  reveal(tid) {
    const r = this.rowOf(tid);
    if (r < 0) return false;
    const top = r * this.rowH;
    const vh = this.root.clientHeight;
    if (top < this.root.scrollTop || top + this.rowH > this.root.scrollTop + vh) {
      this.root.scrollTop = Math.max(0, top - vh / 2 + this.rowH / 2);
    }
    this.draw();
    return true;
  }

  /** The turn `delta` rows away from `tid` (the first row when none is selected). */
  neighbor(tid, delta) {
    const {n, order} = this.layout;
    if (!n) return null;
    const r = tid ? this.rowOf(tid) : -1;
    const next = r < 0 ? 0 : Math.max(0, Math.min(n - 1, r + delta));
    return this.turns[order[next]].id;
  }

  x(lane) { return PAD + lane * this.laneW + this.laneW / 2; }

  draw() {
    const {n, order, row, lane, parent, longEdges} = this.layout;
    const h = this.rowH;
    const vh = this.root.clientHeight || 600;
    const top = this.root.scrollTop;
    const r0 = Math.max(0, Math.floor(top / h) - OVERSCAN);
    const r1 = Math.min(n, Math.ceil((top + vh) / h) + OVERSCAN);
    // Rows.
    const want = new Set();
    for (let r = r0; r < r1; r++) {
      const t = this.turns[order[r]];
      want.add(t.id);
      let node = this.rendered.get(t.id);
      if (!node) {
        node = buildRow(t, this.sessionId, this.heads.get(t.id));
        node.classList.toggle("selected", t.id === this.selected);
        node.classList.toggle("generating", t.id === this.generating);
        this.rendered.set(t.id, node);
        this.rows.append(node);
      }
      node.style.top = `${r * h}px`;
    }
    for (const [id, node] of this.rendered) {
      if (!want.has(id)) { node.remove(); this.rendered.delete(id); }
    }
    // Graph: edges whose row span meets [r0, r1), then nodes.
    const g = this.graph;
    const y0 = r0 * h;
    g.style.top = `${y0}px`;
    g.setAttribute("width", String(this.graphW));
    g.setAttribute("height", String(Math.max(1, (r1 - r0) * h)));
    const y = (rr) => rr * h + h / 2 - y0;
    const parts = [];
    const edge = (c) => {
      const p = parent[c];
      const xp = this.x(lane[p]), xc = this.x(lane[c]);
      const yp = y(row[p]), yc = y(row[c]);
      const d = xp === xc ? `M${xp} ${yp}V${yc}`
        : `M${xp} ${yp}C${xp} ${yp + h * 0.5} ${xc} ${yp + h * 0.5} ${xc} ${yp + h}V${yc}`;
      parts.push(svg("path", {d, class: `edge lane-${lane[c] % LANE_COLORS}`,
        dataset: {edgeFrom: this.turns[p].id, edgeTo: this.turns[c].id}}));
    };
    const end = Math.min(n, r1 + 1);
    for (let r = r0; r < end; r++) {
      const c = order[r];
      if (parent[c] >= 0 && (r < r1 || row[parent[c]] < r1) && row[c] - row[parent[c]] === 1) edge(c);
    }
    for (const c of longEdges) {
      const rp = row[parent[c]], rc = row[c];
      if (rp < r1 && rc >= r0) edge(c);
    }
    for (let r = r0; r < r1; r++) {
      const i = order[r];
      const t = this.turns[i];
      const cls = [`node role-${t.role}`, `lane-${lane[i] % LANE_COLORS}`];
      if (this.heads.has(t.id)) cls.push("head");
      if (t.id === this.selected) cls.push("selected");
      if (t.id === this.generating) cls.push("generating");
      parts.push(svg("circle", {cx: this.x(lane[i]), cy: y(r), r: t.role === "root" ? 5.5 : 4.5,
        class: cls.join(" "), dataset: {node: t.id}}, svg("title", {text: `${t.role} ${t.id}`})));
    }
    g.replaceChildren(...parts);
  }
}
