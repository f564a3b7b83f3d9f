// Building the page: elements from data as text, never as markup; formatting; status colours.

export const FINAL = new Set(["succeeded", "pruned", "failed", "cancelled", "lost"]);
export const STATUSES = ["succeeded", "pruned", "failed", "lost", "cancelled", "running", "starting", "queued"];
const SWEEP_STATUSES = new Set(["queued", "running", "finished", "cancelled"]);
const SVG_NS = "http://www.w3.org/2000/svg";

export function fill(node, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

function setAttributes(node, attrs) {
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (name === "class") node.setAttribute("class", value);
    else if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else node.setAttribute(name, value === true ? "" : String(value));
  }
}

// Like node.replaceChildren(), but lists among the children are flattened as in h().
export function replace(node, ...children) {
  node.replaceChildren();
  return fill(node, children);
}

export function h(tag, attrs, ...children) {
  const node = document.createElement(tag);
  setAttributes(node, attrs);
  return fill(node, children);
}

export function svg(tag, attrs, ...children) {
  const node = document.createElementNS(SVG_NS, tag);
  setAttributes(node, attrs);
  return fill(node, children);
}

export function statusClass(status) {
  return STATUSES.includes(status) || SWEEP_STATUSES.has(status) ? "st-" + status : "";
}

export function badge(status, extra = "") {
  return h("span", { class: `badge ${statusClass(status)} ${extra}`.trim() }, status);
}

export function link(href, ...children) {
  return h("a", { href }, ...children);
}

export const sweepHref = (id) => `#/sweeps/${Number(id)}`;
export const trialHref = (id) => `#/trials/${Number(id)}`;

export function panel(title, ...children) {
  return h("section", { class: "panel" }, title ? h("h2", null, title) : null, ...children);
}

export function facts(pairs) {
  return h(
    "dl",
    { class: "facts" },
    pairs
      .filter(([, value]) => value !== null && value !== undefined && value !== "")
      .map(([name, value]) => [h("dt", null, name), h("dd", null, value)]),
  );
}

// A step as the user counts it, from 1 (the API keeps Optuna's steps, from 0).
export function userStep(step) {
  return step === null || step === undefined ? null : step + 1;
}

export function fmtNum(value) {
  if (value === null || value === undefined) return "—";
  if (typeof value !== "number") return String(value);
  if (!Number.isFinite(value)) return String(value);
  if (Number.isInteger(value) && Math.abs(value) < 1e15) return value.toLocaleString("en");
  if (Math.abs(value) >= 1000) return Math.round(value).toLocaleString("en");
  return String(Number(value.toPrecision(4)));
}

// A sweep's objective as the command line takes it, "val_loss:min"; null without one.
export function objectiveText(sweep) {
  return sweep.metric ? `${sweep.metric}:${sweep.mode}` : null;
}

export function fmtValue(value) {
  if (typeof value === "number") return fmtNum(value);
  if (typeof value === "string") return value;
  return JSON.stringify(value);
}

export function fmtDuration(seconds) {
  if (seconds === null || seconds === undefined || !Number.isFinite(seconds)) return "—";
  if (seconds < 1) return `${Math.round(seconds * 1000)} ms`;
  if (seconds < 60) return `${seconds.toFixed(1)} s`;
  const s = Math.round(seconds);
  if (s < 3600) return `${Math.floor(s / 60)}m ${String(s % 60).padStart(2, "0")}s`;
  const m = Math.floor(s / 60);
  return `${Math.floor(m / 60)}h ${String(m % 60).padStart(2, "0")}m`;
}

export function fmtTime(iso) {
  return iso ? new Date(iso).toLocaleString() : "—";
}

export function fmtMb(mb) {
  if (mb === null || mb === undefined) return "—";
  return mb >= 1024 ? `${(mb / 1024).toFixed(1)} GiB` : `${mb} MiB`;
}

export function seconds(from, to) {
  if (!from) return null;
  const end = to ? Date.parse(to) : Date.now();
  return (end - Date.parse(from)) / 1000;
}

// ---------------------------------------------------------------- progress

// The trials that exist: all of a sweep's, or those an adaptive search has asked so far.
export function askedCount(sweep) {
  return Object.values(sweep.counts).reduce((sum, count) => sum + count, 0);
}

// How many trials the sweep will have run: its trial_count (an adaptive search's budget)
// while it runs, the trials it asked once it ended (cancelled short of its budget, say).
export function sweepTotal(sweep) {
  return sweep.status === "finished" || sweep.status === "cancelled" ? askedCount(sweep) : sweep.trial_count;
}

export function progress(counts, total) {
  const done = [...FINAL].reduce((sum, status) => sum + (counts[status] || 0), 0);
  const bar = h("div", { class: "bar" });
  const parts = [];
  for (const status of STATUSES) {
    const count = counts[status] || 0;
    if (!count || status === "queued") continue;
    const segment = h("span", { class: statusClass(status) });
    segment.style.width = `${(100 * count) / Math.max(total, 1)}%`;
    bar.append(segment);
    parts.push(`${count} ${status}`);
  }
  bar.title = parts.join(", ") || "nothing started yet";
  return h("div", { class: "progress" }, bar, h("span", { class: "small" }, `${done}/${total}`));
}

export function legend(counts) {
  return h(
    "div",
    { class: "legend" },
    STATUSES.filter((status) => counts[status]).map((status) => {
      const swatch = h("i", { class: statusClass(status) });
      return h("span", null, swatch, `${counts[status]} ${status}`);
    }),
  );
}
