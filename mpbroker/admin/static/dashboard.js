// The mpbroker dashboard: polls the admin API's JSON (GET /status?limit=0 for the workers,
// GET /flow?sort=...&filter=...&offset=...&limit=... for one page of destinations) every few
// seconds and draws it. Plain ES2020, no libraries. Every piece of data goes into the page
// as text (textContent), never as HTML: destination names are the clients' text.
"use strict";

const REFRESH_MS = 3000;
const HISTORY_MS = 5 * 60 * 1000;
// Sort keys the server knows, and which way each sorts first (numbers: largest first).
const DESCENDING_FIRST = new Set(["backlog", "waiting", "unacknowledged", "consumers", "stopped"]);

const view = {
  sort: "backlog",
  order: "desc",
  filter: "",
  offset: 0,
  limit: 25,
};

const poll = {
  timer: null,
  busy: false,
  again: false,
  // Broker-wide totals of the previous /status: {atMs, workers: Map(title -> {...})}.
  previous: null,
  // Points of the rate chart: {atMs, received, delivered} (per second).
  history: [],
  // Per shown destination, its totals at the previous poll (for in/s and out/s).
  rows: new Map(),
  rowsAtMs: 0,
};

// -- small helpers --------------------------------------------------------------------------

function $(id) {
  return document.getElementById(id);
}

// An element with text (never HTML) and a class.
function cell(tag, text, className) {
  const element = document.createElement(tag);
  element.textContent = text === null || text === undefined || text === "" ? "–" : String(text);
  if (className) element.className = className;
  return element;
}

function row(cells) {
  const tr = document.createElement("tr");
  for (const c of cells) tr.appendChild(c);
  return tr;
}

function fillBody(table, rows, emptyText, columns) {
  const body = table.tBodies[0];
  if (rows.length === 0) {
    const td = cell("td", emptyText, "empty");
    td.colSpan = columns;
    body.replaceChildren(row([td]));
  } else {
    body.replaceChildren(...rows);
  }
}

const integer = new Intl.NumberFormat("en-US", { maximumFractionDigits: 0 });
const decimal = new Intl.NumberFormat("en-US", { maximumFractionDigits: 1 });
const fine = new Intl.NumberFormat("en-US", { maximumFractionDigits: 2 });

function count(value) {
  return typeof value === "number" ? integer.format(value) : "–";
}

function mib(bytes) {
  return typeof bytes === "number" ? `${decimal.format(bytes / 2 ** 20)} MiB` : "–";
}

function seconds(ms) {
  if (typeof ms !== "number") return "–";
  return ms < 1000 ? `${ms} ms` : `${decimal.format(ms / 1000)} s`;
}

function rate(value) {
  if (typeof value !== "number") return "–";
  return value >= 100 ? integer.format(value) : decimal.format(value);
}

// A failed request: its text is shown in the banner, not thrown to the console.
class PollError extends Error {}

async function getJson(path) {
  let reply;
  try {
    // By the origin alone: a page opened as http://user:pass@host/ keeps the credentials
    // in its base URL, and a request made from such a URL is refused (Chromium: "Request
    // cannot be constructed from a URL that includes credentials"). The browser sends the
    // credentials it logged in with from its own cache for the origin.
    reply = await fetch(new URL(path, location.origin), {
      cache: "no-store",
      credentials: "same-origin",
      headers: { Accept: "application/json" },
    });
  } catch (error) {
    throw new PollError(`cannot reach the admin API (${error.message})`);
  }
  let body = null;
  try {
    body = await reply.json();
  } catch (error) {
    body = null;
  }
  if (!reply.ok) {
    const why = body && typeof body.error === "string" ? body.error : reply.statusText;
    let hint = "";
    if (reply.status === 401) hint = " (reload the page to give a user in group admin)";
    throw new PollError(`${path}: HTTP ${reply.status}: ${why}${hint}`);
  }
  if (body === null) throw new PollError(`${path}: the answer is not JSON`);
  return body;
}

function flowPath() {
  const query = new URLSearchParams({
    sort: view.sort,
    order: view.order,
    offset: String(view.offset),
    limit: String(view.limit),
  });
  if (view.filter) query.set("filter", view.filter);
  return `/flow?${query}`;
}

// -- rates -----------------------------------------------------------------------------------

