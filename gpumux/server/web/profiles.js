// Every stored throughput profile with its curve.

import { api } from "./api.js";
import { h, panel, replace } from "./dom.js";
import { profileBlock } from "./sweep.js";

export function profilesView() {
  const root = h("div", null, h("div", { class: "message" }, "loading…"));
  return {
    root,
    async refresh() {
      const profiles = await api("profiles", { limit: 100 });
      replace(root, 
        h("h1", null, "Throughput profiles"),
        h("p", { class: "muted" }, "Aggregate throughput and time per trial against N, per device model and workload, as the split search measured them."),
        profiles.data.length
          ? profiles.data.map((profile) => panel(null, profileBlock(profile, true)))
          : panel(null, h("div", { class: "muted" }, "no profiles yet: a sweep with --split auto measures one")),
      );
      return true;
    },
  };
}
