// redeliver console: the few behaviours the pages need. Every change goes
// through the JSON API with the session cookie (same origin); nothing here
// builds HTML from data (textContent only).
"use strict";

function fields(form) {
  const body = {};
  for (const el of form.elements) {
    if (!el.name || el.disabled) continue;
    if (el.type === "checkbox") {
      if (el.name === "all") body.all = el.checked;
      continue;
    }
    if (el.name === "ids") body.ids = [el.value];
    else if (el.value.trim() !== "") body[el.name] = el.value.trim();
  }
  if (form.dataset.select !== undefined && !body.all) {
    body.ids = Array.from(document.querySelectorAll("input[name=id]:checked")).map((c) => c.value);
  }
  return body;
}

async function submit(form) {
  const msg = form.querySelector("[data-msg]");
  if (msg) msg.textContent = "";
  let res;
  try {
    res = await fetch(form.dataset.api, {
      method: "POST",
      credentials: "same-origin",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify(fields(form)),
    });
  } catch (e) {
    if (msg) msg.textContent = "the console did not answer: " + e;
    return;
  }
  const data = await res.json().catch(() => ({}));
  if (!res.ok) {
    if (msg) msg.textContent = data.error || "failed: HTTP " + res.status;
    return;
  }
  if (form.dataset.after === "job") {
    pollReplays();
  } else if (form.dataset.after === "purged") {
    if (msg) msg.textContent = "purged " + data.purged;
    setTimeout(() => location.reload(), 800);
  } else {
    location.reload();
  }
}

function renderReplays(jobs) {
  const box = document.getElementById("replays");
  if (!box) return false;
  box.replaceChildren();
  for (const j of jobs) {
    const line = document.createElement("div");
    line.className = "replay";
    line.dataset.state = j.state;
    line.textContent = `${j.started_at} ${j.selection}${j.rate ? " at " + j.rate : ""}: ` +
      `${j.state}, replayed ${j.replayed}, looked at ${j.seen} of ${j.total}` +
      (j.error ? ` (${j.error})` : "");
    box.appendChild(line);
  }
  return jobs.some((j) => j.state === "running");
}

let polling = false;
async function pollReplays() {
  if (polling) return;
  polling = true;
  try {
    for (;;) {
      const res = await fetch("/api/dead-letters/replays", { credentials: "same-origin" });
      if (!res.ok) break;
      if (!renderReplays(await res.json())) break;
      await new Promise((r) => setTimeout(r, 1000));
    }
  } finally {
    polling = false;
  }
}

document.addEventListener("submit", (ev) => {
  const form = ev.target;
  if (!form.dataset.api) return;
  ev.preventDefault();
  submit(form);
});

document.addEventListener("click", (ev) => {
  const open = ev.target.closest("[data-reveal]");
  if (open) {
    document.getElementById(open.dataset.reveal).classList.remove("hidden");
    return;
  }
  const all = ev.target.closest("#select-page");
  if (all) {
    for (const c of document.querySelectorAll("input[name=id]")) c.checked = all.checked;
  }
});

document.addEventListener("DOMContentLoaded", () => {
  const box = document.getElementById("replays");
  if (box && box.dataset.running === "true") pollReplays();
});