// How much a total grew since `before`: a total that went down (its worker restarted and
// counts from 0 again) grew by what it holds now, never by a negative amount.
function growth(now, before) {
  if (typeof now !== "number") return null;
  if (typeof before !== "number") return null;
  return now >= before ? now - before : now;
}

function pipelineTotals(status) {
  const workers = new Map();
  for (const worker of status.workers) {
    const stats = worker.stats;
    if (!stats || (stats.role !== "p2p" && stats.role !== "pubsub")) continue;
    workers.set(worker.title, {
      incarnation: worker.incarnation,
      received: stats.received,
      delivered: stats.delivered,
    });
  }
  return { atMs: status.at_ms, workers };
}

function updateRates(status) {
  const now = pipelineTotals(status);
  const before = poll.previous;
  poll.previous = now;
  if (before === null || now.atMs <= before.atMs) return;
  const elapsed = (now.atMs - before.atMs) / 1000;
  let received = 0;
  let delivered = 0;
  for (const [title, totals] of now.workers) {
    const old = before.workers.get(title);
    if (!old) continue;
    const restarted = old.incarnation !== totals.incarnation;
    received += restarted ? totals.received : growth(totals.received, old.received) ?? 0;
    delivered += restarted ? totals.delivered : growth(totals.delivered, old.delivered) ?? 0;
  }
  poll.history.push({ atMs: now.atMs, received: received / elapsed, delivered: delivered / elapsed });
  while (poll.history.length && poll.history[0].atMs < now.atMs - HISTORY_MS) poll.history.shift();
}

function destinationKey(destination) {
  return `${destination.worker}\u0000${destination.kind}\u0000${destination.name}`;
}

// In/s and out/s of each shown destination, from its `enqueued` and `dequeued` totals at
// this poll and the previous one (the JSON leaves a total out while it is 0).
function destinationRates(flow) {
  const rates = new Map();
  const seen = new Map();
  const elapsed = (flow.at_ms - poll.rowsAtMs) / 1000;
  for (const destination of flow.destinations) {
    const key = destinationKey(destination);
    const totals = { enqueued: destination.enqueued ?? 0, dequeued: destination.dequeued ?? 0 };
    seen.set(key, totals);
    const old = poll.rows.get(key);
    if (!old || elapsed <= 0) continue;
    const into = growth(totals.enqueued, old.enqueued);
    const out = growth(totals.dequeued, old.dequeued);
    rates.set(key, {
      in: into === null ? null : into / elapsed,
      out: out === null ? null : out / elapsed,
    });
  }
  poll.rows = seen;
  poll.rowsAtMs = flow.at_ms;
  return rates;
}

// -- drawing ---------------------------------------------------------------------------------

function drawWorkers(status) {
  const rows = status.workers.map((worker) => {
    const stats = worker.stats || {};
    let figures = "";
    if (stats.role === "p2p" || stats.role === "pubsub") {
      figures = `received ${count(stats.received)}, delivered ${count(stats.delivered)}`;
    } else if (stats.role === "gateway") {
      figures = `connections ${count(stats.connections)}`;
    } else if (stats.role === "replay") {
      figures = `replaying ${count((stats.replaying || []).length)}, messages ${count(stats.messages)}`;
    }
    if (worker.stats_error) figures = worker.stats_error;
    return row([
      cell("td", worker.title),
      cell("td", worker.role),
      cell("td", worker.state, `state-${worker.state}`),
      cell("td", worker.pid || "", "num"),
      cell("td", count(worker.incarnation), "num"),
      cell("td", seconds(worker.heartbeat_age_ms), "num"),
      cell("td", mib(worker.memory_bytes), "num"),
      cell("td", figures),
    ]);
  });
  fillBody($("workers"), rows, "no workers", 8);
  const ready = status.workers.filter((w) => w.state === "ready").length;
  $("workers-ready").textContent = `${ready} / ${status.workers.length}`;
}

