// A sweep: its progress, the split search, the objective against each parameter, every
// trial's learning curve, its trials.

import { PAGE, api } from "./api.js";
import { chart, figure } from "./chart.js";
import {
  FINAL,
  askedCount,
  badge,
  facts,
  fmtDuration,
  fmtNum,
  fmtTime,
  fmtValue,
  h,
  objectiveText,
  legend,
  link,
  panel,
  progress,
  replace,
  seconds,
  statusClass,
  sweepHref,
  sweepTotal,
  trialHref,
  userStep,
} from "./dom.js";

const MAX_TRIALS = 10000;
const MAX_ROWS = 2000;
// Learning curves drawn at most: each costs its trial's reports, fetched once it has ended.
const MAX_CURVES = 40;

function paramNames(sweep, trials) {
  const names = [];
  for (const token of sweep.params) {
    const name = token.split("=")[0];
    if (name && !names.includes(name)) names.push(name);
  }
  for (const trial of trials) {
    for (const name of Object.keys(trial.params)) if (!names.includes(name)) names.push(name);
  }
  return names;
}

function compare(a, b) {
  const missingA = a === null || a === undefined;
  const missingB = b === null || b === undefined;
  if (missingA || missingB) return missingA === missingB ? 0 : missingA ? 1 : -1;
  if (typeof a === "number" && typeof b === "number") return a - b;
  return String(a).localeCompare(String(b), "en", { numeric: true });
}

function trialsTable(sweep, trials, names, sort, onSort) {
  const bestId = sweep.best ? sweep.best.id : null;
  const columns = [
    { key: "number", label: "#", num: true, value: (t) => t.number },
    { key: "id", label: "trial", num: true, value: (t) => t.id, cell: (t) => link(trialHref(t.id), String(t.id)) },
    { key: "status", label: "status", value: (t) => t.status, cell: (t) => badge(t.status) },
    ...names.map((name) => ({ key: "p:" + name, label: name, num: true, value: (t) => t.params[name], cell: (t) => fmtValue(t.params[name]) })),
    { key: "objective", label: sweep.metric ? `objective (${objectiveText(sweep)})` : "objective", num: true, value: (t) => t.objective },
    // Steps as the user counts them, from 1 (the API keeps Optuna's, from 0).
    { key: "step", label: "step", num: true, value: (t) => userStep(t.step) },
    { key: "samples_per_s", label: "samples/s", num: true, value: (t) => t.samples_per_s },
    { key: "duration", label: "duration", num: true, value: (t) => seconds(t.started_at, t.ended_at), cell: (t) => fmtDuration(seconds(t.started_at, t.ended_at)) },
    { key: "device", label: "device", value: (t) => t.device },
    { key: "split", label: "split", num: true, value: (t) => t.split },
    { key: "attempt", label: "attempt", num: true, value: (t) => t.attempt },
  ];
  const column = columns.find((c) => c.key === sort.key) || columns[0];
  const sorted = [...trials].sort((a, b) => {
    const order = compare(column.value(a), column.value(b));
    return (sort.descending ? -order : order) || a.number - b.number;
  });
  const head = columns.map((c) => {
    const active = c.key === column.key;
    const arrow = active ? (sort.descending ? "▼" : "▲") : "";
    return h(
      "th",
      { class: c.num ? "num" : null, "aria-sort": active ? (sort.descending ? "descending" : "ascending") : "none" },
      h("button", { type: "button", onclick: () => onSort(c.key) }, c.label, arrow),
    );
  });
  const rows = sorted.slice(0, MAX_ROWS).map((t) =>
    h(
      "tr",
      { class: t.id === bestId ? "link best" : "link", "data-trial-id": t.id, onclick: (event) => {
        if (!(event.target instanceof HTMLAnchorElement)) window.location.hash = trialHref(t.id);
      } },
      columns.map((c) => h("td", { class: c.num ? "num" : null }, c.cell ? c.cell(t) : fmtValue(c.value(t) ?? "—"))),
    ),
  );
  return h(
    "div",
    null,
    h("div", { class: "table-wrap" }, h("table", { class: "trials" }, h("thead", null, h("tr", null, head)), h("tbody", null, rows))),
    sorted.length > MAX_ROWS ? h("div", { class: "small muted" }, `the first ${MAX_ROWS} of ${sorted.length} rows in this order`) : null,
  );
}

