// mocksandbox console: plain JavaScript, no framework, no build step, no third-party code.
//
// A client of the /_mock/ API like the pytest fixtures (DESIGN seam 7): the live view follows the
// server-sent events of /_mock/events; every other panel reads and writes the same endpoints a
// test would. Data is always put on the page as text (textContent), never as HTML.
"use strict";

(() => {
  const $ = (id) => document.getElementById(id);
  const WINDOW_S = 60; // the charts' span
  const MAX_ENTRIES = 2000; // journal entries the page keeps
  const MAX_ROWS = 300; // journal rows it shows
  const SWEDEV_PATHS = new Set(["/start_instance", "/process_action", "/postprocess", "/compute_reward"]);

  // -- helpers ------------------------------------------------------------------------------------

  async function api(method, path, body) {
    const init = { method, headers: {} };
    if (body !== undefined) {
      init.headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    const response = await fetch(path, init);
    const text = await response.text();
    let data = null;
    try {
      data = text ? JSON.parse(text) : null;
    } catch (_) {
      data = null;
    }
    return { status: response.status, ok: response.ok, data, text };
  }

  function el(tag, props, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(props || {})) {
      if (key === "class") node.className = value;
      else if (key === "dataset") Object.assign(node.dataset, value);
      else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
      else node[key] = value;
    }
    for (const child of children) {
      if (child === null || child === undefined) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  function pretty(value) {
    if (value === null || value === undefined) return "(none)";
    return typeof value === "string" ? value : JSON.stringify(value, null, 2);
  }

  function describeError(result) {
    const detail = result.data && result.data.detail !== undefined ? result.data.detail : result.text;
    if (Array.isArray(detail)) {
      return detail.map((item) => `${(item.loc || []).join(".")}: ${item.msg}`).join("\n");
    }
    return `HTTP ${result.status}: ${typeof detail === "string" ? detail : JSON.stringify(detail)}`;
  }

  function statusClass(status) {
    if (status === null || status === undefined) return "none";
    if (status === 429) return "429";
    return String(Math.floor(status / 100));
  }

  function fill(tbody, rows) {
    tbody.replaceChildren(...rows);
  }

  // Loaders can overlap (a click, a live update): only the answer to the latest call of each is
  // shown, so that an older answer arriving late never puts back what a newer one removed.
  const latest = new Map();
  function ticket(name) {
    const number = (latest.get(name) || 0) + 1;
    latest.set(name, number);
    return () => latest.get(name) === number;
  }

  // -- tabs ---------------------------------------------------------------------------------------

  const TABS = ["live", "journal", "faults", "sessions", "playground"];
  let currentTab = "live";

  function showTab(name) {
    if (!TABS.includes(name)) name = "live";
    currentTab = name;
    for (const tab of TABS) $(tab).hidden = tab !== name;
    for (const link of document.querySelectorAll("#tabs a")) {
      link.classList.toggle("active", link.dataset.tab === name);
    }
    if (name === "journal") {
      journal.dirty = true;
      renderJournal();
    }
    if (name === "faults") loadFaults();
    if (name === "sessions") loadSessions();
    if (name === "playground") loadLanguages();
  }

  // -- live ---------------------------------------------------------------------------------------

  const live = {
    points: [], // {t, peak, inFlight}
    totals: [], // {t, total}
    rps: [], // {t, rps}
    cap: null,
    stats: null,
  };
  const journal = { entries: new Map(), paths: new Set(), languages: new Set(), dirty: true };

  function connect() {
    const source = new EventSource("/_mock/events");
    const badge = $("connection");
    source.addEventListener("open", () => {
      badge.textContent = "live";
      badge.className = "badge on";
    });
    source.addEventListener("error", () => {
      badge.textContent = "reconnecting";
      badge.className = "badge off";
    });
    source.addEventListener("update", (event) => onUpdate(JSON.parse(event.data)));
  }

  function onUpdate(update) {
    if (update.reset) {
      journal.entries.clear();
      live.points = [];
      live.totals = [];
      live.rps = [];
      journal.dirty = true;
    }
    if (update.history) {
      // A first look (or one after a reset or a reconnection): the server's last minute.
      live.points = update.history.in_flight.map(([t, peak]) => ({ t, peak, inFlight: peak }));
      live.rps = update.history.arrivals.map(([t, count]) => ({ t, rps: count }));
      live.points = live.points.filter((p) => p.t < update.t);
      live.rps = live.rps.filter((p) => p.t < update.t);
    }
    const stats = update.stats;
    live.stats = stats;
    live.cap = stats.max_in_flight_cap;
    live.points.push({ t: update.t, peak: update.peak, inFlight: update.in_flight });
    live.totals.push({ t: update.t, total: stats.requests_total });
    const horizon = update.t - WINDOW_S;
    while (live.points.length && live.points[0].t < horizon) live.points.shift();
    // Requests/s over the last second (or what there is of it).
    while (live.totals.length > 2 && live.totals[1].t <= update.t - 1) live.totals.shift();
    const first = live.totals[0];
    const span = update.t - first.t;
    const rate = span > 0 ? Math.max(0, stats.requests_total - first.total) / span : 0;
    live.rps.push({ t: update.t, rps: rate });
    while (live.rps.length && live.rps[0].t < horizon) live.rps.shift();
    renderTiles(update, stats, rate);
    drawInFlight();
    drawRps();
    renderStatusMix(stats.by_status || {});

    let swedev = false;
    for (const entry of update.entries) {
      journal.entries.set(entry.id, entry);
      if (entry.path && entry.method !== "EVENT" && !journal.paths.has(entry.path)) {
        journal.paths.add(entry.path);
        addOption($("filter-path"), entry.path);
      }
      if (entry.language && !journal.languages.has(entry.language)) {
        journal.languages.add(entry.language);
        addOption($("filter-language"), entry.language);
      }
      if (SWEDEV_PATHS.has(entry.path) && entry.ended !== null) swedev = true;
    }
    if (journal.entries.size > MAX_ENTRIES) {
      const ids = [...journal.entries.keys()].sort((a, b) => a - b);
      for (const id of ids.slice(0, journal.entries.size - MAX_ENTRIES)) journal.entries.delete(id);
    }
    if (update.entries.length || update.reset) journal.dirty = true;
    if (currentTab === "journal") scheduleJournal();
    if (swedev) scheduleSessions();
    if (currentTab === "faults") scheduleFaults(stats);
  }

  function addOption(select, value) {
    const options = [...select.options].slice(1).map((o) => o.value);
    options.push(value);
    options.sort();
    const index = options.indexOf(value);
    select.insertBefore(el("option", { value }, value), select.options[index + 1] || null);
  }

  function renderTiles(update, stats, rate) {
    $("in-flight").textContent = update.in_flight;
    $("cap").textContent = live.cap === null ? "no cap" : `cap ${live.cap}`;
    $("max-in-flight").textContent = stats.max_in_flight;
    $("rps").textContent = rate >= 10 ? Math.round(rate) : rate.toFixed(1);
    $("total").textContent = stats.requests_total;
    $("rejected").textContent = (stats.by_status || {})["429"] || 0;
    $("rejected-cap").textContent = stats.rejected_by_cap;
    $("faults-fired").textContent = Object.values(stats.faults_fired || {}).reduce((a, b) => a + b, 0);
    $("divergences").textContent = (stats.divergences || {}).total || 0;
  }

  function chartFrame(canvas, top) {
    const ctx = canvas.getContext("2d");
    const width = canvas.width;
    const height = canvas.height;
    const pad = { left: 34, right: 8, top: 8, bottom: 16 };
    ctx.clearRect(0, 0, width, height);
    ctx.font = "10px sans-serif";
    ctx.fillStyle = "#6a737d";
    ctx.strokeStyle = "#d8dee4";
    ctx.lineWidth = 1;
    const plotW = width - pad.left - pad.right;
    const plotH = height - pad.top - pad.bottom;
    for (let i = 0; i <= 4; i++) {
      const y = pad.top + (plotH * i) / 4;
      ctx.beginPath();
      ctx.moveTo(pad.left, y);
      ctx.lineTo(width - pad.right, y);
      ctx.stroke();
      const value = top * (1 - i / 4);
      ctx.fillText(value >= 10 ? Math.round(value) : value.toFixed(1), 2, y + 3);
    }
    ctx.fillText(`-${WINDOW_S} s`, pad.left, height - 3);
    ctx.fillText("now", width - pad.right - 18, height - 3);
    const now = live.points.length ? live.points[live.points.length - 1].t : 0;
    const x = (t) => pad.left + plotW * (1 - (now - t) / WINDOW_S);
    const y = (v) => pad.top + plotH * (1 - v / top);
    return { ctx, x, y, pad, plotW, plotH, width };
  }

  function drawInFlight() {
    const canvas = $("inflight-chart");
    const peak = live.points.reduce((m, p) => Math.max(m, p.peak), 0);
    const top = Math.max(1, peak, live.cap || 0) * 1.15;
    const { ctx, x, y, pad, width } = chartFrame(canvas, top);
    if (live.cap !== null) {
      ctx.save();
      ctx.strokeStyle = "#cf222e";
      ctx.setLineDash([5, 4]);
      ctx.beginPath();
      ctx.moveTo(pad.left, y(live.cap));
      ctx.lineTo(width - pad.right, y(live.cap));
      ctx.stroke();
      ctx.fillStyle = "#cf222e";
      ctx.fillText(`cap ${live.cap}`, width - pad.right - 40, y(live.cap) - 3);
      ctx.restore();
    }
    stepLine(ctx, live.points, x, y, (p) => p.peak, "#0969da", "rgba(9, 105, 218, 0.15)");
    // The dataset is what the chart shows, for the page's own tests (and anyone curious).
    canvas.dataset.max = String(peak);
    canvas.dataset.points = String(live.points.length);
    canvas.dataset.last = String(live.points.length ? live.points[live.points.length - 1].peak : 0);
  }

  function drawRps() {
    const canvas = $("rps-chart");
    const peak = live.rps.reduce((m, p) => Math.max(m, p.rps), 0);
    const { ctx, x, y } = chartFrame(canvas, Math.max(1, peak) * 1.15);
    stepLine(ctx, live.rps, x, y, (p) => p.rps, "#1a7f37", "rgba(26, 127, 55, 0.12)");
    canvas.dataset.max = String(peak);
  }

  function stepLine(ctx, points, x, y, value, stroke, fill) {
    if (!points.length) return;
    ctx.beginPath();
    ctx.moveTo(x(points[0].t), y(0));
    let last = 0;
    for (const point of points) {
      ctx.lineTo(x(point.t), y(last));
      last = value(point);
      ctx.lineTo(x(point.t), y(last));
    }
    const end = points[points.length - 1].t;
    ctx.lineTo(x(end), y(0));
    ctx.closePath();
    ctx.fillStyle = fill;
    ctx.fill();
    ctx.beginPath();
    last = 0;
    for (const [i, point] of points.entries()) {
      if (i === 0) ctx.moveTo(x(point.t), y(value(point)));
      else {
        ctx.lineTo(x(point.t), y(last));
        ctx.lineTo(x(point.t), y(value(point)));
      }
      last = value(point);
    }
    ctx.strokeStyle = stroke;
    ctx.lineWidth = 1.5;
    ctx.stroke();
  }

  function renderStatusMix(byStatus) {
    const groups = new Map();
    for (const [status, count] of Object.entries(byStatus)) {
      const key = status === "none" ? "none" : statusClass(Number(status));
      groups.set(key, (groups.get(key) || 0) + count);
    }
    const total = [...groups.values()].reduce((a, b) => a + b, 0);
    const names = { 1: "1xx", 2: "2xx", 3: "3xx", 4: "4xx", 429: "429", 5: "5xx", none: "no answer" };
    const order = ["2", "3", "4", "429", "5", "none", "1"].filter((k) => groups.has(k));
    const bar = $("status-bar");
    bar.replaceChildren(
      ...order.map((key) => {
        const span = el("span", { class: `s${key}`, title: `${names[key]}: ${groups.get(key)}` });
        span.style.width = `${(100 * groups.get(key)) / total}%`;
        return span;
      }),
    );
    const legend = Object.entries(byStatus)
      .sort()
      .map(([status, count]) =>
        el("span", { dataset: { status } }, el("i", { class: `s${status === "none" ? "none" : statusClass(Number(status))}` }), `${status}: ${count}`),
      );
    $("status-legend").replaceChildren(...legend);
  }

  // -- journal ------------------------------------------------------------------------------------

  let journalTimer = null;
  let selectedEntry = null;

  function scheduleJournal() {
    if (journalTimer === null) journalTimer = setTimeout(renderJournal, 250);
  }

  function entryMatches(entry) {
    const path = $("filter-path").value;
    const language = $("filter-language").value;
    const status = $("filter-status").value;
    const text = $("filter-text").value.trim().toLowerCase();
    if (path && entry.path !== path) return false;
    if (language && entry.language !== language) return false;
    if ($("filter-faulted").checked && !entry.fault_action) return false;
    if ($("filter-diverged").checked && !(entry.divergences || []).length) return false;
    if (status) {
      const s = entry.status;
      if (status === "pending" && entry.ended !== null) return false;
      if (status === "none" && (entry.ended === null || s !== null)) return false;
      if (status === "429" && s !== 429) return false;
      if (["2xx", "4xx", "5xx"].includes(status) && (s === null || String(Math.floor(s / 100)) !== status[0])) return false;
    }
    if (text) {
      const hay = `${entry.path} ${entry.client} ${entry.worker || ""} ${entry.method}`.toLowerCase();
      if (!hay.includes(text)) return false;
    }
    return true;
  }

  function renderJournal() {
    journalTimer = null;
    if (!journal.dirty) return;
    journal.dirty = false;
    const ids = [...journal.entries.keys()].sort((a, b) => b - a);
    const rows = [];
    let matched = 0;
    for (const id of ids) {
      const entry = journal.entries.get(id);
      if (!entryMatches(entry)) continue;
      matched += 1;
      if (rows.length < MAX_ROWS) rows.push(journalRow(entry));
    }
    fill($("journal-table").tBodies[0], rows);
    $("journal-count").textContent = `${matched} of ${journal.entries.size} kept entries` + (matched > MAX_ROWS ? ` (newest ${MAX_ROWS} shown)` : "");
  }

  function journalRow(entry) {
    const pending = entry.ended === null;
    const duration = pending ? "…" : Math.round((entry.ended - entry.started) * 1000);
    const status = pending ? "…" : entry.status === null ? entry.outcome : entry.status;
    const fault = entry.fault_action ? `${entry.fault_action} (${entry.faults.join(", ")})` : "";
    const row = el(
      "tr",
      { dataset: { id: entry.id, status: String(entry.status), path: entry.path }, onclick: () => openEntry(entry.id) },
      el("td", {}, entry.id),
      el("td", {}, entry.started.toFixed(3)),
      el("td", {}, entry.method),
      el("td", {}, entry.path),
      el("td", {}, entry.language || ""),
      el("td", { class: `st-${statusClass(entry.status)}` }, status),
      el("td", {}, duration),
      el("td", { class: "fault" }, fault),
      divergenceCell(entry.divergences || []),
      el("td", {}, entry.worker || ""),
    );
    if (entry.id === selectedEntry) row.classList.add("selected");
    return row;
  }

  // Where SandboxFusion would have answered differently: the kinds, each note in the tooltip.
  function divergenceCell(notes) {
    if (!notes.length) return el("td", { class: "diverged-none" }, "");
    const kinds = [...new Set(notes.map((note) => note.split(":")[0]))];
    return el("td", { class: "diverged", title: notes.join("\n") }, `differs: ${kinds.join(", ")}`);
  }

  async function openEntry(id) {
    selectedEntry = id;
    for (const row of $("journal-table").tBodies[0].rows) row.classList.toggle("selected", Number(row.dataset.id) === id);
    const current = ticket("entry");
    const result = await api("GET", `/_mock/journal/${id}`);
    if (!current()) return;
    const panel = $("entry-detail");
    panel.hidden = false;
    $("snippet").hidden = true;
    if (!result.ok) {
      $("entry-title").textContent = `#${id}`;
      $("entry-meta").replaceChildren();
      $("entry-request").textContent = describeError(result);
      $("entry-response").textContent = "";
      return;
    }
    const entry = result.data;
    panel.dataset.id = String(id);
    panel.entry = entry;
    $("entry-title").textContent = `#${entry.id} ${entry.method} ${entry.path}`;
    const meta = [
      ["status", entry.status === null ? "(no answer)" : entry.status],
      ["outcome", entry.outcome],
      ["duration", entry.duration === null ? "in flight" : `${(entry.duration * 1000).toFixed(1)} ms`],
      ["query", entry.query || ""],
      ["fault", entry.fault_action ? `${entry.fault_action} (rules ${entry.faults.join(", ")})` : "none"],
      ["SandboxFusion", (entry.divergences || []).length ? entry.divergences.join("\n") : "would answer the same, as far as the mock knows"],
      ["client", entry.client],
      ["worker", entry.worker || "(one process)"],
      ["started", `${entry.started.toFixed(3)} s after the last reset`],
    ];
    $("entry-meta").replaceChildren(...meta.flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, v)]));
    $("entry-request").textContent = pretty(entry.body) + (entry.body_truncated ? "\n… (truncated)" : "");
    $("entry-response").textContent = pretty(entry.response) + (entry.response_truncated ? "\n… (truncated)" : "");
  }

  function shellQuote(text) {
    return `'${text.replace(/'/g, "'\\''")}'`;
  }

  function entryUrl(entry) {
    return `${location.origin}${entry.path}${entry.query ? `?${entry.query}` : ""}`;
  }

  function asCurl(entry) {
    const parts = ["curl"];
    if (entry.method !== "GET" || entry.body !== null) parts.push("-X", entry.method);
    parts.push(shellQuote(entryUrl(entry)));
    if (entry.body !== null) {
      const isJson = typeof entry.body !== "string";
      if (isJson) parts.push("-H", shellQuote("Content-Type: application/json"));
      parts.push("--data-raw", shellQuote(isJson ? JSON.stringify(entry.body) : entry.body));
    }
    return parts.join(" ");
  }

  function pyLiteral(value, indent) {
    const pad = "    ".repeat(indent + 1);
    const end = "    ".repeat(indent);
    if (value === null) return "None";
    if (value === true) return "True";
    if (value === false) return "False";
    if (typeof value === "number" || typeof value === "string") return JSON.stringify(value);
    if (Array.isArray(value)) {
      if (!value.length) return "[]";
      return `[\n${value.map((v) => `${pad}${pyLiteral(v, indent + 1)},`).join("\n")}\n${end}]`;
    }
    const keys = Object.keys(value);
    if (!keys.length) return "{}";
    return `{\n${keys.map((k) => `${pad}${JSON.stringify(k)}: ${pyLiteral(value[k], indent + 1)},`).join("\n")}\n${end}}`;
  }

  function asPython(entry) {
    const lines = ["import requests", "", `response = requests.request(`, `    ${JSON.stringify(entry.method)},`, `    ${JSON.stringify(entryUrl(entry))},`];
    if (entry.body !== null) {
      if (typeof entry.body === "string") lines.push(`    data=${JSON.stringify(entry.body)}.encode(),`);
      else lines.push(`    json=${pyLiteral(entry.body, 1)},`);
    }
    lines.push("    timeout=60,", ")", "print(response.status_code, response.text)");
    return lines.join("\n");
  }

  function copySnippet(make) {
    const entry = $("entry-detail").entry;
    if (!entry) return;
    const text = make(entry);
    const snippet = $("snippet");
    snippet.textContent = text;
    snippet.hidden = false;
    if (navigator.clipboard) navigator.clipboard.writeText(text).catch(() => undefined);
  }

  // -- faults and cap -----------------------------------------------------------------------------

  let faultsTimer = null;
  let faultsSeen = null;
  let schema = null;

  function scheduleFaults(stats) {
    const key = `${stats.requests_total}:${JSON.stringify(stats.faults_fired)}`;
    if (key === faultsSeen || faultsTimer !== null) return;
    faultsTimer = setTimeout(() => {
      faultsTimer = null;
      faultsSeen = key;
      loadFaults();
    }, 500);
  }

  async function loadFaults() {
    const current = ticket("faults");
    const [rules, capacity] = await Promise.all([api("GET", "/_mock/faults"), api("GET", "/_mock/capacity")]);
    if (!current()) return;
    if (rules.ok) {
      const rows = rules.data.faults.map((rule) => {
        const { type, ...params } = rule.action;
        return el(
          "tr",
          { dataset: { id: rule.id } },
          el("td", {}, rule.id),
          el("td", {}, rule.name || ""),
          el("td", {}, JSON.stringify(rule.match || {})),
          el("td", {}, Object.keys(params).length ? `${type} ${JSON.stringify(params)}` : type),
          el("td", {}, JSON.stringify(rule.schedule || {})),
          el("td", { class: "matched" }, rule.matched),
          el("td", { class: "fired" }, rule.fired),
          el("td", {}, el("button", { type: "button", class: "remove", onclick: () => removeFault(rule.id) }, "Remove")),
        );
      });
      fill($("faults-table").tBodies[0], rows);
    }
    if (capacity.ok) showCapacity(capacity.data);
    if (!schema) await buildFaultForm();
  }

  async function removeFault(id) {
    await api("DELETE", `/_mock/faults/${encodeURIComponent(id)}`);
    loadFaults();
  }

  function resolve(node) {
    if (node && node.$ref) return schema.$defs[node.$ref.split("/").pop()];
    return node;
  }

  function fieldKind(prop) {
    const options = prop.anyOf ? prop.anyOf.filter((o) => o.type !== "null") : [prop];
    const first = options[0] || {};
    if (first.type === "integer" || first.type === "number") return "number";
    if (first.type === "string") return "string";
    return "json"; // objects, arrays, anything
  }

  function fieldInputs(container, prefix, definition, skip) {
    const required = new Set(definition.required || []);
    container.replaceChildren(
      ...Object.entries(definition.properties)
        .filter(([name]) => name !== skip)
        .map(([name, prop]) => {
          const kind = fieldKind(prop);
          const placeholder = prop.default !== undefined && prop.default !== null ? JSON.stringify(prop.default) : kind === "json" ? "JSON" : "";
          const input = el("input", { name: `${prefix}.${name}`, placeholder, dataset: { kind } });
          input.addEventListener("input", previewFault);
          return el("label", { class: "field" }, el("span", {}, `${name}${required.has(name) ? " *" : ""}`), input);
        }),
    );
  }

  async function buildFaultForm() {
    const result = await api("GET", "/_mock/faults/schema");
    if (!result.ok) return;
    schema = result.data;
    fieldInputs($("fault-match"), "match", resolve(schema.properties.match));
    fieldInputs($("fault-schedule"), "schedule", resolve(schema.properties.schedule));
    const mapping = schema.properties.action.discriminator.mapping;
    const select = $("fault-action-type");
    select.replaceChildren(...Object.keys(mapping).map((type) => el("option", { value: type }, type)));
    select.value = "status";
    const showAction = () => {
      fieldInputs($("fault-action"), "action", resolve({ $ref: mapping[select.value] }), "type");
      previewFault();
    };
    select.addEventListener("change", showAction);
    showAction();
  }

  function inputValue(input) {
    const text = input.value.trim();
    if (text === "") return undefined;
    if (input.dataset.kind === "number") return /^-?\d+(\.\d+)?([eE][-+]?\d+)?$/.test(text) ? Number(text) : text;
    if (input.dataset.kind === "json") {
      try {
        return JSON.parse(text);
      } catch (_) {
        return text; // sent as it is: the server says what is wrong with it
      }
    }
    return text;
  }

  function faultFromForm() {
    const rule = {};
    for (const input of $("fault-form").querySelectorAll("input[name], select[name]")) {
      const value = inputValue(input);
      if (value === undefined) continue;
      const [group, name] = input.name.includes(".") ? input.name.split(".") : [null, input.name];
      if (group === null) rule[name] = value;
      else (rule[group] = rule[group] || {})[name] = value;
    }
    return rule;
  }

  function previewFault() {
    $("fault-preview").textContent = JSON.stringify(faultFromForm(), null, 2);
  }

  async function addFault(event) {
    event.preventDefault();
    const result = await api("POST", "/_mock/faults", faultFromForm());
    const error = $("fault-error");
    if (result.ok) {
      error.hidden = true;
      error.textContent = "";
    } else {
      error.hidden = false;
      error.textContent = describeError(result);
    }
    loadFaults();
  }

  function showCapacity(cap) {
    $("cap-state").textContent =
      cap.max_in_flight === null
        ? "No cap: every request is served."
        : `Cap ${cap.max_in_flight} in flight; over it: ${cap.overload}` +
          (cap.overload === "queue" ? ` (wait ${cap.queue_timeout_s === null ? "forever" : `${cap.queue_timeout_s} s`})` : "") +
          `, Retry-After ${cap.retry_after_s} s.`;
    $("cap-state").dataset.max = String(cap.max_in_flight);
  }

  async function putCapacity(body) {
    const result = await api("PUT", "/_mock/capacity", body);
    const error = $("cap-error");
    error.hidden = result.ok;
    error.textContent = result.ok ? "" : describeError(result);
    if (result.ok) showCapacity(result.data);
  }

  function setCapacity(event) {
    event.preventDefault();
    const body = { overload: $("cap-overload").value };
    const fields = [["max_in_flight", "cap-max"], ["queue_timeout_s", "cap-queue-timeout"], ["retry_after_s", "cap-retry-after"]];
    for (const [name, id] of fields) {
      const text = $(id).value.trim();
      if (text !== "") body[name] = Number(text);
    }
    putCapacity(body);
  }

  // -- sessions -----------------------------------------------------------------------------------

  let sessionsTimer = null;
  let selectedSession = null;

  function scheduleSessions() {
    if (currentTab !== "sessions" || sessionsTimer !== null) return;
    sessionsTimer = setTimeout(() => {
      sessionsTimer = null;
      loadSessions();
    }, 500);
  }

  function fraction(count, total) {
    return count === undefined || count === null ? "" : `${count}/${total}`;
  }

  async function loadSessions() {
    const current = ticket("sessions");
    const result = await api("GET", "/_mock/sessions");
    if (!current() || !result.ok) return;
    const data = result.data;
    const all = ["live", "finished", "leaked"].flatMap((state) => data[state] || []);
    all.sort((a, b) => b.created_at - a.created_at);
    $("sessions-summary").textContent =
      `${data.counts.live || 0} live, ${data.counts.finished || 0} finished, ${data.counts.leaked || 0} leaked; ` +
      `reward mode ${data.reward_mode}, backend ${data.backend}, ${data.instances} instances`;
    const rows = all.map((s) => {
      const r = s.result || {};
      const row = el(
        "tr",
        { dataset: { sid: s.sid, state: s.state }, onclick: () => openSession(s.sid) },
        el("td", {}, s.sid),
        el("td", {}, s.instance_id),
        el("td", {}, s.reason && s.state !== "live" ? `${s.state} (${s.reason})` : s.state),
        el("td", {}, s.actions),
        el("td", {}, r.reward === undefined ? "" : r.reward),
        el("td", {}, fraction(r.f2p_count, r.f2p_total)),
        el("td", {}, fraction(r.p2p_count, r.p2p_total)),
      );
      if (s.sid === selectedSession) row.classList.add("selected");
      return row;
    });
    fill($("sessions-table").tBodies[0], rows);
    if (selectedSession !== null && !$("session-detail").hidden) openSession(selectedSession, true);
  }

  function renderDiff(patch) {
    const pre = $("session-diff");
    if (!patch) {
      pre.textContent = "(no change)";
      return;
    }
    pre.replaceChildren(
      ...patch.split("\n").map((line) => {
        let cls = "";
        if (line.startsWith("+++") || line.startsWith("---") || line.startsWith("diff ")) cls = "file";
        else if (line.startsWith("+")) cls = "add";
        else if (line.startsWith("-")) cls = "del";
        else if (line.startsWith("@@")) cls = "hunk";
        return el("span", { class: cls }, `${line}\n`);
      }),
    );
  }

  async function openSession(sid, quiet) {
    selectedSession = sid;
    for (const row of $("sessions-table").tBodies[0].rows) row.classList.toggle("selected", row.dataset.sid === sid);
    const current = ticket("session");
    const [described, patch, actions] = await Promise.all([
      api("GET", `/_mock/sessions/${sid}`),
      api("GET", `/_mock/sessions/${sid}/patch`),
      api("GET", "/_mock/journal?path=/process_action"),
    ]);
    if (!current()) return;
    const panel = $("session-detail");
    panel.hidden = false;
    panel.dataset.sid = sid;
    if (!described.ok) {
      $("session-title").textContent = `session ${sid}`;
      $("session-meta").replaceChildren(el("dt", {}, "error"), el("dd", {}, describeError(described)));
      return;
    }
    const s = described.data;
    $("session-title").textContent = `session ${s.sid}`;
    const meta = [
      ["instance", s.instance_id],
      ["state", s.reason ? `${s.state} (${s.reason})` : s.state],
      ["actions", s.actions],
      ["agent finished", s.agent_finished ? "yes" : "no"],
      ["workspace", s.workspace],
    ];
    $("session-meta").replaceChildren(...meta.flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, v)]));
    renderReward(s.result);
    renderDiff(patch.ok ? patch.data.patch : s.patch);
    const observations = (actions.ok ? actions.data.entries : []).filter(
      (e) => e.body && typeof e.body === "object" && (String(e.body.sid) === sid || Number(e.body.sid) === Number(sid)),
    );
    $("session-observations").replaceChildren(
      ...(observations.length
        ? observations.map((e) =>
            el(
              "div",
              { class: "observation" },
              el("pre", { class: "code action" }, e.body.content),
              el("pre", { class: "code" }, e.response && e.response.content !== undefined ? e.response.content : pretty(e.response)),
            ),
          )
        : [el("p", { class: "muted" }, quiet ? "" : "No actions in the journal for this session.")]),
    );
  }

  function renderReward(result) {
    const box = $("session-reward");
    if (!result) {
      box.replaceChildren(el("p", { class: "muted" }, "Not scored yet (POST /compute_reward or /postprocess scores it)."));
      return;
    }
    const summary = el(
      "dl",
      { class: "meta", id: "reward-summary" },
      el("dt", {}, "reward"), el("dd", {}, result.reward),
      el("dt", {}, "resolved"), el("dd", {}, result.resolved ? "yes" : "no"),
      el("dt", {}, "FAIL_TO_PASS"), el("dd", { id: "reward-f2p" }, `${result.f2p_count}/${result.f2p_total} pass`),
      el("dt", {}, "PASS_TO_PASS"), el("dd", { id: "reward-p2p" }, `${result.p2p_count}/${result.p2p_total} pass`),
      el("dt", {}, "patch"), el("dd", {}, result.patch_is_None ? "none" : result.patch_successfully_applied ? "applied" : "did not apply"),
    );
    const tests = Object.entries(result.tests || {});
    const table = tests.length
      ? el(
          "details",
          {},
          el("summary", {}, `each test (${tests.length})`),
          el("table", { class: "grid" }, el("tbody", {}, ...tests.map(([id, status]) => el("tr", {}, el("td", {}, id), el("td", {}, status))))),
        )
      : null;
    box.replaceChildren(summary, table || "");
  }

  // -- playground ---------------------------------------------------------------------------------

  let languagesLoaded = false;

  async function loadLanguages() {
    if (languagesLoaded) return;
    const result = await api("GET", "/_mock/languages");
    if (!result.ok) return;
    languagesLoaded = true;
    const select = $("run-language");
    const options = result.data.languages.map((lang) =>
      el(
        "option",
        { value: lang.name, class: lang.available ? "" : "toolchain-missing", dataset: { available: String(lang.available) } },
        lang.available ? `${lang.name} ✓` : `${lang.name} (no ${lang.toolchain || "toolchain"} here)`,
      ),
    );
    select.replaceChildren(...options);
    select.value = "python";
    const available = result.data.languages.filter((l) => l.available).length;
    $("run-hint").textContent = `✓: a toolchain on this host (${available} of ${result.data.languages.length}); the others answer as SandboxFusion does without one`;
  }

  function addFileRow() {
    const remove = el("button", { type: "button" }, "Remove");
    const row = el(
      "div",
      { class: "file-row" },
      el("input", { class: "file-name", placeholder: "file name (e.g. data.txt)" }),
      el("textarea", { class: "file-content", rows: 3, spellcheck: false, placeholder: "content (text)" }),
      remove,
    );
    remove.addEventListener("click", () => row.remove());
    $("run-files").append(row);
  }

  function base64(text) {
    const bytes = new TextEncoder().encode(text);
    let binary = "";
    for (let i = 0; i < bytes.length; i += 0x8000) binary += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
    return btoa(binary);
  }

  async function runCode(event) {
    event.preventDefault();
    const body = { code: $("run-code").value, language: $("run-language").value };
    if ($("run-stdin").value) body.stdin = $("run-stdin").value;
    for (const [name, id] of [["run_timeout", "run-timeout"], ["compile_timeout", "compile-timeout"]]) {
      if ($(id).value.trim()) body[name] = Number($(id).value);
    }
    const files = {};
    for (const row of $("run-files").querySelectorAll(".file-row")) {
      const name = row.querySelector(".file-name").value.trim();
      if (name) files[name] = base64(row.querySelector(".file-content").value);
    }
    if (Object.keys(files).length) body.files = files;
    const button = $("run-button");
    button.disabled = true;
    let result;
    try {
      result = await api("POST", "/run_code", body);
    } finally {
      button.disabled = false;
    }
    showRunResult(result);
  }

  function showRunResult(result) {
    const data = result.data || {};
    const run = data.run_result || {};
    $("run-result").hidden = false;
    $("result-http").textContent = result.status;
    $("result-status").textContent = data.status || "(not a run answer)";
    $("result-message").textContent = data.message || (result.ok ? "" : describeError(result));
    $("result-time").textContent = run.execution_time === undefined || run.execution_time === null ? "–" : run.execution_time.toFixed(3);
    $("result-rc").textContent = run.return_code === undefined || run.return_code === null ? "–" : run.return_code;
    $("result-stdout").textContent = run.stdout || "";
    $("result-stderr").textContent = run.stderr || "";
    $("result-compile-wrap").hidden = !data.compile_result;
    $("result-compile").textContent = data.compile_result ? pretty(data.compile_result) : "";
    $("result-json").textContent = result.data === null ? result.text : JSON.stringify(result.data, null, 2);
  }

  // -- start --------------------------------------------------------------------------------------

  function start() {
    for (const id of ["filter-path", "filter-language", "filter-status", "filter-faulted", "filter-diverged", "filter-text"]) {
      $(id).addEventListener("input", () => {
        journal.dirty = true;
        renderJournal();
      });
    }
    $("copy-curl").addEventListener("click", () => copySnippet(asCurl));
    $("copy-python").addEventListener("click", () => copySnippet(asPython));
    $("fault-form").addEventListener("submit", addFault);
    $("faults-clear").addEventListener("click", async () => {
      await api("DELETE", "/_mock/faults");
      loadFaults();
    });
    $("cap-form").addEventListener("submit", setCapacity);
    $("cap-clear").addEventListener("click", () => putCapacity({ max_in_flight: null }));
    $("sessions-refresh").addEventListener("click", loadSessions);
    $("run-form").addEventListener("submit", runCode);
    $("run-add-file").addEventListener("click", addFileRow);
    window.addEventListener("hashchange", () => showTab(location.hash.slice(1)));
    showTab(location.hash.slice(1) || "live");
    connect();
  }

  start();
})();
