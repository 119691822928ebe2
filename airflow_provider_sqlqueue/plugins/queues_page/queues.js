// The Queues page. Every value from the API is put in the page as text (textContent), never as
// markup, so nothing a message or a sender wrote can run here. Requests carry Airflow's session
// cookie; the API checks the caller's permissions on each connection. A user who may watch queues
// but not act (or not read messages) sees the actions disabled, with the permission they lack.
"use strict";

const API = "api/connections";
const PAGE_SIZE = 50;
const state = { connection: null, offset: 0, total: 0, errorQueue: null, group: null, before: null, claimsOf: null };
// What the caller may do on each connection (from the API's list): connection_id -> its entry.
const access = new Map();
const $ = (selector) => document.querySelector(selector);

// -- theme: follow Airflow's (its UI stores it as "theme": light, dark or system) ----------------

function airflowTheme() {
  try {
    const root = window.parent !== window ? window.parent.document.documentElement : null;
    if (root) {
      if (root.classList.contains("dark") || root.dataset.theme === "dark") return "dark";
      if (root.classList.contains("light") || root.dataset.theme === "light") return "light";
    }
  } catch (e) { /* another origin: fall through */ }
  const stored = window.localStorage.getItem("theme");
  if (stored === "dark" || stored === "light") return stored;
  return window.matchMedia("(prefers-color-scheme: dark)").matches ? "dark" : "light";
}

function applyTheme() { document.documentElement.dataset.theme = airflowTheme(); }

function watchTheme() {
  applyTheme();
  window.addEventListener("storage", applyTheme);
  window.matchMedia("(prefers-color-scheme: dark)").addEventListener("change", applyTheme);
  try {
    if (window.parent !== window) {
      new MutationObserver(applyTheme).observe(window.parent.document.documentElement,
        { attributes: true, attributeFilter: ["class", "data-theme", "style"] });
    }
  } catch (e) { /* another origin */ }
}

// -- talking to the API ---------------------------------------------------------------------------

class ApiError extends Error {
  constructor(status, message) { super(message); this.status = status; }
}

async function call(path, body) {
  const options = { credentials: "same-origin", headers: { Accept: "application/json" } };
  if (body !== undefined) {
    options.method = "POST";
    options.headers["Content-Type"] = "application/json";
    options.body = JSON.stringify(body);
  }
  const answer = await fetch(path, options);
  if (!answer.ok) {
    let detail = answer.statusText;
    try { detail = (await answer.json()).detail || detail; } catch (e) { /* not JSON */ }
    if (answer.status === 401) detail = "Sign in to Airflow to see queues.";
    throw new ApiError(answer.status, typeof detail === "string" ? detail : JSON.stringify(detail));
  }
  return answer.json();
}

function connectionPath(rest) { return `${API}/${encodeURIComponent(state.connection)}/${rest}`; }

function query(params) {
  const search = new URLSearchParams();
  for (const [key, value] of Object.entries(params)) if (value !== null && value !== undefined) search.set(key, value);
  return search.toString();
}

function say(text, isError) {
  const status = $("#status");
  status.textContent = text;
  status.classList.toggle("error", Boolean(isError));
}

// -- building rows as text --------------------------------------------------------------------

function cell(row, text, className) {
  const td = document.createElement("td");
  td.textContent = text === null || text === undefined ? "–" : String(text);
  if (className) td.className = className;
  row.appendChild(td);
  return td;
}

// What the caller may do on the connection shown: { may_act, may_read_messages, actions_refusal, messages_refusal }.
function allowed() {
  return access.get(state.connection) || { may_act: false, may_read_messages: false, actions_refusal: null, messages_refusal: null };
}

// An action's button: disabled, saying why, for a caller who may not act on the connection.
function button(label, onClick, title, refusal) {
  const b = document.createElement("button");
  b.type = "button";
  b.textContent = label;
  if (title) b.title = title;
  if (refusal) {
    b.disabled = true;
    b.classList.add("refused");
    b.title = `Not allowed: ${refusal}`;
    return b;
  }
  b.addEventListener("click", async (event) => {
    event.stopPropagation();
    b.disabled = true;
    try { await onClick(); } catch (error) { say(error.message, true); } finally { b.disabled = false; }
  });
  return b;
}

