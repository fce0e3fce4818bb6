// API access: fetch with the stored key, 401 → key form → retry, and an SSE reader over fetch.

const KEY_NAME = "radixgate.key";

export function getKey() {
  try { return localStorage.getItem(KEY_NAME) || ""; } catch { return ""; }
}

export function setKey(key) {
  try { localStorage.setItem(KEY_NAME, key); } catch { /* storage disabled: keep going without */ }
  notifyKey();
}

export function forgetKey() {
  try { localStorage.removeItem(KEY_NAME); } catch { /* ignore */ }
  notifyKey();
}

const keyListeners = new Set();
export function onKeyChange(fn) { keyListeners.add(fn); }
function notifyKey() { for (const fn of keyListeners) fn(getKey()); }

/** An API error: status, type and the server's message. */
export class ApiError extends Error {
  constructor(status, type, message, body = null) {
    super(message);
    this.name = "ApiError";
    this.status = status;
    this.type = type;
    this.body = body;
  }
}

export function isAbort(err) {
  return err && (err.name === "AbortError" || err.name === "TimeoutError");
}

async function errorFrom(res) {
  let body = null;
  try { body = await res.json(); } catch { /* not JSON */ }
  const err = body && body.error;
  const type = (err && err.type) || "http_error";
  const message = (err && err.message) || `${res.status} ${res.statusText || "error"}`;
  return new ApiError(res.status, type, message, body);
}

// The key form is the app's: it registers a function that shows the form and resolves once a key
// is stored. Concurrent 401s share one prompt.
let askForKey = null;
let pendingKey = null;
export function setKeyPrompt(fn) { askForKey = fn; }

function needKey(message) {
  if (!askForKey) return Promise.reject(new ApiError(401, "authentication_error", message));
  if (!pendingKey) {
    pendingKey = Promise.resolve(askForKey(message)).finally(() => { pendingKey = null; });
  }
  return pendingKey;
}

/** fetch() against the API; resolves with an ok Response, throws ApiError (or AbortError). */
export async function request(method, path, {body, signal, headers} = {}) {
  for (;;) {
    const h = {Accept: "application/json", ...(headers || {})};
    const key = getKey();
    if (key) h.Authorization = `Bearer ${key}`;
    const init = {method, headers: h, signal, cache: "no-store"};
    if (body !== undefined) {
      h["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    let res;
    try {
      res = await fetch(path, init);
    } catch (e) {
      if (isAbort(e)) throw e;
      throw new ApiError(0, "network_error", `Network error: ${e.message || e}`);
    }
    if (res.status === 401) {
      const err = await errorFrom(res);
      if (signal && signal.aborted) throw new DOMException("aborted", "AbortError");
      await needKey(err.message);
      continue;
    }
    if (!res.ok) throw await errorFrom(res);
    return res;
  }
}

export async function getJSON(path, opts) {
  const res = await request("GET", path, opts);
  return res.json();
}

export async function postJSON(path, body, opts) {
  const res = await request("POST", path, {...opts, body});
  return res.status === 204 ? null : res.json();
}

export async function del(path, opts) {
  await request("DELETE", path, opts);
}

export const enc = encodeURIComponent;

function sleep(ms, signal) {
  return new Promise((resolve) => {
    const t = setTimeout(resolve, ms);
    if (signal) signal.addEventListener("abort", () => { clearTimeout(t); resolve(); }, {once: true});
  });
}

/**
 * Reads a server-sent event stream with fetch (so it can carry Authorization), reconnecting with
 * Last-Event-ID. Callbacks: onEvent({id, type, data}), onState(connected), onFatal(error) for a
 * 4xx that retrying cannot fix. The stream stops after `session.deleted`, a fatal error or close().
 */
export class EventReader {
  constructor(url, {onEvent, onState, onFatal, lastEventId = null} = {}) {
    this.url = url;
    this.onEvent = onEvent || (() => {});
    this.onState = onState || (() => {});
    this.onFatal = onFatal || (() => {});
    this.lastEventId = lastEventId;
    this.ctrl = new AbortController();
    this.closed = false;
    this.finished = false; // the server said the stream is over (session.deleted)
  }

  start() {
    this.loop().catch(() => {});
    return this;
  }

  close() {
    this.closed = true;
    this.ctrl.abort();
  }

  async loop() {
    let delay = 500;
    while (!this.closed && !this.finished) {
      let connected = false;
      try {
        const headers = {Accept: "text/event-stream"};
        if (this.lastEventId) headers["Last-Event-ID"] = this.lastEventId;
        const res = await request("GET", this.url, {headers, signal: this.ctrl.signal});
        connected = true;
        this.onState(true);
        await this.read(res.body);
        delay = 500;
      } catch (e) {
        if (this.closed || isAbort(e)) break;
        if (e instanceof ApiError && e.status >= 400 && e.status < 500 && e.status !== 429) {
          this.onFatal(e);
          break;
        }
      } finally {
        if (connected) this.onState(false);
      }
      if (this.closed || this.finished) break;
      await sleep(delay, this.ctrl.signal);
      delay = Math.min(delay * 2, 10000);
    }
  }

  async read(body) {
    const reader = body.pipeThrough(new TextDecoderStream()).getReader();
    const signal = this.ctrl.signal;
    const cancel = () => { reader.cancel().catch(() => {}); };
    signal.addEventListener("abort", cancel, {once: true});
    let buf = "";
    let frame = {id: null, type: "", data: []};
    try {
      for (;;) {
        const {value, done} = await reader.read();
        if (done || this.closed) break;
        buf += value;
        // Keep a trailing "\r": it may be the first half of "\r\n".
        const end = buf.endsWith("\r") ? buf.length - 1 : buf.length;
        const lines = buf.slice(0, end).split(/\r\n|\r|\n/);
        buf = lines.pop() + buf.slice(end);
        for (const line of lines) {
          if (line === "") {
            if (frame.data.length) this.dispatch(frame);
            frame = {id: null, type: "", data: []};
            if (this.finished) return;
            continue;
          }
          if (line.startsWith(":")) continue; // comment (": ping")
          const colon = line.indexOf(":");
          const field = colon < 0 ? line : line.slice(0, colon);
          let value = colon < 0 ? "" : line.slice(colon + 1);
          if (value.startsWith(" ")) value = value.slice(1);
          if (field === "id") {
            if (!value.includes("\0")) { frame.id = value; this.lastEventId = value || null; }
          } else if (field === "event") frame.type = value;
          else if (field === "data") frame.data.push(value);
        }
      }
    } finally {
      signal.removeEventListener("abort", cancel);
      if (this.finished || this.closed) cancel();
    }
  }

  dispatch(frame) {
    let data = null;
    const text = frame.data.join("\n");
    try { data = JSON.parse(text); } catch { data = {text}; }
    const type = frame.type || (data && data.type) || "message";
    if (type === "session.deleted") this.finished = true;
    try {
      this.onEvent({id: frame.id, type, data: data || {}});
    } catch (e) {
      // A handler bug must not kill the stream; surface it without a console error.
      window.dispatchEvent(new CustomEvent("radixgate:error", {detail: e}));
    }
  }
}
