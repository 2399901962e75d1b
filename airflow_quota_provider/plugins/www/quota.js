// The GPU quotas page: one GET of ./dashboard per refresh, drawn with plain DOM calls (no build step).
"use strict";

const REFRESH_S = 5;
let timer = null;
let editable = new Set();  // quotas whose jobs' priority this user may change (the dashboard says)
let quotaOrder = [];  // the quota file's order, which the bars, charts and chargeback table all follow

// Each loader's error stays shown until that loader next succeeds (another one's success leaves it).
const errors = new Map();
function report(source, message) {
  if (message === null) errors.delete(source);
  else errors.set(source, message);
  const node = document.getElementById("error");
  node.replaceChildren(...[...errors.values()].map((m) => el("div", {}, m)));
  node.hidden = errors.size === 0;
}

function inQuotaOrder(rows) {
  const at = (key) => (quotaOrder.includes(key) ? quotaOrder.indexOf(key) : quotaOrder.length);
  return [...rows].sort((a, b) => at(a.key) - at(b.key) || a.key.localeCompare(b.key));
}

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v;
    else if (k === "style") node.style.cssText = v;
    else node.setAttribute(k, v);
  }
  for (const child of children) {
    if (child !== null && child !== undefined) node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

function duration(seconds) {
  const s = Math.round(seconds);
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m ${s % 60}s`;
  return `${Math.floor(s / 3600)}h ${Math.floor((s % 3600) / 60)}m`;
}

function when(iso) {
  return new Date(iso).toLocaleString();
}

function link(text, href) {
  return el("a", { href, target: "_top" }, text);
}

function bar(quota, scale) {
  const pct = (n) => `${(100 * n) / scale}%`;
  const title = (what, n) => `${what}: ${n} GPU${n === 1 ? "" : "s"}`;
  const node = el(
    "div",
    { class: "bar", role: "img", "aria-label": `${quota.name}: owned ${quota.owned}, borrowed ${quota.borrowed}, lent ${quota.lent}, idle ${quota.idle}` },
    el("div", { class: "seg owned", style: `width:${pct(quota.owned)}`, title: title("owned", quota.owned) }),
    el("div", { class: "seg lent", style: `width:${pct(quota.lent)}`, title: title("lent", quota.lent) }),
    el("div", { class: "seg idle", style: `width:${pct(quota.idle)}`, title: title("idle", quota.idle) }),
    el("div", { class: "seg borrowed", style: `width:${pct(quota.borrowed)}`, title: title("borrowed", quota.borrowed) }),
  );
  node.append(el("div", { class: "capline", style: `left:${pct(quota.capacity)}`, title: `capacity ${quota.capacity}` }));
  return node;
}

// A typed job queue's quota: one line per GPU type under its bar, with that type's own bar.
function typeLines(quota, scale) {
  if (!quota.types.length) return null;
  return el(
    "div",
    { class: "types" },
    ...quota.types.map((t) =>
      el(
        "div",
        { class: "type", "data-gpu-type": t.name },
        el("span", { class: "type-name" }, t.name),
        el("span", { class: "numbers" }, `capacity ${t.capacity} · owned ${t.owned} · borrowed ${t.borrowed} · lent ${t.lent} · idle ${t.idle} · can start now ${t.free}`),
        bar({ ...t, name: `${quota.name} ${t.name}` }, scale),
      ),
    ),
  );
}

// The GPU types a job asked for (in its order) and the one it runs on.
function gpuTypes(job) {
  const asked = job.gpu_types.length ? `asked ${job.gpu_types.join(", ")}` : "any type";
  return `${job.gpu_type ?? "–"} (${asked})`;
}

function limits(quota) {
  const parts = [quota.sharing];
  if (quota.borrow_limit !== null) parts.push(`borrow ≤ ${quota.borrow_limit}`);
  if (quota.lend_limit !== null) parts.push(`lend ≤ ${quota.lend_limit}`);
  if (quota.max_priority !== null) parts.push(`priority ≤ ${quota.max_priority}`);
  return parts.join(", ");
}

// A job's priority, with a form to change it where the user has edit access to the quota's pool:
// PATCH ../api/jobs/{id}, which refuses more than the quota's max_priority (shown beside it).
function priorityCell(job, quota, maxPriority) {
  const cell = el("td", { class: "num priority" }, job.priority);
  if (!editable.has(quota)) return cell;
  const input = el("input", { type: "number", step: "1", name: "priority", value: job.priority, "aria-label": `new priority of job ${job.id}` });
  const form = el("form", { class: "set-priority", "data-job": job.id }, input, el("button", { type: "submit" }, "Set"));
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    setPriority(job, quota, input.value);
  });
  cell.replaceChildren(form, maxPriority === null ? null : el("div", { class: "limit" }, `at most ${maxPriority}`));
  return cell;
}

function refusal(status, body, quota) {
  if (status === 403) return `you have no edit access to pool ${quota}`;
  if (status === 422) return "a priority is a whole number from -2147483648 to 2147483647";
  return typeof body.detail === "string" ? body.detail : `${status}`;
}

async function setPriority(job, quota, value) {
  const notice = document.getElementById("notice");
  const priority = value.trim() === "" ? null : Number(value);
  try {
    const response = await fetch(`../api/jobs/${job.id}`, {
      method: "PATCH", credentials: "same-origin",
      headers: { "Content-Type": "application/json", Accept: "application/json" },
      body: JSON.stringify({ priority }),
    });
    const body = await response.json().catch(() => ({}));
    if (!response.ok) throw new Error(refusal(response.status, body, quota));
    notice.textContent = `Job ${job.id}: priority ${job.priority} → ${body.priority}.`;
    notice.classList.remove("error");
  } catch (e) {
    notice.textContent = `Job ${job.id}: priority not changed: ${e.message}`;
    notice.classList.add("error");
  }
  notice.hidden = false;
  document.activeElement.blur();
  refresh();
}

function pendingTable(quota) {
  if (!quota.pending.length) return el("div", { class: "none" }, "no job waiting");
  const body = el("tbody");
  for (const job of quota.pending) {
    body.append(
      el(
        "tr",
        { "data-job": job.id },
        el("td", { class: "num" }, job.position ?? "–"),
        el("td", {}, link(job.label, job.ti_url)),
        el("td", { class: "num" }, `${job.gpus}${perNode(job)}${job.gpu_types.length ? ` (${job.gpu_types.join(", ")})` : ""}`),
        priorityCell(job, quota.name, quota.max_priority),
        el("td", { class: "num" }, duration(job.waiting_s)),
        el("td", { class: "start" }, job.expected_start),
        el("td", { class: "reason" }, job.reason),
      ),
    );
  }
  return el(
    "table",
    { class: "pending" },
    el("thead", {}, el("tr", {}, ...["#", "Waiting job", "GPUs", "Priority", "Waiting", "Start", "Why it waits"].map((h) => el("th", {}, h)))),
    body,
  );
}

function drawQueues(data) {
  const root = document.getElementById("queues");
  root.replaceChildren();
  for (const queue of data.queues) {
    const scale = Math.max(1, ...queue.quotas.map((q) => q.capacity + q.borrowed));
    const card = el(
      "section",
      { class: "queue", "data-queue": queue.name },
      el("div", { class: "head" }, el("h2", {}, `Job queue ${queue.name}`), el("span", { class: "numbers" }, `${queue.in_use} of ${queue.capacity} GPUs in use`)),
      queue.types.length ? el("div", { class: "numbers queue-types" }, `GPU types, in order: ${queue.types.join(" · ")} (${queue.fungibility})`) : null,
    );
    // With cohorts, each cohort is a box inside its parent's (the queue card for a root cohort), and
    // each quota is drawn inside its cohort's box.
    const boxes = new Map([[null, card]]);
    for (const c of queue.cohorts) {
      boxes.set(
        c.name,
        el(
          "div",
          { class: "cohort", "data-cohort": c.name },
          el("div", { class: "head" }, el("h3", {}, `Cohort ${c.name}`), el("span", { class: "numbers" }, `${c.in_use} of ${c.capacity} GPUs in use by its quotas · borrowed ${c.borrowed} · lent ${c.lent}`)),
          c.types.length
            ? el("div", { class: "types" }, ...c.types.map((t) => el("div", { class: "numbers", "data-gpu-type": t.name }, `${t.name}: ${t.in_use} of ${t.capacity} GPUs in use · borrowed ${t.borrowed} · lent ${t.lent}`)))
            : null,
        ),
      );
    }
    for (const c of queue.cohorts) boxes.get(c.parent).append(boxes.get(c.name));
    for (const q of queue.quotas) {
      boxes.get(q.cohort).append(
        el(
          "div",
          { class: "quota", "data-quota": q.name },
          el(
            "div",
            { class: "title" },
            el("h3", {}, el("span", { class: "name" }, q.name), el("span", { class: "badge" }, limits(q))),
            el(
              "span",
              { class: "numbers" },
              `capacity ${q.capacity} · owned ${q.owned} · borrowed ${q.borrowed} · lent ${q.lent} · idle ${q.idle} · can start now ${q.free} · waiting ${q.pending_jobs} job${q.pending_jobs === 1 ? "" : "s"} (${q.pending_gpus} GPUs)`,
            ),
          ),
          bar(q, scale),
          typeLines(q, scale),
          pendingTable(q),
        ),
      );
    }
    root.append(card);
  }
}

function drawPreemptions(data) {
  const body = document.querySelector("#preemptions tbody");
  body.replaceChildren();
  if (!data.preemptions.length) {
    body.append(el("tr", {}, el("td", { colspan: "6", class: "none" }, "no preemption yet")));
    return;
  }
  for (const p of data.preemptions) {
    const why = p.message ? `${p.reason ?? ""}: ${p.message}` : p.reason ?? "";
    body.append(
      el("tr", {}, el("td", {}, when(p.at)), el("td", {}, p.victim), el("td", {}, p.victim_quota ?? ""), el("td", {}, p.preemptor), el("td", {}, p.preemptor_quota ?? ""), el("td", {}, why)),
    );
  }
}

// A gang's GPUs are its total over its nodes, the same number on each of its hosts.
function perNode(job) {
  return job.nodes > 1 ? ` (${job.nodes} nodes × ${job.gpus / job.nodes})` : "";
}

function gpus(job) {
  return (job.borrowed_gpus ? `${job.owned_gpus} + ${job.borrowed_gpus} borrowed` : `${job.gpus}`) + perNode(job);
}

// Where a job holds GPUs: "host: devices" per node, node 0 first; its last host when it holds none.
function placement(job) {
  if (!job.placement.length) return `${job.host ?? "–"}: –`;
  return job.placement.map((node) => `${node.host}: ${node.devices.join(",")}`).join(" · ");
}

function drawRunning(jobs) {
  const body = document.querySelector("#running tbody");
  body.replaceChildren();
  if (!jobs.length) {
    body.append(el("tr", {}, el("td", { colspan: "9", class: "none" }, "no job running")));
    return;
  }
  const now = Date.now();
  for (const job of jobs) {
    const name = `${job.dag_id}.${job.task_id}${job.map_index >= 0 ? `[${job.map_index}]` : ""} (${job.run_id})`;
    const checkpoint = job.last_checkpoint_at ? `${duration((now - Date.parse(job.last_checkpoint_at)) / 1000)} ago` : "unknown";
    body.append(
      el(
        "tr",
        { "data-job": job.id, "data-state": job.state },
        el("td", {}, link(name, job.ti_url), job.state === "stopping" ? el("span", { class: "badge" }, "stopping") : null),
        el("td", {}, job.quota),
        el("td", { class: "num" }, gpus(job), job.gpu_type ? el("span", { class: "badge gpu-type" }, job.gpu_type) : null),
        el("td", { class: "placement" }, placement(job)),
        priorityCell(job, job.quota, job.max_priority),
        el("td", {}, job.started_at ? when(job.started_at) : "–"),
        el("td", { class: "num" }, `${job.preemptions} of ${job.preemption_limit ?? "∞"}`),
        el("td", {}, checkpoint),
        el("td", { class: "reclaim" }, job.reclaim_candidate ? "yes" : "no"),
      ),
    );
  }
}

// Opened from a task instance's "GPU quota job" link (?dag_id=&run_id=&task_id=&map_index=): its
// job first, with why and where it waits, and the audit log filtered to that job once (then the
// filters are the user's again).
const opened = new URLSearchParams(location.search);
const taskInstance = ["dag_id", "run_id", "task_id"].every((f) => opened.get(f))
  ? { dag_id: opened.get("dag_id"), run_id: opened.get("run_id"), task_id: opened.get("task_id"), map_index: opened.get("map_index") ?? "-1" }
  : null;
let auditOnJob = false;

function jobFacts(job) {
  const facts = [["State", job.state], ["Quota", `${job.quota} (job queue ${job.queue ?? "unknown"})`], ["GPUs", gpus(job)],
                 ["Priority", job.priority], ["Preemptions", `${job.preemptions} of ${job.preemption_limit ?? "∞"}`]];
  if (job.gpu_types.length || job.gpu_type) facts.splice(3, 0, ["GPU type", gpuTypes(job)]);
  if (job.state === "pending") {
    facts.push(["Position", job.pending_position ?? "–"], ["Why it waits", job.pending_reason ?? "waiting for the next scheduling cycle"],
               ["Start", job.expected_start], ["Waiting since", when(job.waiting_since)]);
  } else {
    facts.push([job.nodes > 1 ? "Hosts: devices" : "Host: devices", placement(job)],
               ["Started", job.started_at ? when(job.started_at) : "–"], ["Finished", job.finished_at ? when(job.finished_at) : "–"]);
  }
  if (job.message) facts.push(["Message", job.message]);
  return facts;
}

async function refreshTaskInstance() {
  if (!taskInstance) return;
  const { dag_id, run_id, task_id, map_index } = taskInstance;
  const data = await getJson(`../api/jobs?${new URLSearchParams({ ...taskInstance, limit: 1000 })}`, "task instance");
  const job = data.jobs[data.jobs.length - 1];  // oldest submission first: the latest try last
  const name = `${dag_id}.${task_id}${Number(map_index) >= 0 ? `[${map_index}]` : ""} (${run_id})`;
  document.getElementById("ti-name").replaceChildren(job ? link(name, job.ti_url) : name, job ? ` · job ${job.id}` : "");
  const body = document.querySelector("#ti-job tbody");
  body.replaceChildren(...(job
    ? jobFacts(job).map(([what, value]) => el("tr", {}, el("th", {}, what), el("td", {}, value)))
    : [el("tr", {}, el("td", { class: "none" }, "no quota job for this task instance: it has not been queued on the quota executor"))]));
  body.closest("table").dataset.job = job?.id ?? "";
  document.getElementById("task-instance").hidden = false;
  if (job && !auditOnJob) {
    document.querySelector("#audit-filters [name=job_id]").value = job.id;
    auditOnJob = true;
  }
}

// The audit log: the kinds, quota and job the filters name; the latest AUDIT_ROWS events.
const AUDIT_ROWS = 100;

function fillQuotaFilter(data) {
  const select = document.querySelector("#audit-filters [name=quota]");
  const names = data.queues.flatMap((q) => q.quotas.map((quota) => quota.name));
  const have = [...select.options].slice(1).map((o) => o.value);
  if (have.join() === names.join()) return;
  const chosen = select.value;
  select.replaceChildren(select.options[0], ...names.map((n) => el("option", { value: n }, n)));
  select.value = names.includes(chosen) ? chosen : "";
}

function eventJob(e) {
  if (e.job_id === null) return "";
  const mi = e.map_index !== null && e.map_index >= 0 ? `[${e.map_index}]` : "";
  return e.dag_id ? `${e.dag_id}.${e.task_id}${mi} (${e.run_id}) #${e.job_id}` : `job ${e.job_id}`;
}

function eventDetails(e) {
  const parts = [];
  if (e.reason) parts.push(e.reason);
  if (e.victim && e.preemptor) parts.push(`job ${e.victim} stopped for job ${e.preemptor}`);
  if (e.host) parts.push(`${e.host}${e.devices.length ? `: ${e.devices.join(",")}` : ""}`);
  if (e.message) parts.push(e.message);
  return parts.join(" · ");
}

async function refreshAudit() {
  const form = document.getElementById("audit-filters");
  if (!form.reportValidity()) return;
  const query = new URLSearchParams({ limit: AUDIT_ROWS });
  for (const name of ["kind", "quota", "job_id"]) {
    const value = form.elements[name].value.trim();
    if (value) query.set(name, value);
  }
  const data = await getJson(`../api/events?${query}`, "events");
  const body = document.querySelector("#events tbody");
  body.replaceChildren();
  if (!data.events.length) body.append(el("tr", {}, el("td", { colspan: "5", class: "none" }, "no such event")));
  for (const e of data.events) {
    body.append(el("tr", { "data-event": e.id, "data-kind": e.kind }, el("td", {}, when(e.at)), el("td", {}, e.kind.replaceAll("_", " ")),
                   el("td", {}, eventJob(e)), el("td", {}, e.quota ?? ""), el("td", {}, eventDetails(e))));
  }
  document.getElementById("events-count").textContent = `${data.events.length} of ${data.total_entries} shown`;
}

async function getJson(url, what) {
  const response = await fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } });
  if (!response.ok) {
    const detail = await response.json().catch(() => ({}));
    throw new Error(response.status === 401 ? "Not logged in to Airflow: log in and reload." : `${what} ${response.status}: ${detail.detail ?? response.statusText}`);
  }
  return response.json();
}

