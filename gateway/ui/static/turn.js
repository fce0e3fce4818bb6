// The turn detail panel: messages, tool calls, usage, the computed prompt delta, and actions.

import {el, fmtInt, fmt1, fmtTime, contentText, prettyJSON} from "./format.js";
import {getJSON, postJSON, enc, isAbort} from "./api.js";
import {setStatus, showError} from "./status.js";

function section(title, ...children) {
  return el("section", {class: "detail-section"}, el("h4", {text: title}), ...children);
}

function renderMessage(message, callsShownApart) {
  const role = (message && message.role) || "message";
  const node = el("div", {class: `message role-${role}`},
    el("div", {class: "message-role"}, el("span", {class: "role", text: role}),
      message.name ? el("span", {class: "muted", text: ` ${message.name}`}) : null,
      message.tool_call_id ? el("span", {class: "muted", text: ` result of ${message.tool_call_id}`}) : null));
  const text = contentText(message.content);
  if (text) node.append(el("pre", {class: "message-content", text}));
  if (callsShownApart && (message.tool_calls || []).length) {
    const names = message.tool_calls.map((c) => (c.function || c).name || "tool").join(", ");
    node.append(el("div", {class: "muted small", text: `→ calls ${names} (below)`}));
  }
  for (const call of callsShownApart ? [] : message.tool_calls || []) {
    const fn = call.function || call;
    node.append(el("div", {class: "tool-call"},
      el("div", {}, el("b", {text: fn.name || "tool"}), el("code", {class: "muted", text: ` ${call.id || ""}`})),
      el("pre", {text: prettyJSON(fn.arguments ?? {})})));
  }
  if (!text && !(message.tool_calls || []).length) node.append(el("div", {class: "muted", text: "(empty)"}));
  return node;
}

// GET turn's usage may lack the derived rate: take the tree row's, else derive it the same way.
function decodeRate(usage, treeTurn) {
  const known = usage?.decode_tokens_per_s ?? treeTurn?.usage?.decode_tokens_per_s;
  if (known != null) return known;
  const ms = Number(usage?.decode_ms), out = Number(usage?.output_tokens);
  return ms > 0 && out > 1 ? (out - 1) / (ms / 1000) : null;
}

function usageTable(usage, turn, treeTurn) {
  const rows = [
    ["input tokens", fmtInt(usage?.input_tokens)],
    ["cached tokens", fmtInt(usage?.cached_tokens)],
    ["computed tokens", fmtInt(usage?.computed_tokens)],
    ["output tokens", fmtInt(usage?.output_tokens)],
    ["TTFT (ms)", fmt1(usage?.ttft_ms)],
    ["queue (ms)", fmt1(usage?.queue_ms)],
    ["decode (ms)", fmt1(usage?.decode_ms)],
    ["decode tok/s", fmt1(decodeRate(usage, treeTurn))],
    ["drafted / accepted", usage?.drafted_tokens == null ? "" : `${fmtInt(usage.drafted_tokens)} / ${fmtInt(usage.accepted_tokens)}`],
    ["finish reason", turn.finish_reason || ""],
    ["worker", treeTurn?.worker || ""],
  ];
  return el("table", {class: "kv"}, el("tbody", {}, rows.map(([k, v]) =>
    el("tr", {}, el("th", {text: k}), el("td", {text: v || "–"})))));
}

export class TurnDetail {
  /** `onChanged()` refreshes the tree after an action. */
  constructor(container, {sessionId, onChanged, lookup}) {
    this.container = container;
    this.lookup = lookup || (() => null);
    this.sid = sessionId;
    this.onChanged = onChanged;
    this.ctrl = null;
    this.tid = null;
    this.branches = {};
    this.defaultBranch = "main";
    this.placeholder();
  }

  dispose() { if (this.ctrl) this.ctrl.abort(); }

  placeholder() {
    if (this.ctrl) this.ctrl.abort();
    this.tid = null;
    this.shown = null;
    this.container.replaceChildren(el("div", {class: "detail-empty muted"},
      el("p", {text: "Click a turn to see its messages, the prompt the engine computed, and fork / rewind actions."})));
  }

