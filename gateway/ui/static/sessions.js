// The sessions list: newest first, searchable by id and metadata, paged with "load more".

import {el, fmtInt, fmtTime, fmtAgo, debounce} from "./format.js";
import {getJSON, enc, isAbort} from "./api.js";
import {showError, clearError} from "./status.js";

const LIMIT = 50;

function sessionItem(s) {
  const meta = Object.entries(s.metadata || {}).slice(0, 6).map(([k, v]) =>
    el("span", {class: "chip", text: `${k}=${typeof v === "string" ? v : JSON.stringify(v)}`}));
  const branches = Object.keys(s.branches || {});
  return el("a", {class: "session-item", href: `#/s/${enc(s.id)}`, dataset: {sessionId: s.id}},
    el("div", {class: "session-item-top"},
      el("code", {class: "session-id", text: s.id}),
      el("span", {class: "muted", title: fmtTime(s.created_ms), text: fmtAgo(s.created_ms)})),
    el("div", {class: "session-item-meta muted"},
      el("span", {text: s.model || ""}),
      el("span", {text: `${fmtInt(s.num_turns)} turns`}),
      el("span", {text: `${branches.length} branch${branches.length === 1 ? "" : "es"}`}),
      ...meta));
}

export class SessionsPage {
  constructor(view) {
    this.view = view;
    this.ctrl = null;
    this.cursor = null;
    this.seq = 0;
    this.search = el("input", {id: "session-search", type: "search", placeholder: "Search by id or metadata…",
      autocomplete: "off", spellcheck: "false", "aria-label": "Search sessions"});
    this.list = el("div", {id: "sessions", class: "sessions", "aria-live": "polite"});
    this.more = el("button", {type: "button", class: "load-more", hidden: true, text: "Load more"});
    this.note = el("p", {class: "muted empty-note", hidden: true});
    this.count = el("span", {class: "muted"});
    const run = debounce(() => this.load(false), 250);
    this.search.addEventListener("input", run);
    this.search.addEventListener("keydown", (e) => { if (e.key === "Enter") { run.cancel(); this.load(false); } });
    this.more.addEventListener("click", () => this.load(true));
    this.run = run;
    view.replaceChildren(el("section", {class: "sessions-page"},
      el("div", {class: "toolbar"}, el("h2", {text: "Sessions"}), this.count, this.search),
      this.list, this.note, this.more));
  }

  dispose() {
    this.run.cancel();
    if (this.ctrl) this.ctrl.abort();
  }

  start() {
    return this.load(false);
  }

  async load(append) {
    if (this.ctrl) this.ctrl.abort();
    const ctrl = this.ctrl = new AbortController();
    const q = this.search.value.trim();
    const params = new URLSearchParams({limit: String(LIMIT)});
    if (q) params.set("q", q);
    if (append && this.cursor) params.set("cursor", this.cursor);
    this.more.disabled = true;
    this.list.setAttribute("aria-busy", "true");
    try {
      const page = await getJSON(`/v1/sessions?${params}`, {signal: ctrl.signal});
      if (ctrl.signal.aborted) return;
      const items = (page.data || []).map(sessionItem);
      if (append) this.list.append(...items); else this.list.replaceChildren(...items);
      this.cursor = page.next_cursor || null;
      this.more.hidden = !this.cursor;
      const shown = this.list.childElementCount;
      this.count.textContent = `${shown}${this.cursor ? "+" : ""} shown`;
      this.note.hidden = shown > 0;
      this.note.textContent = q ? `No session matches "${q}".` : "No sessions yet. Sessions appear here as agents create them.";
      clearError();
    } catch (e) {
      if (isAbort(e)) return;
      showError(e, "Listing sessions");
    } finally {
      if (this.ctrl === ctrl) {
        this.more.disabled = false;
        this.list.removeAttribute("aria-busy");
      }
    }
  }
}
