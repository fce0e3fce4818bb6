// The #status line and the "not found" view.

import {el} from "./format.js";

let timer = 0;

/** Shows `text` in #status; kind "error" stays until replaced, "info"/"ok" fade after a while. */
export function setStatus(text, kind = "info") {
  const node = document.getElementById("status");
  if (!node) return;
  clearTimeout(timer);
  node.textContent = text || "";
  node.dataset.kind = kind;
  node.hidden = !text;
  if (text && kind !== "error") {
    timer = setTimeout(() => { node.textContent = ""; node.hidden = true; }, 6000);
  }
}

export function clearStatus() { setStatus(""); }

/** Clears #status when it shows an error (a later success makes it moot). */
export function clearError() {
  const node = document.getElementById("status");
  if (node && node.dataset.kind === "error") setStatus("");
}

/** An API error (or any error) in #status: the server's error.message. */
export function showError(err, prefix = "") {
  const message = (err && err.message) || String(err);
  setStatus(prefix ? `${prefix}: ${message}` : message, "error");
}

/** Replaces `container`'s content with #not-found. */
export function renderNotFound(container, title = "Session not found", detail = "") {
  container.replaceChildren(el("section", {id: "not-found", class: "card not-found"},
    el("h2", {text: title}),
    detail ? el("p", {class: "muted", text: detail}) : null,
    el("p", {}, el("a", {href: "#/", text: "← Back to sessions"}))));
}