// One scatter per swept parameter: the objective of each trial against its value.
function objectiveCharts(sweep, trials, names) {
  if (!sweep.metric) {
    return h("div", { class: "muted" }, "this sweep has no --objective: nothing to rank or plot");
  }
  const scored = trials.filter((t) => typeof t.objective === "number");
  const figures = [];
  for (const name of names) {
    const values = trials.map((t) => t.params[name]).filter((v) => v !== undefined);
    const distinct = [...new Set(values.map((v) => JSON.stringify(v)))];
    if (distinct.length < 2) continue;
    const numeric = values.every((v) => typeof v === "number");
    const x = { label: name };
    let position = (v) => v;
    if (numeric) {
      const lo = Math.min(...values);
      const hi = Math.max(...values);
      x.log = lo > 0 && hi / lo >= 10;
    } else {
      const keys = distinct.map((d) => JSON.parse(d)).sort(compare).map((v) => JSON.stringify(v));
      x.categories = keys.map((k) => fmtValue(JSON.parse(k)));
      position = (v) => keys.indexOf(JSON.stringify(v));
    }
    const points = scored
      .filter((t) => t.params[name] !== undefined)
      .map((t) => ({
        x: position(t.params[name]),
        y: t.objective,
        cls: statusClass(t.status),
        highlight: sweep.best && t.id === sweep.best.id,
        href: trialHref(t.id),
        title: `trial ${t.id}: ${name}=${fmtValue(t.params[name])}, ${sweep.metric}=${fmtNum(t.objective)} (${t.status})`,
      }));
    const chartNode = chart({ series: [{ points }], x, y: { label: sweep.metric } });
    figures.push(figure(`${sweep.metric} against ${name}${x.log ? " (log)" : ""}`, chartNode));
  }
  if (!figures.length) return h("div", { class: "muted" }, "no parameter varies in this sweep");
  return h("div", { class: "charts" }, figures);
}

function curveFigures(profile) {
  const points = profile.curve;
  const unit = profile.unit;
  const size = { width: 320, height: 220 };
  const throughput = chart({
    ...size,
    series: [{ line: true, points: points.map((p) => ({ x: p.split, y: p.throughput, title: `N=${p.split}: ${fmtNum(p.throughput)} ${unit}` })) }],
    x: { label: "N (trials at once)", integer: true },
    y: { label: unit, zero: true },
    markers: profile.best_split ? [profile.best_split] : [],
  });
  const timed = points.filter((p) => p.seconds_per_trial !== null);
  const perTrial = chart({
    ...size,
    series: [{ line: true, cls: "s1", points: timed.map((p) => ({ x: p.split, y: p.seconds_per_trial, title: `N=${p.split}: ${fmtDuration(p.seconds_per_trial)} per trial` })) }],
    x: { label: "N (trials at once)", integer: true },
    y: { label: "seconds per trial", zero: true },
    markers: profile.best_split ? [profile.best_split] : [],
  });
  return [figure(`aggregate throughput (${unit})`, throughput), figure("time per trial", perTrial)];
}

export function profileBlock(profile, withWorkload) {
  const state = profile.settled ? "settled" : "searching";
  return h(
    "div",
    { class: "profile", "data-profile-id": profile.id },
    h("h3", null, `${profile.device_name}: best N = ${profile.best_split ?? "—"} (${state})`),
    profile.reason ? h("div", { class: "small muted" }, profile.reason) : null,
    withWorkload
      ? facts([
          ["command", h("code", null, profile.command.join(" "))],
          ["directory", profile.workdir !== null ? h("code", null, profile.workdir) : "—"],
          ["cost parameters", profile.param_tokens.join(" ") || "—"],
          ["measured by", profile.sweep_id !== null ? link(sweepHref(profile.sweep_id), `sweep ${profile.sweep_id}`) : "—"],
          ["updated", fmtTime(profile.updated_at)],
        ])
      : null,
    h("div", { class: "charts compact" }, curveFigures(profile)),
  );
}

// Frameworks that saw no GPU in trials placed on one: they trained on the CPU.
function noGpuWarnings(sweep) {
  return sweep.no_gpu.map((seen) =>
    h(
      "div",
      { class: "warning no-gpu" },
      `${seen.framework} sees no GPU in ${seen.trials} trial(s) gpumux placed on a GPU: they train on the CPU, and the split search leaves them out. To use the GPU, install ${seen.fix}`,
    ),
  );
}

