// The daemon's REST API, as this page calls it: relative URLs, the token if one was given.

export const PAGE = 1000;
const TOKEN_KEY = "gpumux.token";

export class HttpError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

// A token given as ?token=... is kept for this tab and taken out of the address bar, so it
// is neither bookmarked nor shared with a copied link.
export function takeToken() {
  const url = new URL(window.location.href);
  const token = url.searchParams.get("token");
  if (token) {
    window.sessionStorage.setItem(TOKEN_KEY, token);
    url.searchParams.delete("token");
    window.history.replaceState(null, "", url.pathname + url.search + url.hash);
  }
}

export async function api(path, params = {}) {
  // Relative to the page (/ui/): the API is one level up, also behind a path prefix.
  const url = new URL("../" + path, window.location.href);
  for (const [name, value] of Object.entries(params)) {
    if (value !== undefined && value !== null) url.searchParams.set(name, String(value));
  }
  const headers = { Accept: "application/json" };
  const token = window.sessionStorage.getItem(TOKEN_KEY);
  if (token) headers.Authorization = "Bearer " + token;
  const response = await fetch(url, { headers, cache: "no-store" });
  if (!response.ok) {
    let detail = response.statusText;
    try {
      const body = await response.json();
      if (typeof body.detail === "string") detail = body.detail;
    } catch (_) {
      // Not JSON: the status text says enough.
    }
    throw new HttpError(response.status, detail);
  }
  return response.json();
}