  setBranches(branches, defaultBranch) {
    // Called on every tree redraw: a turn shown before its tree row had loaded gets its row now.
    if (this.shown && !this.shown.treeTurn) {
      const row = this.lookup(this.shown.turn.id);
      if (row) this.renderTurn(this.shown.turn, row);
    }
    this.branches = branches || {};
    this.defaultBranch = defaultBranch || "main";
    if (this.select) this.fillBranches();
    if (this.headsLine) this.fillHeads();
  }

  fillBranches() {
    const previous = this.select.value;
    const names = Object.keys(this.branches).sort();
    this.select.replaceChildren(...names.map((name) => el("option", {value: name, text: name})));
    this.select.value = names.includes(previous) ? previous
      : names.includes(this.defaultBranch) ? this.defaultBranch : names[0] || "";
  }

  fillHeads() {
    const here = Object.keys(this.branches).filter((name) => this.branches[name] === this.tid).sort();
    this.headsLine.textContent = here.length ? `head of ${here.join(", ")}` : "";
  }

  /** Shows turn `tid` (`treeTurn`: its row from the tree, when loaded). */
  show(tid, treeTurn) {
    if (this.ctrl) this.ctrl.abort();
    this.ctrl = new AbortController();
    const signal = this.ctrl.signal;
    this.tid = tid;
    this.shown = null;
    const root = el("section", {id: "turn-detail", class: "card", dataset: {turnId: tid}, tabindex: "-1"});
    this.roleEl = el("span", {class: `role role-${treeTurn?.role || ""}`, text: treeTurn?.role || "turn"});
    const title = el("h3", {}, this.roleEl,
      " ", el("code", {class: "turn-id", text: tid}));
    this.headsLine = el("div", {class: "heads-line"});
    this.facts = el("div", {class: "facts muted"});
    const close = el("a", {class: "close", href: `#/s/${enc(this.sid)}`, title: "Close", "aria-label": "Close", text: "×"});
    this.body = el("div", {class: "detail-body"}, el("p", {class: "muted", text: "Loading…"}));
    root.append(el("header", {class: "detail-head"}, title, close), this.headsLine, this.facts,
      this.body, this.renderComputedShell(), this.renderActions());
    this.fillHeads();
    // The panel goes in once its turn and computed text are there: #turn-detail[data-turn-id]
    // in the page means the content is complete.
    this.container.replaceChildren(el("section", {class: "card detail-loading muted"},
      el("p", {}, "Loading turn ", el("code", {text: tid}), "…")));
    this.load(tid, treeTurn, signal).then(() => {
      if (!signal.aborted && this.tid === tid) this.container.replaceChildren(root);
    }).catch(() => {});
  }

  renderComputedShell() {
    this.tail = el("span", {class: "cached-tail"});
    this.delta = el("span", {id: "computed-delta"});
    this.computedNote = el("p", {class: "muted small"});
    this.computedPre = el("pre", {class: "computed", hidden: true}, this.tail, this.delta);
    return section("Computed prompt (uncached suffix)", this.computedNote, this.computedPre);
  }

  renderActions() {
    const name = el("input", {name: "branch-name", type: "text", placeholder: "new branch name",
      autocomplete: "off", spellcheck: "false", required: true, "aria-label": "New branch name"});
    const forkBtn = el("button", {type: "submit", dataset: {action: "fork"}, text: "Fork from this turn"});
    const fork = el("form", {class: "action-row"}, name, forkBtn);
    fork.addEventListener("submit", (e) => { e.preventDefault(); this.fork(name, forkBtn); });
    this.select = el("select", {name: "rewind-branch", "aria-label": "Branch to rewind"});
    this.fillBranches();
    const rewindBtn = el("button", {type: "submit", dataset: {action: "rewind"}, text: "Rewind branch here"});
    const rewind = el("form", {class: "action-row"}, this.select, rewindBtn);
    rewind.addEventListener("submit", (e) => { e.preventDefault(); this.rewind(rewindBtn); });
    return section("Actions", fork, rewind);
  }