function age(seconds) {
  if (seconds === null || seconds === undefined) return "–";
  if (seconds < 90) return `${Math.round(seconds)} s`;
  if (seconds < 5400) return `${Math.round(seconds / 60)} min`;
  if (seconds < 172800) return `${(seconds / 3600).toFixed(1)} h`;
  return `${(seconds / 86400).toFixed(1)} d`;
}

// A time the API gives (ISO 8601 in UTC) in the viewer's own zone; a header in no time's form as its sender wrote it.
function when(iso) {
  if (!iso) return "–";
  const moment = new Date(iso);
  return Number.isNaN(moment.getTime()) ? iso : moment.toLocaleString(undefined, { dateStyle: "medium", timeStyle: "medium" });
}

const number = (value) => (value === null || value === undefined ? "–" : value.toLocaleString("en-US"));

// -- queues -----------------------------------------------------------------------------------

async function loadConnections() {
  const connections = await call(API);
  const select = $("#connection");
  select.replaceChildren();
  access.clear();
  for (const c of connections) {
    access.set(c.connection_id, c);
    const option = document.createElement("option");
    option.value = c.connection_id;
    option.textContent = `${c.connection_id} (${c.conn_type})`;
    select.appendChild(option);
  }
  if (!connections.length) {
    say("No connection holds queues (sqlqueue, postgres, mssql or odbc connections in Airflow, "
      + "or connections named in [sqlqueue] connections).", false);
    return false;
  }
  const wanted = new URLSearchParams(window.location.search).get("connection");
  state.connection = connections.some((c) => c.connection_id === wanted) ? wanted : connections[0].connection_id;
  select.value = state.connection;
  showAccess();
  return true;
}

// A read-only notice naming the permissions the caller lacks on the connection shown.
function showAccess() {
  const a = allowed();
  const notice = $("#access");
  const lines = [a.actions_refusal, a.messages_refusal].filter(Boolean);
  notice.hidden = lines.length === 0;
  $("#access-text").textContent = lines.map((line) => line.charAt(0).toUpperCase() + line.slice(1) + ".").join(" ");
  document.body.classList.toggle("read-only", !a.may_act);
  $("#retry-selected").title = a.may_act ? "" : `Not allowed: ${a.actions_refusal}`;
}