async function refresh() {
  // Redrawing would throw away a priority being typed: wait for the next tick.
  if (document.activeElement?.closest("form.set-priority")) return;
  try {
    const [data, running] = await Promise.all([
      getJson("dashboard", "dashboard"),
      getJson("../api/jobs?state=running,stopping&limit=1000", "jobs"),
    ]);
    editable = new Set(data.editable_quotas);
    quotaOrder = data.queues.flatMap((q) => q.quotas.map((quota) => quota.name));
    drawQueues(data);
    drawRunning(running.jobs);
    drawPreemptions(data);
    fillQuotaFilter(data);
    await refreshTaskInstance();
    await refreshAudit();
    document.getElementById("updated").textContent = `updated ${new Date(data.generated_at).toLocaleTimeString()}`;
    report("quotas", null);
  } catch (e) {
    report("quotas", `Could not load quotas: ${e.message}`);
  }
}

// Usage: each quota's average GPUs per bucket, stacked (owned, lent, idle up to its capacity;
// borrowed above it), over the last hour, day and week, with time and GPU ticks. Drawn as SVG by this
// script; refreshed each minute.
const SVG = "http://www.w3.org/2000/svg";
const USAGE_REFRESH_S = 60;
const SPANS = [
  { name: "hour", label: "last hour", seconds: 3600, every: 300, tick: 900, unit: [60, "min"] },
  { name: "day", label: "last 24 hours", seconds: 86400, every: 3600, tick: 6 * 3600, unit: [3600, "h"] },
  { name: "week", label: "last 7 days", seconds: 7 * 86400, every: 6 * 3600, tick: 86400, unit: [86400, "d"] },
];
const CHARGEBACK_SPAN = "week";
const STACK = [["owned", "used_within"], ["lent", "lent"], ["idle", "idle"], ["borrowed", "borrowed"]];
const W = 400, H = 90, TOP = 12, BOTTOM = 12;

