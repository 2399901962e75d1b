// The GPU quotas page: one GET of ./dashboard per refresh, drawn with plain DOM calls (no build step).
"use strict";

const REFRESH_S = 5;
let timer = null;

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

function limits(quota) {
  const parts = [quota.sharing];
  if (quota.borrow_limit !== null) parts.push(`borrow ≤ ${quota.borrow_limit}`);
  if (quota.lend_limit !== null) parts.push(`lend ≤ ${quota.lend_limit}`);
  if (quota.max_priority !== null) parts.push(`priority ≤ ${quota.max_priority}`);
  return parts.join(", ");
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
        el("td", { class: "num" }, job.gpus),
        el("td", { class: "num" }, job.priority),
        el("td", { class: "num" }, duration(job.waiting_s)),
        el("td", { class: "reason" }, job.reason),
      ),
    );
  }
  return el(
    "table",
    { class: "pending" },
    el("thead", {}, el("tr", {}, ...["#", "Waiting job", "GPUs", "Priority", "Waiting", "Why it waits"].map((h) => el("th", {}, h)))),
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

async function refresh() {
  const error = document.getElementById("error");
  try {
    const response = await fetch("dashboard", { credentials: "same-origin", headers: { Accept: "application/json" } });
    if (!response.ok) {
      const detail = await response.json().catch(() => ({}));
      throw new Error(response.status === 401 ? "Not logged in to Airflow: log in and reload." : `${response.status}: ${detail.detail ?? response.statusText}`);
    }
    const data = await response.json();
    drawQueues(data);
    drawPreemptions(data);
    document.getElementById("updated").textContent = `updated ${new Date(data.generated_at).toLocaleTimeString()}`;
    error.hidden = true;
  } catch (e) {
    error.textContent = `Could not load quotas: ${e.message}`;
    error.hidden = false;
  }
}

function schedule() {
  clearInterval(timer);
  timer = document.getElementById("auto").checked ? setInterval(refresh, REFRESH_S * 1000) : null;
}

document.getElementById("every").textContent = REFRESH_S;
document.getElementById("auto").addEventListener("change", schedule);
refresh();
schedule();
