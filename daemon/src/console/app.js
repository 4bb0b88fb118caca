// The plexus console: renders the state the admin listener streams
// (/console/events) and the catalog (/console/catalog); its buttons call the admin
// endpoints the CLI calls, with the page's token in a header.
"use strict";

const TOKEN = document.querySelector('meta[name="plexus-token"]').content;
const $ = (id) => document.getElementById(id);
const SVG = "http://www.w3.org/2000/svg";

// Elements from data: text is always set as text, never parsed as markup.
function el(tag, attributes, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attributes || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "on") for (const [event, handler] of Object.entries(value)) node.addEventListener(event, handler);
    else if (key === "text") node.textContent = value;
    else node.setAttribute(key, value === true ? "" : value);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function duration(seconds) {
  if (seconds === null || seconds === undefined) return "-";
  seconds = Math.floor(seconds);
  if (seconds < 60) return seconds + "s";
  if (seconds < 3600) return Math.floor(seconds / 60) + "m" + String(seconds % 60).padStart(2, "0") + "s";
  if (seconds < 172800) return Math.floor(seconds / 3600) + "h" + String(Math.floor(seconds % 3600 / 60)).padStart(2, "0") + "m";
  return Math.floor(seconds / 86400) + "d";
}

function clock(unix) {
  return unix ? new Date(unix * 1000).toLocaleTimeString() : "-";
}

function stateClass(state) {
  if (state === "ready") return "ok";
  if (state === "starting" || state === "idle" || state === "disabled" || state === "stopping") return "wait";
  return "bad";
}

async function post(path, body) {
  try {
    const response = await fetch(path, {
      method: "POST",
      credentials: "same-origin",
      headers: { "content-type": "application/json", "x-plexus-console": TOKEN },
      body: body === undefined ? "" : JSON.stringify(body),
    });
    const text = await response.text();
    let data;
    try { data = JSON.parse(text); } catch (_) { data = { error: text.trim() }; }
    return { ok: response.ok, status: response.status, data };
  } catch (error) {
    return { ok: false, status: 0, data: { error: "no answer: " + error.message } };
  }
}

// What the last actions answered, kept across renders.
const outcomes = new Map();
const busy = new Set();
let current = null;

function button(label, key, run, className) {
  return el("button", {
    type: "button", class: className, disabled: busy.has(key), "data-action": key,
    on: { click: async () => {
      busy.add(key); render(current, true);
      try { outcomes.set(key, await run()); } finally { busy.delete(key); render(current, true); }
    } },
  }, label);
}

function outcomeText(key) {
  const outcome = outcomes.get(key);
  if (!outcome) return null;
  return el("span", { class: "outcome " + (outcome.ok ? "ok" : "bad"), "data-outcome": key, role: "status" }, outcome.text);
}

// ---- health ----

