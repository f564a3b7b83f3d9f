// The overview: every device with the trials packed on it and their mix, and the newest sweeps.

import { api } from "./api.js";
import {
  badge,
  fill,
  fmtDuration,
  fmtMb,
  fmtNum,
  fmtTime,
  h,
  link,
  objectiveText,
  panel,
  progress,
  replace,
  seconds,
  sweepHref,
  sweepTotal,
  trialHref,
} from "./dom.js";

function packedSummary(trials) {
  const rate = trials.reduce((sum, t) => sum + (t.samples_per_s || 0), 0);
  const text = `${trials.length} trial${trials.length === 1 ? "" : "s"} packed`;
  return rate ? `${text} · ${fmtNum(rate)} samples/s in all` : text;
}

// A sweep keeps its colour on every device: one of MIX_COLOURS, by its id.
const MIX_COLOURS = 6;

function mixClass(share) {
  return `mix-${share.sweep_id % MIX_COLOURS}`;
}

// "2/3 #12 alice name": the sweep's trials over the split each holds 1/N of (first, so that
// a long name cut short leaves it whole), the sweep (a link where the caller may open it),
// whose and its name. Another user's sweep comes without owner or name.
function shareLabel(share) {
  const id = `#${share.sweep_id}`;
  return [
    h("strong", null, `${share.trials}/${share.split}`),
    " ",
    share.owner === null ? id : link(sweepHref(share.sweep_id), id),
    share.owner === null ? h("span", { class: "muted" }, " another user") : ` ${share.owner}`,
    share.name ? h("em", null, ` ${share.name}`) : null,
  ];
}

// The device's mix: a bar stacked by the shares the sweeps hold, the load, and a legend.
function mixMeter(device) {
  if (!device.mix.length) return null;
  // An over-full device (a sweep's N changed under running trials) still fits its bar.
  const scale = Math.max(1, device.load);
  const bar = h("div", { class: device.load > 1 ? "bar mix over" : "bar mix" });
  for (const share of device.mix) {
    const who = share.owner === null ? "another user" : share.owner;
    const segment = h("span", {
      class: mixClass(share),
      "data-sweep-id": share.sweep_id,
      title: `sweep ${share.sweep_id} of ${who}: ${share.trials}/${share.split} of the device`,
    });
    segment.style.width = `${(100 * share.share) / scale}%`;
    bar.append(segment);
  }
  return h(
    "div",
    { class: "meter mix" },
    h("div", { class: "label" }, h("span", null, "mix"), h("span", { class: "load" }, `load ${device.load_fraction}`)),
    bar,
    h(
      "div",
      { class: "legend" },
      device.mix.map((share) =>
        h("span", { "data-sweep-id": share.sweep_id, title: share.name }, h("i", { class: mixClass(share) }), shareLabel(share)),
      ),
    ),
  );
}

