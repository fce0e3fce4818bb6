// One session's page: its tree (paged in, then kept live from the event stream) and the detail.

import {el, fmtInt, fmtTime, shortId} from "./format.js";
import {getJSON, del, enc, EventReader, isAbort} from "./api.js";
import {setStatus, showError, renderNotFound} from "./status.js";
import {TreeView} from "./tree.js";
import {computeLayout} from "./layout.js";
import {TurnDetail} from "./turn.js";
import {LiveStrip} from "./live.js";

const PAGE = 2000;
// The first page is smaller: it is drawn (data-ready) while the rest loads in pages of PAGE.
const FIRST_PAGE = 400;

export class SessionPage {
  constructor(view, sessionId) {
    this.view = view;
    this.sid = sessionId;
    this.turns = [];
    this.byId = new Map();
    this.session = null;
    this.loaded = 0; // the next tree offset to read
    this.selected = null;
    this.ctrl = new AbortController();
    this.refreshing = null;
    this.again = false;
    this.disposed = false;
    this.build();
  }

  build() {
    this.title = el("h2", {class: "session-title"}, el("span", {class: "muted", text: "Session "}),
      el("code", {text: this.sid}));
    this.meta = el("div", {class: "session-meta muted"});
    this.branchBar = el("div", {class: "branch-bar", "aria-label": "Branches"});
    this.liveDot = el("span", {class: "live-dot", title: "event stream", text: "offline"});
    this.banner = el("div", {class: "banner", hidden: true});
    const delBtn = el("button", {type: "button", class: "danger", dataset: {action: "delete-session"},
      text: "Delete session"});
    delBtn.addEventListener("click", () => this.deleteSession(delBtn));
    this.delBtn = delBtn;
    const head = el("header", {class: "session-head"},
      el("div", {class: "session-head-row"}, this.title, this.liveDot, delBtn), this.meta, this.branchBar, this.banner);
    this.treeEl = el("div", {id: "tree", class: "tree", tabindex: "0", dataset: {sessionId: this.sid},
      "aria-label": "Turn tree"});
    this.detailEl = el("aside", {class: "detail-panel", "aria-label": "Turn detail"});
    this.view.replaceChildren(el("div", {class: "session-page"}, head,
      el("div", {class: "session-body"}, el("div", {class: "tree-panel"}, this.treeEl), this.detailEl)));
    this.tree = new TreeView(this.treeEl, {sessionId: this.sid});
    this.live = new LiveStrip(this.treeEl, this.tree, (id) => this.byId.get(id) || null);
    this.treeEl.addEventListener("keydown", (e) => {
      const step = {ArrowDown: 1, ArrowUp: -1, j: 1, k: -1}[e.key];
      if (!step || e.altKey || e.ctrlKey || e.metaKey) return;
      e.preventDefault();
      const next = this.tree.neighbor(this.selected, step);
      if (next) location.hash = `#/s/${enc(this.sid)}/t/${enc(next)}`;
    });
    this.detail = new TurnDetail(this.detailEl, {sessionId: this.sid, onChanged: () => this.refresh(),
      lookup: (id) => this.byId.get(id) || null});
  }

  dispose() {
    this.disposed = true;
    this.ctrl.abort();
    if (this.events) this.events.close();
    this.tree.destroy();
    this.detail.dispose();
    this.live.dispose();
  }

  async start(tid) {
    this.selected = tid || null;
    if (tid) this.detail.show(tid, null);
    try {
      let page = await this.fetchPage(0, FIRST_PAGE);
      if (this.disposed) return;
      this.absorb(page);
      this.redraw();
      if (tid) this.tree.reveal(tid);
      this.treeEl.dataset.ready = "1";
      while (page.next_offset != null && !this.disposed) {
        page = await this.fetchPage(this.loaded);
        this.absorb(page);
        this.redraw();
      }
      if (tid) this.tree.reveal(tid);
    } catch (e) {
      if (this.disposed || isAbort(e)) return;
      if (e.status === 404) {
        this.dispose();
        renderNotFound(this.view, "Session not found",
          `There is no session ${this.sid} for this key (it may have been deleted).`);
        return;
      }
      showError(e, "Loading the tree");
      this.treeEl.dataset.ready = "1";
    }
    if (!this.disposed) this.listen();
  }

  fetchPage(offset, limit = PAGE) {
    return getJSON(`/v1/sessions/${enc(this.sid)}/tree?offset=${offset}&limit=${limit}`, {signal: this.ctrl.signal});
  }

  /** Takes in one tree page: the session's state, the total, and its turns (deduplicated). */
  absorb(page) {
    this.session = page.session;
    this.total = page.num_turns;
    let sorted = true;
    for (const t of page.turns || []) {
      if (this.byId.has(t.id)) continue;
      if (this.turns.length && t.seq < this.turns[this.turns.length - 1].seq) sorted = false;
      this.turns.push(t);
      this.byId.set(t.id, t);
    }
    if (!sorted) this.turns.sort((a, b) => a.seq - b.seq);
    this.loaded = page.next_offset != null ? page.next_offset : page.offset + (page.turns || []).length;
  }