function svg(tag, attrs, ...children) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  node.append(...children);
  return node;
}

function hours(seconds) {
  return (seconds / 3600).toFixed(2);
}

function getUsage(query) {
  return getJson(`../api/usage?${query}`, "usage");
}

// A quota's row in a bucket, its GPU types' rows added up; none (nothing charged) where the quota
// file in force then did not have it.
const NO_ROW = { capacity_s: 0, used_within: 0, borrowed: 0, lent: 0, idle: 0 };
function rowOf(bucket, quota) {
  const rows = bucket.rows.filter((r) => r.key === quota);
  return rows.length ? Object.fromEntries(Object.keys(NO_ROW).map((k) => [k, rows.reduce((sum, r) => sum + r[k], 0)])) : NO_ROW;
}

// One quota's stacked step areas: per bucket, the average GPUs of each kind (seconds / bucket length).
// The series starts at the install's start at the earliest: before it the chart is empty.
function chart(quota, span, data) {
  const t0 = Date.parse(data.since), t1 = Date.parse(data.until);
  const buckets = data.series.map((b) => {
    const row = rowOf(b, quota);
    const s = Date.parse(b.since), e = Date.parse(b.until), len = (e - s) / 1000;
    return { x0: ((s - t0) / (t1 - t0)) * W, x1: ((e - t0) / (t1 - t0)) * W, capacity: row.capacity_s / len,
             gpus: Object.fromEntries(STACK.map(([kind, field]) => [kind, row[field] / len])) };
  });
  const capacity = buckets.length ? buckets[buckets.length - 1].capacity : 0;  // the capacity now
  const top = Math.max(1, ...buckets.map((b) => b.capacity + b.gpus.borrowed));
  const y = (gpus) => TOP + (H - TOP - BOTTOM) * (1 - gpus / top);
  const node = svg("svg", { class: "usage-chart", viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: "none",
                            role: "img", "data-usage": quota, "data-span": span.name, "aria-label": `${quota}, ${span.label}` });
  let base = buckets.map(() => 0);
  for (const [kind, field] of STACK) {
    const tops = buckets.map((b, i) => base[i] + b.gpus[kind]);
    const upper = buckets.flatMap((b, i) => [`${b.x0},${y(tops[i])}`, `${b.x1},${y(tops[i])}`]);
    const lower = buckets.flatMap((b, i) => [`${b.x0},${y(base[i])}`, `${b.x1},${y(base[i])}`]).reverse();
    const total = data.series.reduce((sum, b) => sum + rowOf(b, quota)[field], 0);
    node.append(svg("path", { class: `series ${kind}`, "data-kind": kind, d: buckets.length ? `M${upper.join("L")}L${lower.join("L")}Z` : "" },
                    svg("title", {}, `${kind}: ${hours(total)} GPU-hours`)));
    base = tops;
  }
  node.append(svg("line", { class: "capline", x1: 0, x2: W, y1: y(capacity), y2: y(capacity) }));
  ticks(node, span, t0, t1, top, y);
  return el("figure", {}, node, el("figcaption", {}, `${span.label}, GPUs`));
}

