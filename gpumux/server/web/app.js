// gpumux dashboard: reads the daemon's REST API and redraws the visible view every 2 s.
// No framework, no build step, no network beyond the daemon. Every piece of data reaches the
// page as text (textContent, setAttribute), never as markup: logs and parameters are the
// users' own strings.

import { HttpError, takeToken } from "./api.js";
import { h, link, replace } from "./dom.js";
import { overviewView } from "./overview.js";
import { profilesView } from "./profiles.js";
import { sweepView } from "./sweep.js";
import { trialView } from "./trial.js";

const POLL_MS = 2000;

function notFound() {
  const root = h("div", { class: "message" }, "no such page; ", link("#/", "back to the overview"));
  return { root, refresh: async () => false };
}

function route(hash) {
  const path = hash.replace(/^#/, "") || "/";
  let match;
  if (path === "/") return overviewView();
  if ((match = /^\/sweeps\/(\d+)$/.exec(path))) return sweepView(Number(match[1]));
  if ((match = /^\/trials\/(\d+)$/.exec(path))) return trialView(Number(match[1]));
  if (path === "/profiles") return profilesView();
  return notFound();
}

let current = null;
let timer = null;
let busy = false;
let again = false;

function setBanner(text) {
  const banner = document.getElementById("banner");
  banner.textContent = text || "";
  banner.hidden = !text;
}

function showFailure(view, error) {
  if (error instanceof HttpError && error.status < 500) {
    setBanner(null);
    const hint = error.status === 401 || error.status === 403 ? "; open the page with ?token=YOUR_TOKEN" : "";
    replace(view.root, h("div", { class: "message" }, `${error.message} (${error.status})${hint} `, link("#/", "back to the overview")));
    return false;
  }
  const why = error instanceof HttpError ? `the daemon answered ${error.status}: ${error.message}` : "daemon unreachable";
  setBanner(`${why}; retrying every ${POLL_MS / 1000} s`);
  return true;
}

// Refresh the visible view, then again in POLL_MS while it has live data; a refresh asked
// for while one is running (navigation, the tab shown again) runs right after it.
async function poll() {
  window.clearTimeout(timer);
  timer = null;
  if (busy) {
    again = true;
    return;
  }
  busy = true;
  again = false;
  const view = current;
  let live = true;
  try {
    if (!document.hidden) {
      live = await view.refresh();
      if (view === current) {
        setBanner(null);
        document.getElementById("updated").textContent = "updated " + new Date().toLocaleTimeString();
      }
    }
  } catch (error) {
    if (view === current) live = showFailure(view, error);
  } finally {
    busy = false;
  }
  if (again || view !== current) poll();
  else if (live) timer = window.setTimeout(poll, POLL_MS);
}

function navigate() {
  current = route(window.location.hash);
  replace(document.getElementById("view"), current.root);
  window.scrollTo(0, 0);
  poll();
}

takeToken();
window.addEventListener("hashchange", navigate);
document.addEventListener("visibilitychange", () => {
  if (!document.hidden) poll();
});
navigate();