function drawMemory(memory) {
  const fill = $("memory-fill");
  const bar = $("memory-bar");
  const scale = $("memory-scale");
  if (!memory) {
    $("memory-summary").textContent = "–";
    $("memory-text").textContent = "No MemWatch reading.";
    return;
  }
  const levels = memory.levels || [];
  const percent = Math.max(0, Math.min(100, memory.percent));
  fill.style.width = `${percent}%`;
  const top = levels.length;
  fill.classList.toggle("level-warn", memory.level > 0 && memory.level < top);
  fill.classList.toggle("level-bad", memory.level > 0 && memory.level >= top);
  for (const old of bar.querySelectorAll(".membar-mark")) old.remove();
  const labels = [];
  for (const level of levels) {
    const mark = document.createElement("div");
    mark.className = "membar-mark";
    mark.style.left = `${Math.min(100, level.percent)}%`;
    mark.title = `level ${level.level} from ${level.percent} %`;
    bar.appendChild(mark);
    const label = cell("span", `L${level.level} ${level.percent}%`);
    label.style.left = `${Math.min(100, level.percent)}%`;
    if (level.level === memory.level) label.className = "current";
    labels.push(label);
  }
  scale.replaceChildren(...labels);
  const summary = `${mib(memory.used_bytes)} / ${mib(memory.max_memory)}`;
  $("memory-summary").textContent = `${summary} (level ${memory.level})`;
  $("memory-text").textContent =
    `${summary} of max_memory used (${memory.percent} %): MemWatch level ${memory.level}` +
    (levels.length ? ` of ${levels.length}.` : ".");
  bar.setAttribute("aria-label", `memory ${memory.percent} % of max_memory, level ${memory.level}`);
}

function drawChart() {
  const canvas = $("rate-chart");
  const ratio = window.devicePixelRatio || 1;
  const width = canvas.clientWidth;
  const height = canvas.clientHeight;
  if (width === 0 || height === 0) return;
  canvas.width = Math.round(width * ratio);
  canvas.height = Math.round(height * ratio);
  const g = canvas.getContext("2d");
  g.setTransform(ratio, 0, 0, ratio, 0, 0);
  g.clearRect(0, 0, width, height);
  const left = 56;
  const right = width - 10;
  const topY = 10;
  const bottom = height - 28;
  const points = poll.history;
  const newest = points.length ? points[points.length - 1].atMs : Date.now();
  const span = Math.max(60 * 1000, Math.min(HISTORY_MS, newest - (points[0] ? points[0].atMs : newest)));
  let most = 1;
  for (const p of points) most = Math.max(most, p.received, p.delivered);
  const top = niceCeiling(most);
  const x = (atMs) => right - ((newest - atMs) / span) * (right - left);
  const y = (value) => bottom - (value / top) * (bottom - topY);

  g.font = "11px system-ui, sans-serif";
  g.fillStyle = "#5b6574";
  g.strokeStyle = "#d9dee6";
  g.lineWidth = 1;
  // Horizontal grid and the y axis's labels.
  g.textAlign = "right";
  g.textBaseline = "middle";
  for (let i = 0; i <= 4; i += 1) {
    const value = (top * i) / 4;
    g.beginPath();
    g.moveTo(left, y(value));
    g.lineTo(right, y(value));
    g.stroke();
    g.fillText(top < 10 ? fine.format(value) : rate(value), left - 6, y(value));
  }
  // The x axis: seconds before the newest point.
  g.textAlign = "center";
  g.textBaseline = "top";
  const step = span > 3 * 60 * 1000 ? 60 : span > 2 * 60 * 1000 ? 30 : 15;
  for (let ago = 0; ago * 1000 <= span; ago += step) {
    g.fillText(ago === 0 ? "now" : `-${ago} s`, x(newest - ago * 1000), bottom + 4);
  }
  g.save();
  g.translate(12, (topY + bottom) / 2);
  g.rotate(-Math.PI / 2);
  g.textBaseline = "middle";
  g.fillText("messages/s", 0, 0);
  g.restore();
  g.strokeStyle = "#1d2430";
  g.beginPath();
  g.moveTo(left, topY);
  g.lineTo(left, bottom);
  g.lineTo(right, bottom);
  g.stroke();
  if (points.length === 0) {
    g.textAlign = "center";
    g.textBaseline = "middle";
    g.fillStyle = "#5b6574";
    g.fillText("collecting: the first rates appear after two refreshes", (left + right) / 2, (topY + bottom) / 2);
    return;
  }
  for (const [field, colour] of [["received", "#1f5fbf"], ["delivered", "#1e7d32"]]) {
    g.strokeStyle = colour;
    g.lineWidth = 2;
    g.beginPath();
    points.forEach((p, i) => {
      if (i === 0) g.moveTo(x(p.atMs), y(p[field]));
      else g.lineTo(x(p.atMs), y(p[field]));
    });
    if (points.length === 1) g.lineTo(x(points[0].atMs) - 2, y(points[0][field]));
    g.stroke();
  }
}