function sparkline(series) {
  const width = 600, height = 56, slots = series.calls.length, step = width / slots;
  const svg = document.createElementNS(SVG, "svg");
  svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
  svg.setAttribute("preserveAspectRatio", "none");
  svg.setAttribute("class", "spark");
  svg.setAttribute("role", "img");
  const total = series.calls.reduce((a, b) => a + b, 0);
  const errors = series.errors.reduce((a, b) => a + b, 0);
  const last = (values) => [...values].reverse().find((value) => value !== null);
  const p50 = last(series.p50_ms), p99 = last(series.p99_ms);
  const title = document.createElementNS(SVG, "title");
  title.textContent = `last 15 minutes: ${total} calls, ${errors} errors` +
    (p50 !== undefined ? `, latest p50 ${p50} ms, p99 ${p99} ms` : "");
  svg.append(title);
  const most = Math.max(1, ...series.calls);
  series.calls.forEach((calls, i) => {
    if (!calls) return;
    const bar = (count, color) => {
      const rect = document.createElementNS(SVG, "rect");
      const h = Math.max(1, count / most * (height - 4));
      rect.setAttribute("x", i * step + 1); rect.setAttribute("width", step - 2);
      rect.setAttribute("y", height - h); rect.setAttribute("height", h);
      rect.setAttribute("fill", color);
      svg.append(rect);
    };
    bar(calls, "#b7cbe6");
    if (series.errors[i]) bar(series.errors[i], "#b00020");
  });
  const slowest = Math.max(0.001, ...series.p99_ms.filter((v) => v !== null));
  // Latency as steps, one per slot: a single slot with calls still shows.
  for (const [values, color] of [[series.p50_ms, "#17702b"], [series.p99_ms, "#8a6d00"]]) {
    let run = [];
    const flush = () => {
      if (!run.length) return;
      const line = document.createElementNS(SVG, "polyline");
      line.setAttribute("points", run.join(" "));
      line.setAttribute("fill", "none"); line.setAttribute("stroke", color); line.setAttribute("stroke-width", "2");
      line.setAttribute("vector-effect", "non-scaling-stroke");
      svg.append(line);
      run = [];
    };
    values.forEach((v, i) => {
      if (v === null) return flush();
      const y = height - 2 - v / slowest * (height - 6);
      run.push(`${i * step},${y}`, `${(i + 1) * step},${y}`);
    });
    flush();
  }
  const legend = el("div", { class: "legend" },
    el("b", { class: "calls" }, `■ ${total} calls`), " ",
    el("b", { class: "errors" }, `■ ${errors} errors`), " ",
    el("b", { class: "p50" }, `— p50 ${p50 ?? "-"} ms`), " ",
    el("b", { class: "p99" }, `— p99 ${p99 ?? "-"} ms`), " · 15 min");
  return [svg, legend];
}

const openTails = new Set();

function upstreamCard(upstream, now) {
  const name = upstream.name, state = upstream.state;
  let reason = null;
  if (state !== "ready" && state !== "idle" && state !== "starting") {
    const why = upstream.last_error || upstream.last_exit || "";
    const retry = upstream.retry_after_ms !== undefined ? ` (next try in ${(upstream.retry_after_ms / 1000).toFixed(1)} s)` : "";
    reason = el("p", { class: "reason bad", "data-reason": name }, why + retry);
  }
  const tail = upstream.stderr_tail || [];
  const details = tail.length ? el("details", { open: openTails.has(name), on: { toggle: (e) => e.target.open ? openTails.add(name) : openTails.delete(name) } },
    el("summary", {}, `stderr (last ${Math.min(tail.length, 20)} lines)`),
    el("pre", {}, tail.slice(-20).join("\n"))) : null;
  const restartKey = "restart:" + name;
  return el("article", { class: "card", "data-upstream": name, "data-state": state },
    el("h3", {}, name, el("span", { class: "state " + stateClass(state), "data-role": "state" }, state.replace("_", " "))),
    reason,
    el("p", { class: "meta" },
      `pid ${upstream.pid ?? "-"} · up `, el("span", { "data-uptime": name }, duration(upstream.uptime_s)),
      ` · restarts ${upstream.restarts}` +
      (upstream.last_restart ? ` (last ${clock(upstream.last_restart)})` : "") +
      ` · calls ${upstream.in_flight}/${upstream.pending} · ${upstream.entries.tools} tools · pin ${upstream.pin.state}` +
      (upstream.pin.held ? ` (${upstream.pin.held} held)` : "")),
    sparkline(upstream.series),
    details,
    el("div", { class: "row" },
      button("Restart", restartKey, async () => {
        const answer = await post(`/upstreams/${encodeURIComponent(name)}/restart`);
        const data = answer.data;
        const text = answer.ok
          ? (data.outcome === "restarted" ? `restarted: pid ${data.previous_pid ?? "-"} → ${data.pid ?? "-"}` : `restarting (${data.state ?? data.outcome})`)
          : `restart failed: ${data.error || answer.status}`;
        return { ok: answer.ok, text: text + " · " + new Date().toLocaleTimeString() };
      }),
      outcomeText(restartKey)));
}