function splitSearch(sweep) {
  if (sweep.split !== "auto") {
    return h("div", { class: "muted" }, `the split is fixed at ${sweep.split} trials per device: no search`);
  }
  if (!sweep.profiles.length) {
    return h("div", { class: "muted" }, "no measurement yet (or the search is off: GPUMUX_TUNE=0)");
  }
  return h("div", null, sweep.profiles.map((profile) => profileBlock(profile, false)));
}

function trialsFact(sweep) {
  if (sweep.search && sweep.search !== "grid" && sweep.search !== "random") {
    return `${askedCount(sweep)} of ${sweep.trial_count} asked (${sweep.search}, seed ${sweep.seed})`;
  }
  return sweep.search === "random" ? `${sweep.trial_count} random (seed ${sweep.seed})` : `${sweep.trial_count} (grid)`;
}

// The trials whose learning curves are drawn: those that reported a step, the best first,
// then by objective; no more than MAX_CURVES.
function curveTrials(sweep, trials) {
  const stepped = trials.filter((t) => t.step !== null && t.step !== undefined);
  const bestId = sweep.best ? sweep.best.id : null;
  const sign = sweep.mode === "max" ? -1 : 1;
  const rank = (t) => (t.id === bestId ? 0 : typeof t.objective === "number" ? 1 : 2);
  const ranked = [...stepped].sort(
    (a, b) => rank(a) - rank(b) || (rank(a) === 1 ? sign * (a.objective - b.objective) : 0) || a.number - b.number,
  );
  return { chosen: ranked.slice(0, MAX_CURVES), reporting: stepped.length };
}

// Each drawn trial's reports, kept between refreshes: they only grow, so a refresh asks for
// those after the last one seen, and none once the trial has ended.
async function fetchReports(cache, trials) {
  const wanted = new Set(trials.map((t) => t.id));
  for (const id of cache.keys()) if (!wanted.has(id)) cache.delete(id);
  await Promise.all(
    trials.map(async (t) => {
      const entry = cache.get(t.id) || { reports: [], complete: false };
      cache.set(t.id, entry);
      if (entry.complete) return;
      for (;;) {
        const page = await api(`trials/${t.id}/reports`, { offset: entry.reports.length, limit: PAGE });
        entry.reports.push(...page.data);
        if (page.data.length < PAGE) break;
      }
      // Reports come only while a trial runs: once it has ended, these are all of them.
      entry.complete = FINAL.has(t.status);
    }),
  );
}

// The objective at each step the trial's current attempt reported (a step sent twice: the last).
function curvePoints(trial, reports, metric) {
  const byStep = new Map();
  for (const r of reports) {
    if (r.attempt === trial.attempt && r.step !== null && typeof r.metrics[metric] === "number") {
      byStep.set(r.step, r.metrics[metric]);
    }
  }
  return [...byStep.entries()].sort((a, b) => a[0] - b[0]).map(([x, y]) => ({ x: x + 1, y }));
}

// One line per trial: the objective against the step; pruned trials dashed, ending in a dot;
// the best trial thick, drawn last.
function learningCurves(sweep, { chosen, reporting, reports }) {
  if (!sweep.metric) {
    return h("div", { class: "muted" }, "this sweep has no --objective: no curve to draw");
  }
  const metric = sweep.metric;
  if (!reporting) {
    return h("div", { class: "muted" }, `no trial has reported ${metric} at a step yet`);
  }
  const bestId = sweep.best ? sweep.best.id : null;
  const series = [];
  for (const t of chosen) {
    const points = curvePoints(t, reports.get(t.id)?.reports || [], metric);
    if (!points.length) continue;
    const end = points[points.length - 1];
    end.mark = t.status === "pruned" || points.length === 1;
    for (const p of points) p.title = `trial ${t.id} (${t.status}): ${metric} = ${fmtNum(p.y)} at step ${p.x}`;
    const pruned = t.status === "pruned" ? `, stopped at step ${end.x}` : "";
    series.push({
      line: true,
      dots: false,
      key: t.id,
      href: trialHref(t.id),
      title: `trial ${t.id} (${t.status}${pruned})`,
      cls: `curve ${statusClass(t.status)}${t.id === bestId ? " best" : ""}`,
      points,
    });
  }
  series.sort((a, b) => (a.key === bestId) - (b.key === bestId));
  const shown =
    reporting > chosen.length
      ? `the best ${chosen.length} of the ${reporting} trials that reported steps (the others are not fetched)`
      : `every trial that reported steps (${reporting})`;
  const node = figure(
    `${metric} against step`,
    chart({ series, x: { label: "step", integer: true }, y: { label: metric }, width: 880, height: 320 }),
    `${shown}; dashed, ending in a dot: pruned; thick: the best trial`,
  );
  node.classList.add("curves");
  return node;
}

