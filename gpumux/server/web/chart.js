// Charts drawn as SVG: scatter and line series on linear, log10 or category axes.

import { fmtNum, h, svg } from "./dom.js";

const MAX_DOTS = 60;

function fmtTick(value) {
  const abs = Math.abs(value);
  if (abs >= 1e6) return Number((value / 1e6).toPrecision(3)) + "M";
  if (abs >= 1e4) return Number((value / 1e3).toPrecision(3)) + "k";
  if (abs !== 0 && abs < 1e-3) return value.toExponential(0);
  return String(Number(value.toPrecision(3)));
}

function niceStep(span, target) {
  const raw = span / Math.max(target, 1);
  const power = 10 ** Math.floor(Math.log10(raw));
  const fraction = raw / power;
  return power * (fraction <= 1 ? 1 : fraction <= 2 ? 2 : fraction <= 5 ? 5 : 10);
}

function linearTicks(lo, hi, target, integer) {
  let step = niceStep(hi - lo, target);
  if (integer) step = Math.max(1, Math.round(step));
  const ticks = [];
  for (let t = Math.ceil(lo / step) * step; t <= hi + step * 1e-9; t += step) {
    ticks.push(Math.abs(t) < step * 1e-9 ? 0 : t);
  }
  return ticks;
}

function logTicks(lo, hi) {
  const ticks = [];
  for (let e = Math.floor(Math.log10(lo)); e <= Math.ceil(Math.log10(hi)); e++) {
    for (const m of hi / lo < 100 ? [1, 2, 5] : [1]) {
      const t = m * 10 ** e;
      if (t >= lo * 0.999 && t <= hi * 1.001) ticks.push(t);
    }
  }
  return ticks;
}

// A scale from data to pixels: linear, log10, or evenly spaced categories.
function scale(values, range, options) {
  const [r0, r1] = range;
  if (options.categories) {
    const n = options.categories.length;
    const at = (i) => r0 + ((i + 0.5) * (r1 - r0)) / n;
    return { map: at, ticks: options.categories.map((_, i) => i), label: (i) => options.categories[i] };
  }
  const include = [...(options.include || []), ...(options.zero ? [0] : [])];
  let lo = Math.min(...values, ...include);
  let hi = Math.max(...values, ...include);
  if (options.log) {
    const a = Math.log10(lo) - 0.05 * (Math.log10(hi) - Math.log10(lo) || 1);
    const b = Math.log10(hi) + 0.05 * (Math.log10(hi) - Math.log10(lo) || 1);
    const map = (v) => r0 + ((Math.log10(v) - a) / (b - a)) * (r1 - r0);
    return { map, ticks: logTicks(10 ** a, 10 ** b), label: fmtTick };
  }
  if (lo === hi) {
    const pad = Math.abs(lo) * 0.1 || 1;
    lo -= pad;
    hi += pad;
  } else {
    const pad = (hi - lo) * 0.06;
    lo = options.zero && lo === 0 ? 0 : lo - pad;
    hi += pad;
  }
  const map = (v) => r0 + ((v - lo) / (hi - lo)) * (r1 - r0);
  return { map, ticks: linearTicks(lo, hi, options.ticks || 5, options.integer), label: fmtTick };
}

