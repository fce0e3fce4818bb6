// The turn tree's layout: rows in depth-first order and lanes, computed once per data change
// (O(n)); `tree.js` draws it.

/**
 * Rows in depth-first order with children in seq order; the first child continues its parent's
 * lane, later children (forks) get a lane reserved from the parent's row to their subtree's end.
 * `turns` must be sorted by seq (a parent always precedes its children).
 */
export function computeLayout(turns) {
  const n = turns.length;
  const index = new Map();
  for (let i = 0; i < n; i++) index.set(turns[i].id, i);
  const parent = new Int32Array(n).fill(-1);
  const kids = new Array(n);
  const roots = [];
  for (let i = 0; i < n; i++) {
    const p = turns[i].parent_id == null ? undefined : index.get(turns[i].parent_id);
    if (p === undefined || p >= i) roots.push(i);
    else {
      parent[i] = p;
      (kids[p] || (kids[p] = [])).push(i);
    }
  }
  // Preorder rows.
  const order = new Int32Array(n);
  const row = new Int32Array(n);
  const stack = roots.slice().reverse();
  let r = 0;
  while (stack.length) {
    const i = stack.pop();
    order[r] = i;
    row[i] = r++;
    const ch = kids[i];
    if (ch) for (let k = ch.length - 1; k >= 0; k--) stack.push(ch[k]);
  }
  // Subtree sizes, bottom-up over the rows.
  const size = new Int32Array(n);
  for (let q = n - 1; q >= 0; q--) {
    const i = order[q];
    let s = 1;
    const ch = kids[i];
    if (ch) for (const c of ch) s += size[c];
    size[i] = s;
  }
  // Lanes.
  const lane = new Int32Array(n);
  const used = [];
  const release = new Map(); // row → lanes free after it
  const alloc = (untilRow) => {
    let L = used.indexOf(false);
    if (L < 0) { L = used.length; used.push(true); } else used[L] = true;
    const list = release.get(untilRow);
    if (list) list.push(L); else release.set(untilRow, [L]);
    return L;
  };
  const longEdges = []; // child indices whose edge spans more than one row (forks)
  for (let q = 0; q < n; q++) {
    const i = order[q];
    if (parent[i] < 0) lane[i] = alloc(q + size[i] - 1);
    const ch = kids[i];
    if (ch) {
      lane[ch[0]] = lane[i];
      for (let k = 1; k < ch.length; k++) {
        const c = ch[k];
        lane[c] = alloc(row[c] + size[c] - 1);
        longEdges.push(c);
      }
    }
    const free = release.get(q);
    if (free) { for (const L of free) used[L] = false; release.delete(q); }
  }
  return {n, index, parent, kids, order, row, lane, numLanes: Math.max(1, used.length), longEdges};
}