// 1, 2, 5 times a power of ten, at least `value`.
function niceCeiling(value) {
  const power = 10 ** Math.floor(Math.log10(value));
  for (const factor of [1, 2, 5, 10]) {
    if (factor * power >= value) return factor * power;
  }
  return 10 * power;
}

function stopOf(destination) {
  if (destination.kind === "topic" && destination.stopped) return destination.stopped;
  for (const figures of Object.values(destination.stores || {})) {
    if (figures.stopped) return figures.stopped;
  }
  return "";
}

// Messages waiting: a queue's for a consumer; a topic's for its slowest subscriber, the
// larger of its live buffer's and what its deepest durable subscription owes (the server
// sorts `waiting` and `backlog` by the same figure).
function waitingOf(destination) {
  if (destination.kind === "queue") return destination.waiting;
  return Math.max(destination.deepest_backlog, destination.durable_backlog ?? 0);
}

function drawDestinations(flow) {
  const rates = destinationRates(flow);
  const rows = flow.destinations.map((d) => {
    const queue = d.kind === "queue";
    const waiting = waitingOf(d);
    const backlog = queue ? waiting + d.unacknowledged : waiting;
    const stop = stopOf(d);
    const measured = rates.get(destinationKey(d)) || {};
    const tr = row([
      cell("td", d.name, "name"),
      cell("td", d.kind),
      cell("td", count(backlog), "num"),
      cell("td", count(waiting), "num"),
      cell("td", queue ? count(d.unacknowledged) : "–", "num"),
      cell("td", count(queue ? d.consumers : d.subscribers), "num"),
      cell("td", rate(measured.in), "num"),
      cell("td", rate(measured.out), "num"),
      cell("td", stop ? `stopped: ${stop}` : "flowing", stop ? "stopped" : "flowing"),
      cell("td", d.worker),
    ]);
    tr.dataset.name = d.name;
    return tr;
  });
  const shown = flow.destinations.length;
  const total =
    typeof flow.destinations_matching === "number"
      ? flow.destinations_matching
      : shown + flow.destinations_not_shown;
  fillBody(
    $("destinations"),
    rows,
    view.filter ? "no destination matches the filter" : "no destinations yet",
    10,
  );
  const first = shown ? view.offset + 1 : 0;
  const matching = view.filter ? ` matching "${view.filter}"` : "";
  $("page-info").textContent = `showing ${count(first)}–${count(view.offset + shown)} of ${count(total)}${matching}`;
  $("prev-page").disabled = view.offset === 0;
  $("next-page").disabled = view.offset + shown >= total;
  for (const th of document.querySelectorAll("#destinations th[data-sort]")) {
    if (th.dataset.sort === view.sort) {
      th.setAttribute("aria-sort", view.order === "desc" ? "descending" : "ascending");
    } else {
      th.removeAttribute("aria-sort");
    }
  }
  return { shown, total };
}

function drawHeld(flow) {
  const producers = flow.stopped_producers || [];
  const rows = producers.map((p) =>
    row([
      cell("td", p.peer),
      cell("td", p.destination, "name"),
      cell("td", p.limit, "stopped"),
      cell("td", seconds(p.waiting_ms), "num"),
      cell("td", p.gateway),
    ]),
  );
  fillBody($("held"), rows, "no producer is held", 5);
  $("held-count").textContent = count(producers.length);
}

// The durable subscriptions come with the pubsub workers' figures in /status (whole: only
// the destinations and consumers are paged there), their stored backlogs with the replay
// workers' (counted every 5 s; a subscription that owes none is left out).
const DURABLE_SHOWN = 200;