async function loadQueues() {
  const page = await call(connectionPath(`queues?${query({ offset: state.offset, limit: PAGE_SIZE, search: $("#search").value })}`));
  state.total = page.total;
  showHealth(page);
  const body = $("#queues tbody");
  body.replaceChildren();
  for (const q of page.queues) {
    const row = document.createElement("tr");
    row.dataset.queue = q.address;
    if (q.address === state.claimsOf) row.classList.add("selected");
    if (q.problems.length) {
      row.classList.add("problem");
      row.title = q.problems.join("\n");
    }
    const name = cell(row, q.address, "address");
    if (q.kind !== "queue") {
      const badge = document.createElement("span");
      badge.className = `badge ${q.kind}`;
      badge.textContent = q.kind;
      name.appendChild(badge);
    }
    const waiting = cell(row, number(q.waiting), "num waiting");
    waiting.title = "Estimate; click for the exact count";
    waiting.addEventListener("click", async (event) => {
      event.stopPropagation();
      const exact = await call(connectionPath(`depth?${query({ queue: q.address })}`));
      waiting.textContent = `${number(exact.count)} exactly`;
    });
    cell(row, age(q.oldest_age_seconds), "num oldest");
    cell(row, number(q.in_flight), "num in-flight");
    cell(row, number(q.lapsed), `num lapsed${q.lapsed ? " warn" : ""}`);
    cell(row, q.expired_capped ? `${number(q.expired)}+` : number(q.expired), `num expired${q.expired ? " warn" : ""}`);
    const dueCount = `${number(q.due_delayed)}${q.due_delayed_capped ? "+" : ""}`;
    const due = q.due_delayed ? `${dueCount} (${age(q.overdue_seconds)})` : number(q.due_delayed);
    cell(row, due, `num due-delayed${q.due_delayed ? " warn" : ""}`);
    const dead = cell(row, number(q.dead_rows), "num dead-rows");
    dead.title = q.last_vacuum ? `Last vacuumed ${when(q.last_vacuum)}` : "Never vacuumed since the statistics were reset";
    const actions = cell(row, "");
    if (q.lapsed) {
      actions.appendChild(button("Give back", async () => {
        const done = await call(connectionPath("release-lapsed"), { queue: q.address });
        say(`${number(done.count)} lapsed claim(s) of ${q.address} given back to the queue.`);
        await refresh();
      }, "Move lapsed claims back into the queue, where every receiver finds them", allowed().actions_refusal));
    }
    if (q.due_delayed) {
      actions.appendChild(button("Move due", async () => {
        const done = await call(connectionPath("move-due"), { queue: q.address });
        say(`${number(done.count)} due delayed message(s) of ${q.address} moved into the queue.`);
        await refresh();
      }, "Move the due delayed messages into the queue, as a mover would (sqlqueue move-due)", allowed().actions_refusal));
    }
    if (q.expired) {
      actions.appendChild(button("Purge expired", async () => {
        const done = await call(connectionPath("purge-expired"), { queue: q.address });
        say(`${number(done.count)} expired message(s) purged from ${q.address}.`);
        await refresh();
      }, null, allowed().actions_refusal));
    }
    if (q.in_flight !== null) row.addEventListener("click", () => showClaims(q.address));
    body.appendChild(row);
  }
  $("#queue-count").textContent = `(${number(page.total)})`;
  const last = Math.min(state.offset + PAGE_SIZE, page.total);
  $("#page-info").textContent = page.total ? `${state.offset + 1}–${last} of ${number(page.total)}` : "no queues";
  $("#previous").disabled = state.offset === 0;
  $("#next").disabled = last >= page.total;
  const select = $("#error-queue");
  const known = [...select.options].map((o) => o.value).join("\n");
  if (known !== page.error_queues.join("\n")) {
    select.replaceChildren();
    for (const address of page.error_queues) {
      const option = document.createElement("option");
      option.value = address;
      option.textContent = address;
      select.appendChild(option);
    }
    if (!page.error_queues.includes(state.errorQueue)) state.errorQueue = page.error_queues[0] || null;
    select.value = state.errorQueue || "";
  }
}

// What sqlqueue health finds: the database's problems, then the page's queues', problems first.
function showHealth(page) {
  const list = $("#problems");
  list.replaceChildren();
  const found = [...page.problems.map((text) => ["database", text])];
  for (const q of page.queues) for (const text of q.problems) found.push([q.address, text]);
  for (const [where, text] of found) {
    const item = document.createElement("li");
    item.textContent = `${where}: ${text}`;
    list.appendChild(item);
  }
  $("#problems-panel").hidden = found.length === 0;
  const h = page.horizon;
  let text = "";
  if (h && h.holders.length) {
    const o = h.holders[0];
    text = `xmin horizon held by ${o.holder} (${o.application || "no application name"}, ${o.state})`
      + (o.held_seconds === null ? "" : ` for ${age(o.held_seconds)}`) + `, ${number(o.xid_age)} transactions back`;
    if (h.holders.length > 1) {
      text += "; also by " + h.holders.slice(1).map((x) => `${x.holder} (${x.application || "no application name"})`).join(", ");
    }
  } else if (h) {
    text = "xmin horizon: held by no other session";
  }
  if (h && !h.complete) text += " (the state and start of other roles' sessions are hidden without pg_read_all_stats)";
  $("#horizon").textContent = text;
}

