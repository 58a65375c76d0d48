// The hlbl serve page: live next-word predictions, samples, and an explorer of the learned word tree.
// Plain JavaScript against the JSON API (/v1/...); no build step, no library.
"use strict";

const $ = (sel) => document.querySelector(sel);
const state = {
  seq: 0,            // the latest prediction asked; older answers are dropped
  context: "",
  selected: null,    // the predicted word whose decisions are shown
  hasTree: false,
  nodes: new Map(),  // node id -> {row, kids (ul), loaded, open}
  leaves: new Map(), // word -> [leaf rows]
  pathMarks: [],     // rows marked as the selected word's path
};

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

async function api(path, body) {
  const opts = body === undefined ? {} :
    { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) };
  const r = await fetch(path, opts);
  let data;
  try { data = await r.json(); } catch (e) { data = { error: r.statusText }; }
  if (!r.ok) throw new Error(data.error || r.statusText);
  return data;
}

const pct = (p) => (p >= 0.1 ? (100 * p).toFixed(1) : (100 * p).toPrecision(2)) + "%";
const fmt = (x) => x.toLocaleString("en-US");

function split(pLeft) {  // a bar: P(left) in one colour, P(right) in the other
  const s = el("div", "split");
  s.title = `P(left) ${pLeft.toFixed(3)}   P(right) ${(1 - pLeft).toFixed(3)}`;
  const l = el("span", "l"); l.style.width = (100 * pLeft) + "%";
  const r = el("span", "r"); r.style.width = (100 * (1 - pLeft)) + "%";
  s.append(l, r);
  return s;
}

// ---- the model ----------------------------------------------------------------------------------

async function init() {
  const m = await api("/v1/model");
  $("#run-name").textContent = m.run;
  const parts = [`${fmt(m.vocab_size)} words`, `d = ${m.dim}`, `context ${m.context}`, `${m.output} output`];
  if (m.valid_perplexity) parts.push(`valid perplexity ${m.valid_perplexity.toFixed(1)}`);
  if (m.test_perplexity) parts.push(`test perplexity ${m.test_perplexity.toFixed(1)}`);
  if (m.tree) parts.push(`tree: ${fmt(m.tree.internal_nodes)} nodes, mean code length ${m.tree.mean_code_length.toFixed(2)}, ` +
                         `${m.tree.codes_per_word.toFixed(2)} codes per word, max depth ${m.tree.max_depth}`);
  $("#model-line").textContent = parts.join(" · ");
  state.hasTree = !!m.tree;
  if (state.hasTree) {
    await buildTree();
  } else {
    $("#tree").textContent = "This model has no word tree.";
    $("#search-form").hidden = true;
  }
  await predict();
}

// ---- next words ---------------------------------------------------------------------------------

async function predict() {
  const seq = ++state.seq;
  const context = $("#context").value;
  let r;
  try {
    r = await api("/v1/predict", { context, k: +$("#k").value });
  } catch (e) {
    if (seq === state.seq) $("#predictions").replaceChildren(el("li", "error", e.message));
    return;
  }
  if (seq !== state.seq) return;
  state.context = context;
  $("#context-used").textContent = "context: " + r.context.join(" ") + (r.oov ? `  (${r.oov} unknown → <unk>)` : "");
  const list = $("#predictions");
  list.replaceChildren();
  const top = r.probs[0] || 1;
  r.words.forEach((w, i) => {
    const li = el("li");
    li.dataset.word = w;
    const bar = el("div", "bar"); const fill = el("span"); fill.style.width = (100 * r.probs[i] / top) + "%";
    bar.append(fill);
    li.append(el("span", "word", w), bar, el("span", "prob", pct(r.probs[i])));
    li.title = "click: add to the text; the decisions below show this word";
    li.addEventListener("click", () => addWord(w));
    li.addEventListener("mouseenter", () => select(w));
    list.append(li);
  });
  state.selected = null;  // a new context: the decisions follow its top word (hovering shows another's)
  await Promise.all([select(r.words[0]), refreshPLeft()]);
}

function addWord(w) {
  const box = $("#context");
  if (w === "<eos>") box.value = "";  // the sentence ended: a new one starts
  else box.value = box.value.replace(/\s*$/, box.value.trim() ? " " : "") + w + " ";
  box.focus();
  predict();
}

