// A trial: its facts, its metrics over time, and its log, followed from an offset.

import { PAGE, api } from "./api.js";
import { chart, figure } from "./chart.js";
import {
  FINAL,
  badge,
  facts,
  fmtDuration,
  fmtMb,
  fmtNum,
  fmtTime,
  fmtValue,
  h,
  link,
  objectiveText,
  panel,
  replace,
  seconds,
  sweepHref,
  userStep,
} from "./dom.js";

const MAX_LOG_CHARS = 512 * 1024;

function metricCharts(trial, reports) {
  const current = reports.filter((r) => r.attempt === trial.attempt);
  if (!current.length) {
    return h("div", { class: "muted" }, FINAL.has(trial.status) ? "it reported nothing" : "no reports yet");
  }
  const start = Date.parse(trial.started_at || current[0].at);
  const span = (Date.parse(current[current.length - 1].at) - start) / 1000;
  const minutes = span > 600;
  const when = (r) => (Date.parse(r.at) - start) / 1000 / (minutes ? 60 : 1);
  const x = { label: minutes ? "minutes since start" : "seconds since start" };
  const names = [];
  for (const r of current) for (const name of Object.keys(r.metrics)) if (!names.includes(name)) names.push(name);
  const figures = [];
  const rated = current.filter((r) => r.samples_per_s !== null);
  if (rated.length) {
    figures.push(figure("samples/s", chart({
      series: [{ line: true, points: rated.map((r) => ({ x: when(r), y: r.samples_per_s, title: `${fmtNum(r.samples_per_s)} samples/s (${r.kind}${r.step !== null ? ", step " + userStep(r.step) : ""})` })) }],
      x,
      y: { label: "samples/s", zero: true },
    })));
  }
  names.forEach((name, index) => {
    const points = current
      .filter((r) => typeof r.metrics[name] === "number")
      .map((r) => ({ x: when(r), y: r.metrics[name], title: `${name} = ${fmtNum(r.metrics[name])}${r.step !== null ? " (step " + userStep(r.step) + ")" : ""}` }));
    figures.push(figure(name, chart({ series: [{ line: true, cls: `s${(index + 1) % 4}`, points }], x, y: { label: name } })));
  });
  const earlier = reports.length - current.length;
  return h(
    "div",
    null,
    h("div", { class: "charts" }, figures),
    earlier ? h("div", { class: "small muted" }, `${earlier} reports of earlier attempts not shown`) : null,
  );
}

export function trialView(id) {
  const root = h("div", null, h("div", { class: "message" }, "loading…"));
  const head = h("div");
  const metrics = panel("Metrics over time", h("div", { class: "muted" }, "loading…"));
  const logText = document.createTextNode("");
  const logNote = h("div", { class: "small muted" });
  const log = h("pre", { class: "log" }, logText);
  const logPanel = panel("Log", logNote, log);
  const reports = [];
  let logState = null;
  let reportsCount = -1;
  let sweep = null;
  let done = false;
  let started = false;

  function renderHead(trial, sweep) {
    replace(head, 
      h("div", { class: "crumbs" }, link("#/", "Overview"), "/ ", link(sweepHref(trial.sweep_id), `sweep ${trial.sweep_id}`), "/ ", `trial ${trial.id}`),
      h("h1", null, `Trial ${trial.id}`, h("span", { class: "muted" }, `#${trial.number} of sweep ${trial.sweep_id}`), badge(trial.status, "trial-status")),
      trial.no_gpu
        ? h("div", { class: "warning no-gpu" }, `${trial.no_gpu} sees no GPU, though gpumux placed this trial on ${trial.device}: it trains on the CPU, and the split search leaves it out`)
        : null,
      h(
        "div",
        { class: "columns" },
        panel("Parameters", facts(Object.entries(trial.params).map(([k, v]) => [k, h("code", null, fmtValue(v))]))),
        panel(
          null,
          facts([
            [sweep.metric ? `objective (${objectiveText(sweep)})` : "objective", fmtNum(trial.objective)],
            ["samples/s", fmtNum(trial.samples_per_s)],
            [trial.status === "pruned" ? "stopped at step" : "last step", userStep(trial.step)],
            ["device", trial.device],
            ["slot / split", trial.slot !== null ? `${trial.slot} of ${trial.split}` : null],
            ["memory slice", trial.memory_limit_mb ? fmtMb(trial.memory_limit_mb) : null],
            ["cpu threads", trial.cpu_threads],
            ["attempt", trial.attempt],
            ["pid", trial.pid],
            ["queued", fmtTime(trial.queued_at)],
            ["started", trial.started_at ? fmtTime(trial.started_at) : null],
            ["ended", trial.ended_at ? fmtTime(trial.ended_at) : null],
            ["duration", trial.started_at ? fmtDuration(seconds(trial.started_at, trial.ended_at)) : null],
            ["exit code", trial.exit_code],
            ["signal", trial.signal],
            ["last report", trial.last_report_at ? fmtTime(trial.last_report_at) : null],
            [
              "reports dropped",
              trial.reports_dropped
                ? `${trial.reports_dropped} over its report budget (not stored; their samples counted)`
                : null,
            ],
          ]),
          trial.error ? h("pre", { class: "error" }, trial.error) : null,
        ),
      ),
    );
  }

  async function fetchReports() {
    for (;;) {
      const page = await api(`trials/${id}/reports`, { offset: reports.length, limit: PAGE });
      reports.push(...page.data);
      if (page.data.length < PAGE) return page.count;
    }
  }

  async function followLog(trial) {
    if (logState && logState.attempt !== trial.attempt) logState = null;
    const chunk = await api(`trials/${id}/log`, logState ? { offset: logState.next } : {});
    if (!logState || chunk.attempt !== logState.attempt) {
      logState = { attempt: chunk.attempt, next: chunk.offset };
      logText.data = "";
      logNote.textContent = chunk.offset > 0 ? `the last ${fmtNum(chunk.size - chunk.offset)} bytes of ${fmtNum(chunk.size)}` : "";
    }
    const atBottom = log.scrollTop + log.clientHeight >= log.scrollHeight - 4;
    if (chunk.data) {
      let text = logText.data + chunk.data;
      if (text.length > MAX_LOG_CHARS) {
        text = text.slice(text.length - MAX_LOG_CHARS);
        logNote.textContent = "earlier output trimmed; the last 512 KiB shown";
      }
      logText.data = text;
    }
    logState.next = chunk.next_offset;
    if (atBottom) log.scrollTop = log.scrollHeight;
    if (!logText.data && chunk.complete) logNote.textContent = "the log is empty";
    return chunk.complete && chunk.next_offset >= chunk.size;
  }

  return {
    root,
    async refresh() {
      if (done) return false;
      const trial = await api(`trials/${id}`);
      // The sweep is read once, for its objective's name.
      sweep = sweep || (await api(`sweeps/${trial.sweep_id}`));
      const [count, logComplete] = await Promise.all([fetchReports(), followLog(trial)]);
      renderHead(trial, sweep);
      if (count !== reportsCount) {
        reportsCount = count;
        replace(metrics, h("h2", null, "Metrics over time"), metricCharts(trial, reports));
      }
      if (!started) {
        started = true;
        replace(root, head, metrics, logPanel);
        log.scrollTop = log.scrollHeight;
      }
      done = FINAL.has(trial.status) && logComplete;
      return true;
    },
  };
}