async function showClaims(address) {
  state.claimsOf = address;
  const claims = await call(connectionPath(`claims?${query({ queue: address })}`));
  $("#claims-panel").hidden = false;
  $("#claims-queue").textContent = address;
  const body = $("#claims tbody");
  body.replaceChildren();
  for (const c of claims) {
    const row = document.createElement("tr");
    cell(row, c.id, "address");
    cell(row, c.holder === null ? "(reserved, not taken)" : c.holder);
    cell(row, c.deliveries, "num");
    const lease = c.lease_left_seconds;
    cell(row, lease < 0 ? `lapsed ${age(-lease)} ago` : `${age(lease)} left`, `num${lease < 0 ? " warn" : ""}`);
    cell(row, c.last_error);
    body.appendChild(row);
  }
  if (!claims.length) cell(body.appendChild(document.createElement("tr")), "No claims.");
  for (const row of document.querySelectorAll("#queues tbody tr")) row.classList.toggle("selected", row.dataset.queue === address);
}

// -- the error queue ----------------------------------------------------------------------------

async function loadErrors() {
  if (!state.errorQueue) {
    $("#groups tbody").replaceChildren();
    $("#failures").replaceChildren();
    $("#error-total").textContent = "no error queue found";
    return;
  }
  const summary = await call(connectionPath(`errors?${query({ error_queue: state.errorQueue })}`));
  $("#error-total").textContent = `about ${number(summary.waiting)} message(s)`;
  $("#error-window").textContent = `(newest ${number(summary.window)})`;
  const body = $("#groups tbody");
  body.replaceChildren();
  for (const g of summary.groups) {
    const row = document.createElement("tr");
    row.dataset.source = g.source;
    cell(row, number(g.count), "num");
    cell(row, g.source, "address");
    cell(row, g.exception_type);
    const newest = cell(row, when(g.newest_failure));
    if (g.newest_message) newest.title = g.newest_message;
    const actions = cell(row, "");
    actions.appendChild(button("Show", async () => { state.group = [g.source, g.exception_type]; state.before = null; await loadFailures(); },
      "Show these failed messages", allowed().messages_refusal));
    actions.appendChild(button("Retry all of this queue", () => retrySource(g.source),
      "Send every failed message of this source queue back to it", allowed().actions_refusal));
    body.appendChild(row);
  }
  await loadFailures();
}

