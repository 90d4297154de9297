// The dashboard reads /api/v1/dashboard with the key the user typed (kept for this tab only,
// in sessionStorage) and redraws every few seconds. Plain DOM, no libraries.
"use strict";

const REFRESH_MS = 5000;
let timer = null;

function cell(row, text) {
  const td = document.createElement("td");
  td.textContent = text;
  row.appendChild(td);
  return td;
}

function fill(id, rows, render) {
  const body = document.getElementById(id);
  body.replaceChildren();
  for (const item of rows) {
    const tr = document.createElement("tr");
    render(tr, item);
    body.appendChild(tr);
  }
}

function when(seconds) {
  return new Date(seconds * 1000).toISOString().replace("T", " ").slice(0, 19);
}

// A loss curve as an SVG polyline scaled into its box; one point per training step.
function curve(losses) {
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("class", "loss");
  svg.setAttribute("viewBox", "0 0 240 48");
  if (losses.length === 0) return svg;
  const values = losses.map((point) => point[1]);
  const low = Math.min(...values), high = Math.max(...values);
  const span = high - low || 1;
  const step = values.length > 1 ? 236 / (values.length - 1) : 0;
  const points = values.map((v, i) => `${(2 + i * step).toFixed(1)},${(46 - ((v - low) / span) * 44).toFixed(1)}`);
  const line = document.createElementNS(ns, "polyline");
  line.setAttribute("points", points.join(" "));
  svg.appendChild(line);
  return svg;
}

function show(data) {
  document.getElementById("slots-max").textContent = data.slots.max_loras;
  document.getElementById("slots-free").textContent = data.slots.free_loras;
  document.getElementById("slots-mine").textContent = data.slots.used_loras;
  document.getElementById("slots-quota").textContent = data.slots.max_loras_per_key;
  fill("queue-rows", Object.entries(data.queues), (tr, [name, queue]) => {
    tr.dataset.worker = name;
    cell(tr, name);
    cell(tr, queue.pending);
    cell(tr, queue.busy ? "yes" : "no");
  });
  document.getElementById("runs-total").textContent = `(${data.runs_total})`;
  fill("run-rows", data.runs, (tr, run) => {
    tr.dataset.runId = run.id;
    cell(tr, run.id);
    cell(tr, run.lora_rank);
    cell(tr, run.active ? "yes" : "no");
    cell(tr, when(run.last_request_time));
    const last = run.losses.length ? run.losses[run.losses.length - 1][1].toFixed(4) : "";
    const td = cell(tr, last);
    td.appendChild(curve(run.losses));
  });
  fill("checkpoint-rows", data.checkpoints, (tr, ckpt) => {
    tr.dataset.uri = ckpt.uri;
    cell(tr, ckpt.uri);
    cell(tr, ckpt.kind);
    cell(tr, `${(ckpt.size_bytes / 1024).toFixed(1)} KiB`);
    cell(tr, when(ckpt.created_at));
  });
  fill("usage-rows", data.usage, (tr, row) => {
    cell(tr, row.day);
    cell(tr, row.metric);
    cell(tr, row.amount);
  });
  document.getElementById("content").hidden = false;
}

async function refresh() {
  const key = sessionStorage.getItem("twinkle-key");
  const status = document.getElementById("status");
  if (!key) return;
  const answer = await fetch("/api/v1/dashboard", { headers: { "X-API-Key": key } });
  const body = await answer.json();
  if (!answer.ok) {
    status.textContent = `${answer.status}: ${body.error} (request ${body.request_id})`;
    status.className = "error";
    document.getElementById("content").hidden = true;
    return;
  }
  status.textContent = `${body.key.name}: updated ${when(Date.now() / 1000)}`;
  status.className = "";
  show(body);
}

document.getElementById("key-form").addEventListener("submit", (event) => {
  event.preventDefault();
  sessionStorage.setItem("twinkle-key", document.getElementById("api-key").value.trim());
  clearInterval(timer);
  refresh();
  timer = setInterval(refresh, REFRESH_MS);
});

if (sessionStorage.getItem("twinkle-key")) {
  refresh();
  timer = setInterval(refresh, REFRESH_MS);
}