  redraw() {
    const s = this.session;
    this.treeEl.dataset.numTurns = String(this.total);
    const layout = computeLayout(this.turns);
    this.tree.update(this.turns, layout, s.branches, s.default_branch);
    this.tree.setSelected(this.selected);
    this.renderHead();
    this.detail.setBranches(s.branches, s.default_branch);
    this.live.settle(layout);
  }

  renderHead() {
    const s = this.session;
    const meta = Object.entries(s.metadata || {}).map(([k, v]) =>
      el("span", {class: "chip", text: `${k}=${typeof v === "string" ? v : JSON.stringify(v)}`}));
    const loading = this.loaded < this.total ? ` (${fmtInt(this.loaded)} loaded)` : "";
    this.meta.replaceChildren(el("span", {text: s.model || ""}),
      el("span", {text: `${fmtInt(this.total)} turns${loading}`}),
      el("span", {text: `created ${fmtTime(s.created_ms)}`}),
      el("span", {text: `v${fmtInt(s.version)}`}), ...meta);
    const names = Object.keys(s.branches || {}).sort((a, b) =>
      (a === s.default_branch ? -1 : b === s.default_branch ? 1 : a.localeCompare(b)));
    this.branchBar.replaceChildren(el("span", {class: "muted", text: "branches:"}), ...names.map((name) =>
      el("a", {class: "branch-link" + (name === s.default_branch ? " default" : ""), dataset: {branch: name},
        href: `#/s/${enc(this.sid)}/t/${enc(s.branches[name])}`, title: `head ${s.branches[name]}`,
        text: `${name} → ${shortId(s.branches[name])}`})));
  }

  /** Selects a turn (from the route): highlight, reveal, detail. */
  select(tid) {
    if (tid === this.selected && (tid === null || this.detail.tid === tid)) return;
    this.selected = tid;
    this.tree.setSelected(tid);
    if (!tid) { this.detail.placeholder(); return; }
    this.tree.reveal(tid);
    this.detail.show(tid, this.byId.get(tid) || null);
    if (matchMedia("(max-width: 820px)").matches) {
      this.detailEl.scrollIntoView({block: "start", behavior: "smooth"});
    }
  }

  /** Reads the tree from the offset already loaded (new turns) and the session's branches. */
  refresh() {
    if (this.refreshing) { this.again = true; return this.refreshing; }
    this.refreshing = (async () => {
      do {
        this.again = false;
        let page;
        do {
          page = await this.fetchPage(this.loaded);
          if (this.disposed) return;
          this.absorb(page);
        } while (page.next_offset != null);
        this.redraw();
      } while (this.again && !this.disposed);
    })().catch((e) => {
      if (this.disposed || isAbort(e)) return;
      if (e.status === 404) this.markDeleted();
      else showError(e, "Refreshing the tree");
    }).finally(() => { this.refreshing = null; });
    return this.refreshing;
  }

  listen() {
    this.events = new EventReader(`/v1/sessions/${enc(this.sid)}/events`, {
      onEvent: (ev) => this.onEvent(ev),
      onState: (up) => {
        if (up) this.treeEl.dataset.live = "1"; else delete this.treeEl.dataset.live;
        this.liveDot.textContent = up ? "live" : "offline";
        this.liveDot.classList.toggle("on", up);
        if (up && this.connectedOnce) this.refresh();
        if (up) this.connectedOnce = true;
      },
      onFatal: (e) => { if (e.status === 404) this.markDeleted(); else showError(e, "Event stream"); },
    }).start();
  }

  onEvent({type, data}) {
    if (this.disposed) return;
    const stale = typeof data.version === "number" && this.session && data.version <= this.session.version;
    switch (type) {
      case "turns.appended": {
        const known = (data.turn_ids || []).every((id) => this.byId.has(id));
        if (!(known && stale)) this.refresh();
        break;
      }
      case "branch.created":
      case "branch.moved":
        if (!stale) this.refresh();
        break;
      case "generation.started":
      case "generation.delta":
      case "generation.ended": this.live.onEvent(type, data); break;
      case "session.deleted": this.markDeleted(); break;
      default: break; // session.created, error (the reader reconnects), future types
    }
  }

  markDeleted() {
    if (this.deletedShown) return;
    this.deletedShown = true;
    if (this.events) this.events.close();
    delete this.treeEl.dataset.live;
    this.liveDot.textContent = "deleted";
    this.liveDot.classList.remove("on");
    this.banner.hidden = false;
    this.delBtn.disabled = true;
    this.banner.replaceChildren("This session was deleted. ", el("a", {href: "#/", text: "Back to sessions"}));
    setStatus(`Session ${this.sid} was deleted.`, "error");
  }

  async deleteSession(button) {
    if (!confirm(`Delete session ${this.sid} and all of its turns? This cannot be undone.`)) return;
    button.disabled = true;
    this.deleting = true;
    try {
      await del(`/v1/sessions/${enc(this.sid)}`);
      setStatus(`Deleted session ${this.sid}.`, "ok");
      this.deletedShown = true;
      location.hash = "#/";
    } catch (e) {
      if (!isAbort(e)) showError(e, "Delete failed");
      button.disabled = false;
    }
  }
}