function renderDaemon(state) {
  const daemon = state.daemon;
  $("version").textContent = daemon.version;
  const reload = daemon.last_reload;
  const http = Object.entries(state.sessions.http || {});
  const figures = [
    ["pid", daemon.pid],
    ["up", duration(daemon.uptime_s)],
    ["RSS", daemon.rss_bytes ? (daemon.rss_bytes / 1048576).toFixed(1) + " MiB" : "-"],
    ["config", `${daemon.config} (${String(daemon.config_sha256 || "").slice(0, 12)})`],
    ["last reload", reload ? `${reload.outcome} at ${clock(reload.at)}` : "none since start"],
  ];
  $("daemon").replaceChildren(...figures.map(([key, value]) => el("div", {}, el("dt", {}, key), el("dd", {}, value))));
  $("sessions").textContent = "http: " + (http.length ? http.map(([p, n]) => `${p} ${n}`).join(", ") : "0") +
    " · stdio: " + state.sessions.stdio;
}

// ---- pins ----

function shown(value) {
  if (value === undefined || value === null) return "(absent)";
  const text = JSON.stringify(value);
  return text.length > 400 ? text.slice(0, 397) + "…" : text;
}

function renderPins(pins) {
  const upstreams = Object.entries(pins.upstreams || {}).filter(([, u]) => (u.changes || []).length);
  $("pins-count").textContent = upstreams.length ? `${upstreams.reduce((n, [, u]) => n + u.changes.length, 0)} pending` : "";
  if (!upstreams.length) {
    $("pin-changes").replaceChildren(el("p", { class: "quiet" }, pins.error ? "Pins unreadable: " + pins.error : "Every upstream's catalog is as pinned."));
    return;
  }
  $("pin-changes").replaceChildren(...upstreams.map(([name, upstream]) => {
    const approveAll = "approve:" + name, reset = "reset:" + name;
    const approve = (entry) => async () => {
      const answer = await post("/pins/approve", entry === undefined ? { upstream: name } : { upstream: name, name: entry });
      return { ok: answer.ok, text: answer.ok ? `approved ${entry ?? "all"} · ${new Date().toLocaleTimeString()}` : `refused: ${answer.data.error}` };
    };
    const rows = upstream.changes.map((change) => {
      const key = `approve:${name}/${change.identity}`;
      return el("tr", { "data-entry": change.identity },
        el("td", { class: "class-" + change.class }, change.class),
        el("td", {}, el("code", {}, `${change.kind}/${change.identity}`)),
        el("td", {}, el("code", {}, change.path || "(whole entry)"), el("br"), el("small", {}, change.reason)),
        el("td", { class: "old" }, el("code", {}, shown(change.old))),
        el("td", { class: "new" }, el("code", {}, shown(change.new))),
        el("td", {}, change.kind === "server" ? null : button("Approve", key, approve(change.identity)), outcomeText(key)));
    });
    return el("div", { class: "upstream-pins", "data-pins": name },
      el("h3", {}, name, el("small", {}, `${upstream.changes.length} change(s) since ${upstream.pinned_at || "never pinned"}`),
        button("Approve all", approveAll, approve(undefined)),
        button("Reset", reset, async () => {
          const answer = await post("/pins/reset", { upstream: name });
          return { ok: answer.ok, text: answer.ok ? "pin forgotten; pinned afresh when next seen" : `refused: ${answer.data.error}` };
        }, "danger"),
        outcomeText(approveAll), outcomeText(reset)),
      el("div", { class: "scroll" }, el("table", { class: "diff" },
        el("thead", {}, el("tr", {}, ["class", "entry", "JSON pointer", "old", "new", ""].map((h) => el("th", {}, h)))),
        el("tbody", {}, rows))));
  }));
}