async function allTrials(id) {
  const trials = [];
  let count = Infinity;
  while (trials.length < Math.min(count, MAX_TRIALS)) {
    const page = await api(`sweeps/${id}/trials`, { offset: trials.length, limit: PAGE });
    count = page.count;
    trials.push(...page.data);
    if (!page.data.length) break;
  }
  return { trials, count };
}

export function sweepView(id) {
  const root = h("div", null, h("div", { class: "message" }, "loading…"));
  const sort = { key: "number", descending: false };
  const reports = new Map();
  let last = null;
  function render() {
    const { sweep, trials, count, curves } = last;
    const names = paramNames(sweep, trials);
    const best = sweep.best;
    const table = h("div");
    const drawTable = () => replace(table, trialsTable(sweep, trials, names, sort, (key) => {
      sort.descending = sort.key === key ? !sort.descending : false;
      sort.key = key;
      drawTable();
    }));
    drawTable();
    replace(root, 
      h("div", { class: "crumbs" }, link("#/", "Overview"), "/ ", `sweep ${sweep.id}`),
      h("h1", null, `Sweep ${sweep.id}`, sweep.name ? h("span", { class: "muted" }, sweep.name) : null, badge(sweep.status, "sweep-status")),
      noGpuWarnings(sweep),
      h(
        "div",
        { class: "columns" },
        panel(
          null,
          progress(sweep.counts, sweepTotal(sweep)),
          legend(sweep.counts),
          facts([
            ["command", h("code", null, sweep.command.join(" "))],
            ["parameters", h("code", null, sweep.params.join(" ") || "—")],
            ["trials", trialsFact(sweep)],
            ["pruner", sweep.prune && sweep.prune !== "none" ? sweep.prune : null],
            ["objective", objectiveText(sweep) || "—"],
            ["time limit", sweep.time_limit_s ? fmtDuration(sweep.time_limit_s) : null],
            ["directory", h("code", null, sweep.workdir)],
            ["owner", sweep.owner],
            ["created", fmtTime(sweep.created_at)],
            ["finished", sweep.finished_at ? `${fmtTime(sweep.finished_at)} (${fmtDuration(seconds(sweep.created_at, sweep.finished_at))})` : null],
            ["cancel", sweep.cancel_requested ? "requested" : null],
          ]),
          best
            ? h(
                "div",
                { class: "best-trial" },
                h("h3", null, "Best trial"),
                facts([
                  ["trial", link(trialHref(best.id), `${best.id} (#${best.number})`)],
                  [objectiveText(sweep), fmtNum(best.objective)],
                  ["parameters", Object.entries(best.params).map(([k, v]) => `${k}=${fmtValue(v)}`).join("  ")],
                ]),
              )
            : null,
        ),
        panel(`Split search (split ${sweep.split})`, splitSearch(sweep)),
      ),
      panel("Objective against each parameter", objectiveCharts(sweep, trials, names)),
      panel("Learning curves", learningCurves(sweep, curves)),
      panel(`Trials (${count})`, count > trials.length ? h("div", { class: "small muted" }, `the first ${trials.length} loaded`) : null, table),
    );
  }
  return {
    root,
    async refresh() {
      if (last && (last.sweep.status === "finished" || last.sweep.status === "cancelled")) {
        return false;
      }
      const [sweep, { trials, count }] = await Promise.all([api(`sweeps/${id}`), allTrials(id)]);
      const { chosen, reporting } = curveTrials(sweep, trials);
      await fetchReports(reports, chosen);
      last = { sweep, trials, count, curves: { chosen, reporting, reports } };
      render();
      return true;
    },
  };
}