function drawDurable(status) {
  const all = [];
  const stored = new Map();
  for (const worker of status.workers) {
    const stats = worker.stats || {};
    for (const durable of stats.durable_subscriptions || []) all.push({ ...durable, worker: worker.title });
    if (stats.role === "replay") {
      for (const [name, messages] of Object.entries(stats.backlogs || {})) stored.set(name, messages);
    }
  }
  all.sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
  const rows = all.slice(0, DURABLE_SHOWN).map((d) =>
    row([
      cell("td", d.name, "name"),
      cell("td", d.topic, "name"),
      cell("td", d.state),
      // What it owes an ack for: stored, and the non-persistent ones kept while it is away.
      cell("td", count((stored.get(d.name) ?? 0) + (d.kept ?? 0)), "num"),
      cell("td", d.worker),
    ]),
  );
  if (all.length > DURABLE_SHOWN) {
    const more = cell("td", `and ${count(all.length - DURABLE_SHOWN)} more (GET /flow lists them all)`, "empty");
    more.colSpan = 5;
    rows.push(row([more]));
  }
  fillBody($("durable"), rows, "no durable subscriptions", 5);
}

function showBanner(text) {
  const banner = $("banner");
  banner.textContent = text;
  banner.hidden = false;
}

function hideBanner() {
  $("banner").hidden = true;
}

// -- polling ---------------------------------------------------------------------------------

async function refresh() {
  if (poll.busy) {
    poll.again = true;
    return;
  }
  poll.busy = true;
  clearTimeout(poll.timer);
  poll.timer = null;
  try {
    const asked = flowPath();
    const [status, flow] = await Promise.all([getJson("/status?limit=0"), getJson(asked)]);
    updateRates(status);
    drawWorkers(status);
    drawMemory(status.memory);
    drawDurable(status);
    drawHeld(flow);
    drawChart();
    if (asked === flowPath()) {
      const { shown, total } = drawDestinations(flow);
      // What a page leaves out counts the filtered-out ones too: this is every destination.
      $("destination-count").textContent = count(shown + flow.destinations_not_shown);
      if (shown === 0 && view.offset > 0 && total > 0) {
        // The page is past the end now (destinations went): the last page instead.
        view.offset = Math.max(0, Math.floor((total - 1) / view.limit) * view.limit);
        poll.again = true;
      }
    } else {
      poll.again = true; // the view changed while asking: ask again at once
    }
    $("last-refresh").textContent = new Date().toLocaleTimeString();
    hideBanner();
  } catch (error) {
    if (!(error instanceof PollError)) throw error;
    showBanner(`Refresh failed: ${error.message}. Retrying every ${REFRESH_MS / 1000} s.`);
  } finally {
    poll.busy = false;
    if (poll.again) {
      poll.again = false;
      refresh();
    } else {
      schedule();
    }
  }
}

function schedule() {
  clearTimeout(poll.timer);
  poll.timer = document.hidden ? null : setTimeout(refresh, REFRESH_MS);
}

function viewChanged() {
  poll.rows = new Map(); // other rows: their rates start again
  refresh();
}

function start() {
  const filter = $("filter");
  let typing = null;
  filter.addEventListener("input", () => {
    clearTimeout(typing);
    typing = setTimeout(() => {
      view.filter = filter.value.trim();
      view.offset = 0;
      viewChanged();
    }, 250);
  });
  $("page-size").addEventListener("change", (event) => {
    view.limit = Number(event.target.value);
    view.offset = 0;
    viewChanged();
  });
  $("prev-page").addEventListener("click", () => {
    view.offset = Math.max(0, view.offset - view.limit);
    viewChanged();
  });
  $("next-page").addEventListener("click", () => {
    view.offset += view.limit;
    viewChanged();
  });
  for (const th of document.querySelectorAll("#destinations th[data-sort]")) {
    th.querySelector("button").addEventListener("click", () => {
      const key = th.dataset.sort;
      if (view.sort === key) {
        view.order = view.order === "desc" ? "asc" : "desc";
      } else {
        view.sort = key;
        view.order = DESCENDING_FIRST.has(key) ? "desc" : "asc";
      }
      view.offset = 0;
      viewChanged();
    });
  }
  document.addEventListener("visibilitychange", () => {
    if (document.hidden) {
      clearTimeout(poll.timer);
      poll.timer = null;
    } else {
      refresh();
    }
  });
  window.addEventListener("resize", drawChart);
  $("refresh-note").textContent =
    `Refreshes every ${REFRESH_MS / 1000} s from the admin API (paused while this tab is hidden).`;
  drawChart();
  refresh();
}

start();