// series: [{cls, line, dots, title, href, key, points}], a point {x, y, title, href, cls,
// highlight, mark}. A line's title and href are its tooltip and link, its key its data-series
// attribute; with dots: false only the highlighted and marked points get a dot.
// x.categories places x values evenly in that order; x.log and y.log use log10 axes.
export function chart({ series, x = {}, y = {}, markers = [], width = 440, height = 250 }) {
  const points = series.flatMap((s) => s.points);
  const root = svg("svg", {
    class: "chart",
    viewBox: `0 0 ${width} ${height}`,
    role: "img",
    "aria-label": `${y.label || "y"} against ${x.label || "x"}`,
  });
  if (!points.length) {
    root.append(svg("text", { x: width / 2, y: height / 2, "text-anchor": "middle" }, "no data yet"));
    return root;
  }
  const margin = { left: 52, right: 12, top: 10, bottom: 38 };
  const xs = scale(
    points.map((p) => p.x),
    [margin.left, width - margin.right],
    { ...x, include: markers },
  );
  const ys = scale(
    points.map((p) => p.y),
    [height - margin.bottom, margin.top],
    y,
  );
  const grid = svg("g", { class: "grid" });
  const axes = svg("g", { class: "axis" });
  const bottom = height - margin.bottom;
  axes.append(
    svg("line", { x1: margin.left, x2: width - margin.right, y1: bottom, y2: bottom }),
    svg("line", { x1: margin.left, x2: margin.left, y1: margin.top, y2: bottom }),
  );
  for (const t of xs.ticks) {
    const px = xs.map(t);
    if (px < margin.left - 1 || px > width - margin.right + 1) continue;
    grid.append(svg("line", { x1: px, x2: px, y1: margin.top, y2: bottom }));
    const text = String(xs.label(t));
    const shown = text.length > 12 ? text.slice(0, 11) + "…" : text;
    axes.append(
      svg("line", { x1: px, x2: px, y1: bottom, y2: bottom + 4 }),
      svg("text", { x: px, y: bottom + 16, "text-anchor": "middle" }, shown, svg("title", null, text)),
    );
  }
  for (const t of ys.ticks) {
    const py = ys.map(t);
    if (py < margin.top - 1 || py > bottom + 1) continue;
    grid.append(svg("line", { x1: margin.left, x2: width - margin.right, y1: py, y2: py }));
    axes.append(
      svg("text", { x: margin.left - 6, y: py + 4, "text-anchor": "end" }, ys.label(t)),
    );
  }
  root.append(grid, axes);
  root.append(
    svg("text", { class: "axis-label", x: (margin.left + width - margin.right) / 2, y: height - 6, "text-anchor": "middle" }, x.label || ""),
  );
  const yLabel = svg("text", {
    class: "axis-label",
    transform: `translate(12 ${(margin.top + bottom) / 2}) rotate(-90)`,
    "text-anchor": "middle",
  }, y.label || "");
  root.append(yLabel);
  for (const marker of markers) {
    const px = xs.map(marker);
    root.append(svg("line", { class: "marker", x1: px, x2: px, y1: margin.top, y2: bottom }));
  }
  series.forEach((s, index) => {
    const cls = s.cls || `s${index % 4}`;
    if (s.line && s.points.length > 1) {
      const d = s.points
        .map((p, i) => `${i ? "L" : "M"}${xs.map(p.x).toFixed(1)} ${ys.map(p.y).toFixed(1)}`)
        .join(" ");
      const path = svg("path", { class: `series-line ${cls}`, d, "data-series": s.key }, s.title ? svg("title", null, s.title) : null);
      root.append(s.href ? svg("a", { href: s.href }, path) : path);
    }
    // A long series reads better as a line alone; its points stay hoverable on short ones.
    const all = s.dots !== false && (!s.line || s.points.length <= MAX_DOTS);
    const dots = all ? s.points : s.points.filter((p) => p.highlight || p.mark);
    for (const p of dots) {
      const dot = svg(
        "circle",
        {
          class: `dot ${p.cls || cls}${p.highlight ? " highlight" : ""}${p.mark ? " mark" : ""}`,
          cx: xs.map(p.x).toFixed(1),
          cy: ys.map(p.y).toFixed(1),
          r: p.highlight ? 5.5 : 3.5,
        },
        svg("title", null, p.title || `${fmtNum(p.x)}, ${fmtNum(p.y)}`),
      );
      root.append(p.href ? svg("a", { href: p.href }, dot) : dot);
    }
  });
  return root;
}

export function figure(caption, chartNode, note) {
  return h(
    "figure",
    { class: "chart" },
    h("figcaption", null, caption),
    chartNode,
    note ? h("div", { class: "small muted" }, note) : null,
  );
}