// ---- catalog ----

let catalog = { entries: [], views: [] };
let catalogDigest = null;

async function loadCatalog() {
  const view = $("catalog-view").value;
  try {
    const response = await fetch("/console/catalog" + (view ? "?view=" + encodeURIComponent(view) : ""), { credentials: "same-origin" });
    if (response.ok) catalog = await response.json();
  } catch (_) { return; }
  const select = $("catalog-view");
  const known = [...select.options].map((o) => o.value).slice(1);
  if (known.join("\n") !== catalog.views.join("\n")) {
    select.replaceChildren(el("option", { value: "" }, "whole catalog"), ...catalog.views.map((v) => el("option", { value: v }, v)));
    select.value = view;
  }
  renderCatalog();
}

function heldText(held) {
  const fields = (held.fields || []).map((f) => f.path || f.reason).filter(Boolean);
  return `held: ${held.class || "unapproved"} change` + (fields.length ? ` (${fields.join(", ")})` : "") + (held.reason ? ` · ${held.reason}` : "");
}

function renderCatalog() {
  const upstream = $("catalog-upstream").value;
  const words = $("catalog-search").value.toLowerCase().split(/\s+/).filter(Boolean);
  const matching = catalog.entries.filter((entry) => {
    if (upstream && entry.upstream !== upstream) return false;
    const text = [entry.name, entry.original, entry.description, entry.upstream, entry.kind].join(" ").toLowerCase();
    return words.every((word) => text.includes(word));
  });
  // What is held is what an operator has to decide on: it comes first.
  matching.sort((a, b) => (b.held ? 1 : 0) - (a.held ? 1 : 0));
  $("catalog-count").textContent = `${matching.length} of ${catalog.entries.length}`;
  $("catalog-entries").replaceChildren(...matching.slice(0, 500).map((entry) => el("li", { "data-name": entry.name, "data-kind": entry.kind, "data-held": entry.held ? "true" : null },
    el("span", { class: "name" }, entry.name),
    el("span", { class: "kind" }, entry.kind.replace("_", " ")),
    el("span", { class: "tag" }, `from ${entry.upstream}` + (entry.original && entry.original !== entry.name ? ` as ${entry.original}` : "")),
    entry.held ? el("span", { class: "tag held" }, heldText(entry.held)) : null,
    entry.views && entry.views.length ? el("span", { class: "tag" }, "views: " + entry.views.join(", ")) : null,
    entry.description ? el("p", {}, entry.description) : null,
    entry.schema && Object.keys(entry.schema).length ? el("details", {}, el("summary", {}, "schema"), el("pre", {}, JSON.stringify(entry.schema, null, 2))) : null,
    entry.held ? el("details", {}, el("summary", {}, "why it is held"), el("pre", {}, JSON.stringify(entry.held, null, 2))) : null)));
}

// ---- activity ----

let activity = [];

function renderActivity() {
  const words = $("activity-filter").value.toLowerCase().split(/\s+/).filter(Boolean);
  const rows = activity.filter((event) => {
    const text = Object.values(event).join(" ").toLowerCase();
    return words.every((word) => text.includes(word));
  });
  $("activity-rows").replaceChildren(...rows.map((event) => el("tr", {},
    el("td", {}, event.time ? new Date(event.time).toLocaleTimeString() : "-"),
    el("td", {}, event.principal ?? "-"), el("td", {}, event.view ?? "-"), el("td", {}, event.upstream ?? "-"),
    el("td", {}, el("code", {}, [event.event, event.name].filter(Boolean).join(" "))),
    el("td", { class: event.outcome === "ok" ? "ok" : "bad" }, typeof event.outcome === "string" ? event.outcome : JSON.stringify(event.outcome ?? "-")),
    el("td", {}, event.duration_ms ?? "-"))));
}

// ---- the whole ----

let shownPins = null, shownActivity = null, shownUpstreams = null;

