// DOM builders and number/time formatting. All text goes in through textContent / text nodes.

const SVG_NS = "http://www.w3.org/2000/svg";

function apply(node, attrs, children) {
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (name === "text") node.textContent = String(value);
    else if (name === "class") node.setAttribute("class", value);
    else if (name === "dataset") for (const [k, v] of Object.entries(value)) {
      if (v !== undefined && v !== null) node.dataset[k] = String(v);
    }
    else if (name === "style" && typeof value === "object") Object.assign(node.style, value);
    else if (name.startsWith("on") && typeof value === "function") node.addEventListener(name.slice(2), value);
    else node.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

/** el("div", {class: "x", dataset: {turnId: id}, text: "..."}, ...children) */
export function el(tag, attrs, ...children) {
  return apply(document.createElement(tag), attrs, children);
}

/** The same for SVG elements. */
export function svg(tag, attrs, ...children) {
  return apply(document.createElementNS(SVG_NS, tag), attrs, children);
}

/** Integer as plain digits ("" for null). */
export function fmtInt(n) {
  return n === null || n === undefined || !Number.isFinite(Number(n)) ? "" : String(Math.round(Number(n)));
}

/** One-decimal number ("" for null). */
export function fmt1(n) {
  return n === null || n === undefined || !Number.isFinite(Number(n)) ? "" : Number(n).toFixed(1);
}

/** A 0..1 ratio as a percentage with one decimal ("" for null). */
export function fmtPct(x) {
  return x === null || x === undefined || !Number.isFinite(Number(x)) ? "" : (Number(x) * 100).toFixed(1) + "%";
}

/** Compact count for labels: 1234 → "1.2k". */
export function fmtCompact(n) {
  if (n === null || n === undefined) return "";
  const a = Math.abs(n);
  if (a >= 1e6) return (n / 1e6).toFixed(a >= 1e7 ? 0 : 1) + "M";
  if (a >= 1e3) return (n / 1e3).toFixed(a >= 1e4 ? 0 : 1) + "k";
  return String(Math.round(n * 10) / 10);
}

export function fmtTime(ms) {
  if (!ms) return "";
  const d = new Date(ms);
  return d.toLocaleString(undefined, {year: "numeric", month: "short", day: "numeric",
    hour: "2-digit", minute: "2-digit", second: "2-digit"});
}

export function fmtClock(ms) {
  return new Date(ms).toLocaleTimeString(undefined, {hour: "2-digit", minute: "2-digit"});
}

export function fmtAgo(ms, now = Date.now()) {
  if (!ms) return "";
  const s = Math.max(0, Math.round((now - ms) / 1000));
  if (s < 60) return `${s}s ago`;
  if (s < 3600) return `${Math.floor(s / 60)}m ago`;
  if (s < 86400) return `${Math.floor(s / 3600)}h ago`;
  return `${Math.floor(s / 86400)}d ago`;
}

/** A short form of a long id for labels (the full id goes in a title). */
export function shortId(id) {
  if (!id) return "";
  const s = String(id);
  return s.length > 12 ? "…" + s.slice(-8) : s;
}

/** Text of an OpenAI-style message content: a string or a list of parts. */
export function contentText(content) {
  if (content === null || content === undefined) return "";
  if (typeof content === "string") return content;
  if (Array.isArray(content)) {
    return content.map((part) => {
      if (typeof part === "string") return part;
      if (part && typeof part.text === "string") return part.text;
      if (part && part.type) return `[${part.type}]`;
      return "";
    }).join("");
  }
  return JSON.stringify(content, null, 2);
}

/** Pretty JSON for tool arguments (which may arrive as an object or as a JSON string). */
export function prettyJSON(value) {
  if (typeof value === "string") {
    try { return JSON.stringify(JSON.parse(value), null, 2); } catch { return value; }
  }
  try { return JSON.stringify(value, null, 2); } catch { return String(value); }
}

export function debounce(fn, ms) {
  let timer = 0;
  const wrapped = (...args) => {
    clearTimeout(timer);
    timer = setTimeout(() => fn(...args), ms);
  };
  wrapped.cancel = () => clearTimeout(timer);
  return wrapped;
}
