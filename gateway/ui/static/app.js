// Entry: hash routing, the nav bar, the key form, and the safety nets that keep errors in #status.

import {getKey, setKey, forgetKey, onKeyChange, setKeyPrompt} from "./api.js";
import {setStatus, showError, clearError, renderNotFound} from "./status.js";
import {SessionsPage} from "./sessions.js";
import {SessionPage} from "./session.js";
import {OverviewPage} from "./overview.js";

const view = document.getElementById("view");
const keyForm = document.getElementById("key-form");
const keyInput = keyForm.querySelector("input[name=api-key]");
const keyMessage = document.getElementById("key-message");
const keyStatus = document.getElementById("key-status");
const forgetLink = document.getElementById("forget-key");

let current = null; // {kind, sid, page}

function parseRoute() {
  const hash = location.hash.replace(/^#/, "") || "/";
  if (hash === "/" || hash === "/sessions") return {kind: "sessions"};
  if (hash === "/overview") return {kind: "overview"};
  const m = hash.match(/^\/s\/([^/]+)(?:\/t\/([^/]+))?\/?$/);
  if (m) {
    try {
      return {kind: "session", sid: decodeURIComponent(m[1]), tid: m[2] ? decodeURIComponent(m[2]) : null};
    } catch { /* malformed escape */ }
  }
  return {kind: "unknown"};
}

function markNav(kind) {
  for (const link of document.querySelectorAll("[data-nav]")) {
    const on = link.dataset.nav === kind || (link.dataset.nav === "sessions" && kind === "session");
    if (on) link.setAttribute("aria-current", "page"); else link.removeAttribute("aria-current");
  }
}

function route(force = false) {
  const r = parseRoute();
  markNav(r.kind);
  document.body.dataset.view = r.kind;
  if (!force && r.kind === "session" && current && current.kind === "session" && current.sid === r.sid
      && !current.page.disposed) {
    current.page.select(r.tid);
    return;
  }
  if (current) current.page.dispose();
  current = null;
  let page;
  if (r.kind === "sessions") page = new SessionsPage(view);
  else if (r.kind === "overview") page = new OverviewPage(view);
  else if (r.kind === "session") page = new SessionPage(view, r.sid);
  else {
    renderNotFound(view, "Page not found", `Nothing at ${location.hash}.`);
    return;
  }
  current = {kind: r.kind, sid: r.sid, page};
  document.title = r.kind === "session" ? `radixgate · ${r.sid}` : `radixgate · ${r.kind}`;
  window.scrollTo(0, 0);
  Promise.resolve(page.start(r.tid)).catch((e) => showError(e));
}

// Key status and the key form.
function showKeyState(key) {
  keyStatus.textContent = key ? `key …${key.slice(-4)}` : "no key";
  keyStatus.title = key ? "An API key is stored in this browser" : "Calls go without a key (open access)";
  forgetLink.hidden = !key;
}
onKeyChange(showKeyState);
showKeyState(getKey());

let waiting = [];
setKeyPrompt((message) => new Promise((resolve) => {
  waiting.push(resolve);
  keyMessage.textContent = message || "This gateway needs an API key.";
  setStatus(message || "An API key is needed.", "error");
  keyForm.hidden = false;
  keyInput.focus();
}));

keyForm.addEventListener("submit", (e) => {
  e.preventDefault();
  const key = keyInput.value.trim();
  if (!key) { keyInput.focus(); return; }
  setKey(key);
  keyInput.value = "";
  keyForm.hidden = true;
  clearError();
  const resolvers = waiting;
  waiting = [];
  for (const resolve of resolvers) resolve();
});

forgetLink.addEventListener("click", (e) => {
  e.preventDefault();
  forgetKey();
  setStatus("Key forgotten.", "ok");
  route(true);
});

// Safety nets: an unexpected error lands in #status, not in the console, and the page stays.
window.addEventListener("unhandledrejection", (e) => {
  e.preventDefault();
  const err = e.reason;
  if (err && (err.name === "AbortError")) return;
  showError(err, "Unexpected error");
});
window.addEventListener("radixgate:error", (e) => showError(e.detail, "Unexpected error"));

window.addEventListener("hashchange", () => route());
route();