function render(state, actionsOnly) {
  if (!state) return;
  renderDaemon(state);
  // Cards are rebuilt only when something other than the uptime changed, so a
  // click is never lost to a card replaced under the pointer.
  const upstreams = JSON.stringify(state.upstreams.map((u) => ({ ...u, uptime_s: null, retry_after_ms: null })));
  if (actionsOnly || upstreams !== shownUpstreams) {
    shownUpstreams = upstreams;
    $("upstreams").replaceChildren(...state.upstreams.map((u) => upstreamCard(u, state.daemon.now)));
  }
  for (const upstream of state.upstreams) {
    const uptime = document.querySelector(`[data-uptime="${CSS.escape(upstream.name)}"]`);
    if (uptime) uptime.textContent = duration(upstream.uptime_s);
  }
  const pins = JSON.stringify(state.pins);
  if (actionsOnly || pins !== shownPins) { shownPins = pins; renderPins(state.pins); }
  if (actionsOnly) return;
  const upstreamSelect = $("catalog-upstream");
  const names = state.upstreams.map((u) => u.name);
  if ([...upstreamSelect.options].slice(1).map((o) => o.value).join("\n") !== names.join("\n")) {
    const chosen = upstreamSelect.value;
    upstreamSelect.replaceChildren(el("option", { value: "" }, "all"), ...names.map((n) => el("option", { value: n }, n)));
    upstreamSelect.value = chosen;
  }
  if (state.catalog_digest !== catalogDigest) { catalogDigest = state.catalog_digest; loadCatalog(); }
  $("activity-off").hidden = state.activity.enabled;
  $("activity-on").hidden = !state.activity.enabled;
  const events = JSON.stringify(state.activity.events);
  if (events !== shownActivity) { shownActivity = events; activity = state.activity.events; renderActivity(); }
}

let lastState = 0;

function setLink(live, text) {
  const link = $("link");
  link.className = "link " + (live ? "ok" : "bad");
  link.textContent = text;
  link.dataset.live = live ? "true" : "false";
}

function connect() {
  const source = new EventSource("/console/events");
  source.addEventListener("open", () => setLink(true, "live"));
  source.addEventListener("state", (event) => {
    lastState = Date.now();
    setLink(true, "live");
    current = JSON.parse(event.data);
    render(current, false);
  });
  source.addEventListener("error", () => {
    setLink(false, "connection lost, reconnecting…");
    // The browser retries on its own unless the answer was refused outright.
    if (source.readyState === EventSource.CLOSED) setTimeout(connect, 2000);
  });
}

// A stream that stays open but says nothing is as lost as a closed one.
setInterval(() => {
  if (lastState && Date.now() - lastState > 3500) setLink(false, "connection lost, reconnecting…");
}, 1000);

$("reload").addEventListener("click", async () => {
  const button = $("reload");
  button.disabled = true;
  const answer = await post("/reload");
  button.disabled = false;
  const data = answer.data;
  const errors = (data.errors || []).map((e) => typeof e === "string" ? e : JSON.stringify(e)).join("; ");
  $("reload-outcome").className = "outcome " + (answer.ok && data.outcome === "applied" ? "ok" : "bad");
  $("reload-outcome").textContent = (data.outcome ? `reload ${data.outcome}` : `reload failed: ${data.error || answer.status}`) +
    (errors ? `: ${errors}` : "") + " · " + new Date().toLocaleTimeString();
});
if (document.querySelector('meta[name="plexus-signed-in"]').content === "true") {
  $("sign-out").hidden = false;
  $("sign-out").addEventListener("click", async () => {
    await post("/console/logout");
    location.reload();
  });
}
$("catalog-view").addEventListener("change", loadCatalog);
$("catalog-upstream").addEventListener("change", renderCatalog);
$("catalog-search").addEventListener("input", renderCatalog);
$("activity-filter").addEventListener("input", renderActivity);
connect();