async function sample() {
  const prompt = $("#context").value;
  const seed = +$("#seed").value || 0;
  const out = $("#sample-out");
  try {
    const r = await api("/v1/generate", { prompt, tokens: +$("#tokens").value, seed, temperature: +$("#temperature").value });
    out.replaceChildren(el("span", "prompt", prompt.trim() + (prompt.trim() ? " " : "")),
                        document.createTextNode(r.words.map((w) => (w === "<eos>" ? "⏎\n" : w + " ")).join("")));
    $("#seed").value = seed + 1;  // the next press draws another sample; the seed shown reproduces this one
  } catch (e) {
    out.replaceChildren(el("span", "error", e.message));
  }
}

// ---- decisions on the way to a word ---------------------------------------------------------------

async function select(word) {
  if (!word || word === state.selected) return;
  state.selected = word;
  for (const li of document.querySelectorAll("#predictions li")) li.classList.toggle("selected", li.dataset.word === word);
  $("#path-word").textContent = word;
  if (!state.hasTree) { $("#decisions").textContent = "This model has no word tree."; return; }
  let r;
  try { r = await api("/v1/tree/path", { context: state.context, word }); } catch (e) {
    $("#decisions").replaceChildren(el("p", "error", e.message)); return;
  }
  if (word !== state.selected) return;
  const box = $("#decisions");
  box.replaceChildren();
  r.paths.forEach((p, i) => {
    const head = el("p", null, (r.paths.length > 1 ? `path ${i + 1} of ${r.paths.length}: ` : "") +
      `P = ${p.prob.toPrecision(3)} over ${p.nodes.length} decisions ` + (r.paths.length > 1 ? `(P(word) = ${r.prob.toPrecision(3)})` : ""));
    const show = el("button", null, "show in tree");
    show.type = "button";
    show.addEventListener("click", () => revealPath(p.nodes, word, "predicted"));
    head.append(" ", show);
    const t = el("table", "path");
    const hr = el("tr");
    for (const h of ["step", "node", "P(left)", "", "goes", "P(branch)"]) hr.append(el("th", null, h));
    t.append(hr);
    p.nodes.forEach((node, j) => {
      const tr = el("tr");
      const c = el("td"); c.append(split(p.p_left[j]));
      tr.append(el("td", "num", String(j + 1)), el("td", "num", "#" + node), el("td", "num", p.p_left[j].toFixed(3)), c,
                el("td", p.bits[j] ? "go-left" : "go-right", p.bits[j] ? "left" : "right"), el("td", "num", p.p_taken[j].toFixed(3)));
      t.append(tr);
    });
    box.append(head, t);
  });
  if (r.paths.length) markPath(r.paths.flatMap((p) => p.nodes), "predicted");
}

// ---- the tree explorer ------------------------------------------------------------------------------

async function buildTree() {
  const root = await api("/v1/tree/node/0");
  const ul = el("ul");
  ul.append(nodeItem({ kind: "node", node: 0, words: root.words, top: root.top }, null));
  $("#tree").replaceChildren(ul);
  await expand(0);
}

function nodeItem(kid, side) {
  const li = el("li");
  if (kid.kind === "leaf") {
    const row = el("div", "row leaf");
    row.dataset.word = kid.word;
    row.append(el("span", "toggle", "•"), el("span", "side " + (side || ""), side === "left" ? "L" : side === "right" ? "R" : ""));
    const meta = el("span", "meta");
    meta.append(el("span", "word", kid.word), " ", el("span", "badge", `count ${fmt(kid.count)}`));
    if (kid.codes > 1) meta.append(" ", el("span", "badge", `${kid.codes} codes`));
    row.append(meta);
    li.append(row);
    if (!state.leaves.has(kid.word)) state.leaves.set(kid.word, []);
    state.leaves.get(kid.word).push(row);
    return li;
  }
  const row = el("div", "row node");
  row.dataset.node = kid.node;
  const label = el("span", "id");
  if (side) label.append(el("span", "side " + side, side === "left" ? "L " : "R "));
  label.append("#" + kid.node);
  const more = kid.words > kid.top.length ? ", …" : "";
  row.append(el("span", "toggle", "▸"), label, el("span", "meta", `${fmt(kid.words)} words: ${kid.top.join(", ")}${more}`),
             el("span", "pl"));
  const kids = el("ul");
  kids.hidden = true;
  li.append(row, kids);
  state.nodes.set(kid.node, { row, kids, loaded: false, open: false });
  row.addEventListener("click", () => (state.nodes.get(kid.node).open ? collapse(kid.node) : expand(kid.node)));
  if (kid.p_left !== undefined) setPLeft(kid.node, kid.p_left);
  return li;
}

