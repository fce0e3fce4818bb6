// The strip under the tree that shows a turn's text while it generates (the session event
// stream's generation.* events), pinned to the bottom of the tree; its turn's node pulses.

import {el, shortId} from "./format.js";

const LINGER_MS = 1500; // a finished generation stays shown this long

export class LiveStrip {
  /** `tree`: the TreeView (reveal, setGenerating); `lookup(id)`: a loaded turn or null. */
  constructor(treeEl, tree, lookup) {
    this.tree = tree;
    this.lookup = lookup;
    this.gens = new Map(); // input turn id → {parent, text, done}
    this.liveId = null;
    this.text = el("pre", {id: "live-text"});
    this.label = el("button", {type: "button", class: "live-label linklike"});
    this.label.addEventListener("click", () => { const a = this.anchor(); if (a) this.tree.reveal(a); });
    this.box = el("div", {class: "live-box", hidden: true}, this.label, this.text);
    treeEl.append(this.box);
  }

  dispose() { clearTimeout(this.timer); }

  onEvent(type, d) {
    if (type === "generation.started") this.start(d);
    else if (type === "generation.delta") this.delta(d);
    else if (type === "generation.ended") this.end(d);
  }

  start(d) {
    this.gens.set(d.input_turn_id, {parent: d.parent_turn_id, text: "", done: false});
    this.liveId = d.input_turn_id;
    this.text.textContent = "";
    this.update();
  }

  delta(d) {
    let g = this.gens.get(d.input_turn_id);
    if (!g) { g = {parent: null, text: "", done: false}; this.gens.set(d.input_turn_id, g); }
    g.text += d.text || "";
    if (!this.liveId || this.gens.get(this.liveId)?.done) { this.liveId = d.input_turn_id; this.text.textContent = g.text; }
    else if (this.liveId === d.input_turn_id) this.text.append(d.text || "");
    this.update();
  }

  end(d) {
    const g = this.gens.get(d.input_turn_id);
    if (g) g.done = true;
    clearTimeout(this.timer);
    this.timer = setTimeout(() => {
      for (const [id, gen] of this.gens) if (gen.done) this.gens.delete(id);
      const next = [...this.gens.keys()].pop() || null;
      this.liveId = next;
      this.text.textContent = next ? this.gens.get(next).text : "";
      this.update();
    }, LINGER_MS);
    this.update();
  }

  /** A generation whose reply is in the tree is over, even if its "ended" event went missing. */
  settle(layout) {
    for (const [id, g] of this.gens) {
      const i = layout.index.get(id);
      if (!g.done && i !== undefined && layout.kids[i]) this.end({input_turn_id: id});
    }
    this.update();
  }

  anchor() {
    const id = this.liveId;
    if (!id) return null;
    if (this.lookup(id)) return id;
    const parent = this.gens.get(id)?.parent;
    return parent && this.lookup(parent) ? parent : null;
  }

  update() {
    const id = this.liveId;
    const g = id ? this.gens.get(id) : null;
    this.box.hidden = !g;
    if (!g) {
      this.text.removeAttribute("data-input-turn-id");
      this.tree.setGenerating(null);
      return;
    }
    this.text.dataset.inputTurnId = id;
    this.box.classList.toggle("done", g.done);
    const anchor = this.anchor();
    const t = anchor ? this.lookup(anchor) : null;
    this.label.textContent = `${g.done ? "generated" : "generating"} after ${t ? `${t.role} turn ${shortId(anchor)}` : `turn ${shortId(id)}`}:`;
    this.tree.setGenerating(g.done ? null : anchor);
  }
}