  async fork(input, button) {
    const branch = input.value.trim();
    if (!branch) { setStatus("Enter a name for the new branch.", "error"); input.focus(); return; }
    const tid = this.tid;
    button.disabled = true;
    try {
      await postJSON(`/v1/sessions/${enc(this.sid)}/fork`, {from_turn_id: tid, branch});
      input.value = "";
      setStatus(`Created branch "${branch}" at this turn.`, "ok");
      await this.onChanged();
    } catch (e) {
      if (!isAbort(e)) showError(e, "Fork failed");
    } finally {
      button.disabled = false;
    }
  }

  async rewind(button) {
    const branch = this.select.value;
    if (!branch) { setStatus("No branch to rewind.", "error"); return; }
    const tid = this.tid;
    button.disabled = true;
    try {
      await postJSON(`/v1/sessions/${enc(this.sid)}/rewind`, {branch, to_turn_id: tid});
      setStatus(`Rewound "${branch}" to this turn.`, "ok");
      await this.onChanged();
    } catch (e) {
      if (!isAbort(e)) showError(e, "Rewind failed");
    } finally {
      button.disabled = false;
    }
  }

  async load(tid, treeTurn, signal) {
    const base = `/v1/sessions/${enc(this.sid)}/turns/${enc(tid)}`;
    const [turnR, compR] = await Promise.allSettled([getJSON(base, {signal}), getJSON(`${base}/computed`, {signal})]);
    if (signal.aborted || this.tid !== tid) return;
    treeTurn = treeTurn || this.lookup(tid);
    if (turnR.status === "rejected") {
      const err = turnR.reason;
      if (isAbort(err)) return;
      this.body.replaceChildren(el("p", {class: "error", text: err.message || String(err)}));
      showError(err, "Turn");
    } else {
      this.renderTurn(turnR.value, treeTurn);
    }
    if (compR.status === "rejected") {
      if (isAbort(compR.reason)) return;
      this.computedNote.textContent = `Could not load the computed prompt: ${compR.reason.message || compR.reason}`;
      if (turnR.status !== "rejected") showError(compR.reason, "Computed prompt");
    } else {
      this.renderComputed(compR.value);
    }
  }

  renderTurn(turn, treeTurn) {
    this.shown = {turn, treeTurn};
    this.roleEl.textContent = turn.role;
    this.roleEl.className = `role role-${turn.role}`;
    this.facts.replaceChildren(...[
      turn.branch ? el("span", {text: `branch ${turn.branch}`}) : null,
      el("span", {text: `depth ${fmtInt(turn.depth)}`}),
      el("span", {text: `${fmtInt(turn.num_tokens)} tokens`}),
      el("span", {text: fmtTime(turn.created_ms)}),
      turn.parent_id ? el("a", {href: `#/s/${enc(this.sid)}/t/${enc(turn.parent_id)}`, text: "parent ↑"}) : null].filter(Boolean));
    const parts = [];
    const messages = turn.messages || [];
    parts.push(section(`Messages (${messages.length})`,
      messages.length ? el("div", {class: "messages"}, messages.map((m) => renderMessage(m, (turn.tool_calls || []).length > 0)))
        : el("p", {class: "muted", text: turn.role === "root" ? "The session's root (no messages)." : "No messages."})));
    const calls = turn.tool_calls || [];
    if (calls.length) {
      parts.push(section(`Tool calls (${calls.length})`, calls.map((call) => el("div", {class: "tool-call"},
        el("div", {}, el("b", {text: call.name}), el("code", {class: "muted", text: ` ${call.id || ""}`})),
        el("pre", {text: prettyJSON(call.arguments ?? {})})))));
    }
    if (turn.role === "assistant" || turn.usage) parts.push(section("Usage", usageTable(turn.usage, turn, treeTurn)));
    this.body.replaceChildren(...parts);
  }

  renderComputed(c) {
    this.tail.textContent = c.cached_tail ? "…" + c.cached_tail : "";
    this.delta.textContent = c.computed_text ?? "";
    this.computedPre.hidden = c.computed_text == null && !c.cached_tail;
    if (c.computed_text == null) {
      this.computedNote.textContent = "Only assistant turns run the engine: nothing computed here.";
    } else {
      this.computedNote.textContent = `${fmtInt(c.cached_tokens)} of ${fmtInt(c.input_tokens)} prompt tokens came `
        + `from the cache; the engine computed ${fmtInt(c.computed_tokens)}. The dimmed text is the end of the cached part.`;
    }
  }
}