async function loadFailures(append) {
  if (!allowed().may_read_messages) {  // figures only: the messages themselves are not asked for
    const hidden = document.createElement("li");
    hidden.className = "muted";
    hidden.textContent = `Messages are not shown: ${allowed().messages_refusal}.`;
    $("#failures").replaceChildren(hidden);
    $("#older").hidden = true;
    $("#all-failures").hidden = true;
    updateSelection();
    return;
  }
  const params = { error_queue: state.errorQueue, before: append ? state.before : null, limit: 25 };
  if (state.group) [params.source, params.exception_type] = state.group;
  const page = await call(connectionPath(`errors/messages?${query(params)}`));
  state.before = page.next_before;
  $("#older").hidden = page.next_before === null;
  $("#all-failures").hidden = state.group === null;
  $("#failure-filter").textContent = state.group ? `(${state.group[1]} in ${state.group[0]})` : "";
  const list = $("#failures");
  // A refresh that was already under way when a message was ticked must not untick it.
  const kept = new Set(selectedSeqs());
  if (!append) list.replaceChildren();
  for (const f of page.failures) {
    const item = document.createElement("li");
    item.dataset.seq = f.seq;
    item.dataset.id = f.id;
    const title = document.createElement("div");
    title.className = "title";
    const pick = document.createElement("input");
    pick.type = "checkbox";
    pick.className = "pick";
    pick.dataset.seq = f.seq;
    pick.checked = kept.has(f.seq);
    if (!allowed().may_act) {
      pick.disabled = true;
      pick.title = `Not allowed: ${allowed().actions_refusal}`;
    }
    pick.setAttribute("aria-label", `select message ${f.id}`);
    pick.addEventListener("change", updateSelection);
    title.appendChild(pick);
    title.appendChild(button("Journey", () => follow(f.id), "Where this message went before it failed"));
    for (const [text, className] of [[f.time_of_failure ? when(f.time_of_failure) : "", "muted"], [f.exception_type, "bad"], [f.source, "address"], [f.id, "muted"]]) {
      const span = document.createElement("span");
      span.className = className;
      span.textContent = text;
      title.appendChild(span);
    }
    item.appendChild(title);
    if (f.exception_message) {
      const message = document.createElement("div");
      message.textContent = f.exception_message;
      item.appendChild(message);
    }
    const details = document.createElement("details");
    const summary = document.createElement("summary");
    const size = f.body_size === null ? "no body" : `${number(f.body_size)} byte body${f.body_truncated ? ", first part shown" : ""}`;
    summary.textContent = `Headers and ${size}${f.body_encoding === "hex" ? " (hex)" : ""}`;
    details.appendChild(summary);
    const headers = document.createElement("pre");
    headers.textContent = f.headers === null ? "(unreadable headers)" : JSON.stringify(f.headers, null, 2);
    details.appendChild(headers);
    const preview = document.createElement("pre");
    preview.className = "body";
    preview.textContent = f.body_preview + (f.body_truncated ? " …" : "");
    details.appendChild(preview);
    item.appendChild(details);
    list.appendChild(item);
  }
  if (!list.children.length) {
    const empty = document.createElement("li");
    empty.textContent = "No failed messages.";
    list.appendChild(empty);
  }
  updateSelection();
}

function selectedSeqs() {
  return [...document.querySelectorAll("#failures input.pick:checked")].map((box) => Number(box.dataset.seq));
}

function updateSelection() {
  const count = selectedSeqs().length;
  $("#retry-selected").disabled = count === 0 || !allowed().may_act;
  $("#retry-selected").textContent = count ? `Retry selected (${count})` : "Retry selected";
}

async function retrySelected() {
  const seqs = selectedSeqs();
  const done = await call(connectionPath("errors/retry"), { error_queue: state.errorQueue, seqs });
  say(`${number(done.retried)} of ${seqs.length} selected message(s) sent back to the queue they failed in.`);
  await refresh();
}

async function retrySource(source) {
  // Bounded passes: each request looks at a few thousand rows, the page continues until done.
  let after = 0;
  let retried = 0;
  for (;;) {
    const page = await call(connectionPath("errors/retry"), { error_queue: state.errorQueue, source, after });
    retried += page.retried;
    say(`Retrying the failures of ${source}: ${number(retried)} sent back so far…`);
    if (page.done) break;
    after = page.after;
  }
  say(`${number(retried)} failed message(s) sent back to ${source}.`);
  await refresh();
}

// -- a message's journey -------------------------------------------------------------------------

const STATIONS = {
  processed: "processed",
  failed: "failed",
  claimed: "in flight",
  waiting: "waiting",
  unreadable: "waiting, headers unreadable",
};

function seconds(value) {
  return value === null || value === undefined ? "–" : `${value.toLocaleString("en-US", { maximumFractionDigits: 3 })} s`;
}