function deviceCard(device) {
  const memory = h("div", { class: "meter" });
  if (device.memory_total_mb) {
    const used = device.memory_used_mb || 0;
    const fillBar = h("div", { class: used / device.memory_total_mb > 0.9 ? "fill hot" : "fill" });
    fillBar.style.width = `${Math.min(100, (100 * used) / device.memory_total_mb)}%`;
    fill(memory, [
      h("div", { class: "label" }, h("span", null, "memory"), h("span", null, `${fmtMb(used)} / ${fmtMb(device.memory_total_mb)}`)),
      h("div", { class: "bar" }, fillBar),
    ]);
  }
  const util = h("div", { class: "meter" });
  if (device.utilization_pct !== null && device.utilization_pct !== undefined) {
    const fillBar = h("div", { class: "fill" });
    fillBar.style.width = `${Math.min(100, device.utilization_pct)}%`;
    fill(util, [
      h("div", { class: "label" }, h("span", null, "utilisation"), h("span", null, `${device.utilization_pct}%`)),
      h("div", { class: "bar" }, fillBar),
    ]);
  }
  const trials = device.trials.length
    ? h(
        "ul",
        { class: "packed" },
        device.trials.map((t) =>
          h(
            "li",
            null,
            link(trialHref(t.trial_id), `trial ${t.trial_id}`),
            " · ",
            link(sweepHref(t.sweep_id), `sweep ${t.sweep_id}`),
            t.slot !== null ? ` · slot ${t.slot}` : "",
            t.memory_limit_mb ? ` · ${fmtMb(t.memory_limit_mb)}` : "",
            t.samples_per_s !== null ? ` · ${fmtNum(t.samples_per_s)} samples/s` : "",
          ),
        ),
      )
    : h("div", { class: "small muted" }, "idle");
  return h(
    "div",
    { class: "card device", "data-device": device.key },
    h(
      "div",
      { class: "card-head" },
      h("strong", { title: device.name }, device.name),
      h("span", { class: "muted mono" }, device.key),
    ),
    device.work_cores ? h("div", { class: "small muted" }, `${device.work_cores} cores`) : null,
    memory,
    util,
    mixMeter(device),
    device.error ? h("div", { class: "device-error" }, device.error) : null,
    h("div", { class: "small" }, packedSummary(device.trials)),
    trials,
  );
}

// One panel per node, in the order the API lists them (this node first); one for a daemon
// that is no node.
function devicePanels(devices) {
  if (!devices.length) return [panel("Devices", h("div", { class: "muted" }, "the scheduler has not listed the devices yet"))];
  const nodes = new Map();
  for (const device of devices) {
    if (!nodes.has(device.node)) nodes.set(device.node, []);
    nodes.get(device.node).push(device);
  }
  return [...nodes].map(([node, group]) => {
    const shown = panel(node === null ? "Devices" : `Devices on ${node}`, h("div", { class: "cards" }, group.map(deviceCard)));
    if (node !== null) shown.dataset.node = node;
    return shown;
  });
}

function sweepTitle(sweep) {
  return sweep.name || sweep.command.join(" ");
}

function sweepsTable(sweeps) {
  const head = ["id", "sweep", "status", "progress", "objective", "split", "owner", "created", "elapsed"];
  const rows = sweeps.map((sweep) =>
    h(
      "tr",
      { class: "link", "data-sweep-id": sweep.id, onclick: () => (window.location.hash = sweepHref(sweep.id)) },
      h("td", { class: "num" }, link(sweepHref(sweep.id), String(sweep.id))),
      h("td", { class: "cmd", title: sweep.command.join(" ") }, sweepTitle(sweep)),
      h("td", null, badge(sweep.status, "sweep-status")),
      h("td", null, progress(sweep.counts, sweepTotal(sweep))),
      h("td", null, objectiveText(sweep) || "—"),
      h("td", { class: "num" }, String(sweep.split)),
      h("td", null, sweep.owner),
      h("td", null, fmtTime(sweep.created_at)),
      h("td", { class: "num" }, fmtDuration(seconds(sweep.created_at, sweep.finished_at))),
    ),
  );
  return h(
    "div",
    { class: "table-wrap" },
    h("table", { class: "sweeps" }, h("thead", null, h("tr", null, head.map((name) => h("th", null, name)))), h("tbody", null, rows)),
  );
}

export function overviewView() {
  const root = h("div", null, h("div", { class: "message" }, "loading…"));
  return {
    root,
    async refresh() {
      const [devices, sweeps] = await Promise.all([api("devices"), api("sweeps", { limit: 50 })]);
      replace(root, 
        ...devicePanels(devices),
        panel(
          `Sweeps (${sweeps.count})`,
          sweeps.data.length
            ? sweepsTable(sweeps.data)
            : h("div", { class: "muted" }, "no sweeps yet: gpumux sweep PARAM... -- COMMAND..."),
          sweeps.count > sweeps.data.length ? h("div", { class: "small muted" }, `the newest ${sweeps.data.length} shown`) : null,
        ),
      );
      return true;
    },
  };
}