function setPLeft(node, p) {
  const n = state.nodes.get(node);
  if (n) n.row.querySelector(".pl").replaceChildren(split(p));
}

async function expand(node) {
  const n = state.nodes.get(node);
  if (!n) return;
  if (!n.loaded) {
    n.loaded = true;
    let r;
    try { r = await api(`/v1/tree/node/${node}`); } catch (e) {
      n.loaded = false;  // the next click asks again
      n.row.querySelector(".meta").textContent = e.message;
      return;
    }
    r.children.forEach((kid, i) => n.kids.append(nodeItem(kid, i === 0 ? "left" : "right")));
    refreshPLeft();
  }
  n.open = true;
  n.kids.hidden = false;
  n.row.querySelector(".toggle").textContent = "▾";
}

function collapse(node) {
  const n = state.nodes.get(node);
  n.open = false;
  n.kids.hidden = true;
  n.row.querySelector(".toggle").textContent = "▸";
}

async function refreshPLeft() {  // P(left) under the typed context, for every node shown
  if (!state.hasTree) return;
  const nodes = [...state.nodes.keys()].slice(0, 1000);
  const context = state.context;
  try {
    const r = await api("/v1/tree/decisions", { context, nodes });
    if (context !== state.context) return;
    r.nodes.forEach((node, i) => setPLeft(node, r.p_left[i]));
  } catch (e) { /* the bars stay as they were */ }
}

async function revealPath(nodes, word, cls) {  // open every node of a path; mark it and its leaf
  for (const node of nodes) await expand(node);
  markPath(nodes, cls);
  const last = state.nodes.get(nodes[nodes.length - 1]);
  const leaf = last && [...last.kids.children].map((li) => li.firstChild).find((row) => row.dataset.word === word);
  if (leaf) { leaf.classList.add(cls === "predicted" ? "predicted" : "found"); leaf.scrollIntoView({ block: "nearest" }); }
}

function markPath(nodes, cls) {
  const mark = cls === "predicted" ? "predicted" : "onpath";
  for (const row of document.querySelectorAll(".row." + mark)) row.classList.remove(mark);
  for (const node of nodes) { const n = state.nodes.get(node); if (n) n.row.classList.add(mark); }
}

async function search(ev) {
  ev.preventDefault();
  const word = $("#search").value.trim();
  if (!word) return;
  const msg = $("#search-msg");
  for (const row of document.querySelectorAll(".row.found")) row.classList.remove("found");
  let r;
  try { r = await api("/v1/tree/word/" + encodeURIComponent(word)); } catch (e) {
    msg.textContent = e.message; msg.className = "error"; $("#codes").replaceChildren(); return;
  }
  msg.className = "muted";
  msg.textContent = `${r.word}: count ${fmt(r.count)}, ${r.codes.length} code${r.codes.length > 1 ? "s" : ""}, depth ${r.depths.join(", ")}`;
  const codes = $("#codes");
  codes.replaceChildren();
  for (const c of r.codes) {
    const p = el("p");
    p.append("code ", el("span", "code", c.bits.map((b) => (b ? "L" : "R")).join("")), ` via nodes ${c.nodes.map((n) => "#" + n).join(" → ")}`);
    codes.append(p);
  }
  for (const c of r.codes) await revealPath(c.nodes, r.word, "onpath");
  markPath(r.codes.flatMap((c) => c.nodes), "onpath");
}

// ---- wiring -------------------------------------------------------------------------------------------

window.addEventListener("DOMContentLoaded", () => {
  $("#context").addEventListener("input", predict);
  $("#k").addEventListener("change", predict);
  $("#sample").addEventListener("click", sample);
  $("#search-form").addEventListener("submit", search);
  init().catch((e) => { $("#model-line").textContent = "cannot reach the server: " + e.message; });
});