// The rows a message (or every message of a trace) left, oldest first; times in the viewer's zone.
async function follow(id) {
  $("#journey-id").value = id;
  if (!allowed().may_read_messages) {
    say(`A journey is read from messages' headers: ${allowed().messages_refusal}.`, true);
    return;
  }
  const found = await call(connectionPath(`journey?${query({ id })}`));
  const body = $("#journey tbody");
  body.replaceChildren();
  for (const s of found.sightings) {
    const row = document.createElement("tr");
    row.dataset.id = s.message_id;
    row.dataset.station = s.station;
    cell(row, when(s.sent));
    cell(row, s.message_id, "address");
    cell(row, s.stage, "address");
    cell(row, STATIONS[s.station] || s.station, s.station === "failed" || s.station === "unreadable" ? "bad" : "");
    cell(row, seconds(s.waited_seconds), "num");
    cell(row, seconds(s.processing_seconds), "num");
    cell(row, s.table, "address");
    cell(row, s.trace_id ? `${s.trace_id} / ${s.parent_span_id}` : "–", "address");
    cell(row, s.exception || (s.holder ? `held by ${s.holder}` : ""));
    body.appendChild(row);
  }
  $("#journey").hidden = found.sightings.length === 0;
  const what = found.kind === "message" ? "message" : "trace";
  $("#journey-summary").textContent = found.sightings.length
    ? `${what} ${found.key}: ${found.sightings.length} row(s) in ${found.searched} table(s) searched`
    : `No row of ${what} ${found.key} in the ${found.searched} table(s) searched.`;
  const notes = $("#journey-notes");
  notes.replaceChildren();
  const note = (text, onClick) => {
    const item = document.createElement("li");
    item.textContent = text;
    if (onClick) {
      item.appendChild(document.createTextNode(" "));
      item.appendChild(button("Follow the trace", onClick, "Every message of this trace"));
    }
    notes.appendChild(item);
  };
  if (found.kind === "message") {
    for (const trace of found.trace_ids) note(`Its trace: ${trace}.`, () => follow(trace));
  }
  if (found.more) note("More rows matched than are shown: the first ones are shown.");
  if (found.partial.length) note(`Only the newest ${number(found.scan)} rows were searched of: ${found.partial.join(", ")}.`);
  if (found.unreadable) note(`${number(found.unreadable)} queue table(s) this connection may not read were not searched.`);
  if (found.locked.length) note(`Locked by another session, not searched: ${found.locked.join(", ")}.`);
}

// -- wiring -------------------------------------------------------------------------------------

async function refresh() {
  try {
    await loadQueues();
    if (state.claimsOf) await showClaims(state.claimsOf);
    await loadErrors();
    document.body.dataset.loaded = String(Date.now());
  } catch (error) {
    say(error.message, true);
  }
}

async function start() {
  watchTheme();
  $("#connection").addEventListener("change", () => {
    state.connection = $("#connection").value;
    showAccess();
    Object.assign(state, { offset: 0, errorQueue: null, group: null, before: null, claimsOf: null });
    $("#claims-panel").hidden = true;
    refresh();
  });
  $("#search").addEventListener("input", () => { state.offset = 0; refresh(); });
  $("#refresh").addEventListener("click", refresh);
  $("#previous").addEventListener("click", () => { state.offset = Math.max(0, state.offset - PAGE_SIZE); refresh(); });
  $("#next").addEventListener("click", () => { state.offset += PAGE_SIZE; refresh(); });
  $("#error-queue").addEventListener("change", () => { state.errorQueue = $("#error-queue").value; state.group = null; refresh(); });
  $("#retry-selected").addEventListener("click", () => retrySelected().catch((error) => say(error.message, true)));
  $("#all-failures").addEventListener("click", () => { state.group = null; loadFailures().catch((e) => say(e.message, true)); });
  $("#older").addEventListener("click", () => loadFailures(true).catch((error) => say(error.message, true)));
  $("#journey-form").addEventListener("submit", (event) => {
    event.preventDefault();
    follow($("#journey-id").value.trim()).catch((error) => say(error.message, true));
  });
  window.setInterval(() => {
    if (!$("#auto").checked || !state.connection) return;
    // Keep a selection of failures: while messages are ticked, only the figures are refreshed.
    (selectedSeqs().length ? loadQueues() : refresh()).catch((error) => say(error.message, true));
  }, 10000);
  try {
    if (await loadConnections()) {
      await refresh();
      const wanted = new URLSearchParams(window.location.search).get("journey");
      if (wanted) await follow(wanted);
    }
  } catch (error) {
    say(error.message, true);
  }
}

document.addEventListener("DOMContentLoaded", start);