// A step of 1, 2 or 5 times a power of ten that cuts 0..top into at most 4 parts.
function gpuStep(top) {
  for (let power = 1; ; power *= 10) {
    for (const step of [power, 2 * power, 5 * power]) if (top / step <= 4) return step;
  }
}

// Time ticks every span.tick seconds back from now (labelled in span.unit), GPU ticks every gpuStep.
function ticks(node, span, t0, t1, top, y) {
  const [unit, name] = span.unit;
  for (let ago = span.tick; ago <= span.seconds; ago += span.tick) {
    const x = ((t1 - ago * 1000 - t0) / (t1 - t0)) * W;
    if (x < 0) break;  // before the install: the chart starts later
    node.append(svg("line", { class: "tick", "data-axis": "time", x1: x, x2: x, y1: H - BOTTOM, y2: H - BOTTOM + 3 }),
                svg("text", { x, y: H - 2, "text-anchor": x < 20 ? "start" : "middle" }, `-${ago / unit} ${name}`));
  }
  node.append(svg("text", { x: W - 2, y: H - 2, "text-anchor": "end" }, "now"));
  const step = gpuStep(top);
  for (let gpus = 0; gpus <= top; gpus += step) {
    node.append(svg("line", { class: "tick", "data-axis": "gpus", x1: 0, x2: W, y1: y(gpus), y2: y(gpus), "stroke-opacity": 0.5 }),
                svg("text", { x: 2, y: y(gpus) - 1 }, `${gpus}`));
  }
}

// One row per quota, or per quota and GPU type where a job queue has types (the GPU type column
// shows then); the cost column shows where the quota file prices GPU-hours.
function drawChargeback(week) {
  const table = document.getElementById("chargeback");
  const typed = week.rows.some((r) => r.gpu_type != null), priced = week.rows.some((r) => r.cost != null);
  table.querySelector("th.gpu-type").hidden = !typed;
  table.querySelector("th.cost").hidden = !priced;
  const body = table.querySelector("tbody");
  body.replaceChildren();
  for (const r of inQuotaOrder(week.rows)) {
    body.append(el("tr", { "data-key": r.key, "data-gpu-type": r.gpu_type ?? "" }, el("td", {}, r.key),
                    typed ? el("td", {}, r.gpu_type ?? "–") : null,
                    ...[r.capacity_s, r.used_within, r.borrowed, r.lent, r.idle, r.lost].map((v) => el("td", { class: "num" }, hours(v))),
                    priced ? el("td", { class: "num" }, r.cost == null ? "–" : r.cost.toFixed(2)) : null));
  }
}

async function refreshUsage() {
  const until = Math.floor(Date.now() / 1000);
  try {
    const data = await Promise.all(SPANS.map((s) => getUsage(`since=${until - s.seconds}&until=${until}&every=${s.every}`)));
    const root = document.getElementById("charts");
    root.replaceChildren();
    for (const quota of new Set(inQuotaOrder(data[0].rows).map((r) => r.key))) {  // a typed quota's rows: one chart
      root.append(el("div", { class: "name" }, quota), ...SPANS.map((s, i) => chart(quota, s, data[i])));
    }
    const chargeback = SPANS.findIndex((s) => s.name === CHARGEBACK_SPAN);
    drawChargeback(data[chargeback]);
    // The CSV names the same bounds as the table, so its figures are the table's (in GPU-seconds).
    document.getElementById("csv").href = `../api/usage?since=${until - SPANS[chargeback].seconds}&until=${until}&format=csv`;
    report("usage", null);
  } catch (e) {
    report("usage", `Could not load usage: ${e.message}`);
  }
}

// Airflow's UI marks its color mode as a class of its <html> (light or dark); inside it, the page
// follows that mode and its changes, instead of the system's.
function followAirflowTheme() {
  let root = null;
  try {
    if (window.parent !== window) root = window.parent.document.documentElement;
  } catch {
    return;  // embedded elsewhere: the system's mode
  }
  if (!root) return;
  const apply = () => {
    const mode = ["dark", "light"].find((m) => root.classList.contains(m));
    if (mode) document.documentElement.dataset.theme = mode;
    else delete document.documentElement.dataset.theme;
  };
  apply();
  new MutationObserver(apply).observe(root, { attributes: true, attributeFilter: ["class"] });
}

function schedule() {
  clearInterval(timer);
  timer = document.getElementById("auto").checked ? setInterval(refresh, REFRESH_S * 1000) : null;
}

followAirflowTheme();
document.getElementById("every").textContent = REFRESH_S;
document.getElementById("auto").addEventListener("change", schedule);
document.getElementById("audit-filters").addEventListener("submit", (event) => {
  event.preventDefault();
  refresh();
});
schedule();
refresh().then(refreshUsage);  // the charts follow the quota order the dashboard gives
setInterval(() => document.getElementById("auto").checked && refreshUsage(), USAGE_REFRESH_S * 1000);
