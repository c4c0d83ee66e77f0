// safeack live frontier: polls /api/frontier and draws one row per partition.
"use strict";

const POLL_MS = 250;
const HISTORY = 240; // samples of the blocked count kept per partition (60 s at 4 Hz)
const HELD_AFTER_S = 0.75; // an unfinished head older than this is drawn as holding the partition

const css = getComputedStyle(document.documentElement);
const color = (name) => css.getPropertyValue(name).trim();
const C = {
  commit: color("--commit"),
  safe: color("--safe"),
  blocked: color("--blocked"),
  unfinished: color("--unfinished"),
  head: color("--head"),
  unfetched: color("--unfetched"),
  line: color("--line"),
  muted: color("--muted"),
};

const $ = (id) => document.getElementById(id);
const rowsEl = $("partitions");
const rows = new Map(); // partition -> {el, track, spark, nums, history}
let span = 0; // records across the track width, shared by all rows
let failures = 0;
let renderedOnce = false;

const fmt = new Intl.NumberFormat("en-US");
const n = (v) => fmt.format(v); // counts
const o = (v) => String(v); // offsets, as Kafka tools print them

function poll() {
  fetch("/api/frontier", { cache: "no-store" })
    .then((r) => {
      if (!r.ok) throw new Error("HTTP " + r.status);
      return r.json();
    })
    .then((data) => {
      failures = 0;
      setStatus(true, "live");
      render(data);
    })
    .catch(() => {
      failures++;
      setStatus(false, failures > 8 ? "disconnected" : "reconnecting…");
    })
    .finally(() => setTimeout(poll, POLL_MS));
}

function setStatus(ok, text) {
  const el = $("status");
  el.classList.toggle("live", ok);
  el.classList.toggle("down", !ok);
  $("status-text").textContent = text;
}

function base(p) {
  // The row starts at the committed offset; before the first commit is
  // confirmed, at the completed prefix.
  return p.committed >= 0 ? Math.min(p.committed, p.safe) : p.safe;
}

function end(p) {
  return Math.max(p.delivered, p.hwm, p.safe);
}

function render(d) {
  $("meta").innerHTML =
    `topic <b>${esc(d.topic)}</b> · group <b>${esc(d.group)}</b> · ordering <b>${esc(d.ordering)}</b> · ` +
    `${d.embedded ? "embedded broker" : "brokers <b>" + esc(d.brokers.join(", ")) + "</b>"} · ` +
    `commit every <b>${d.commit_interval_s}s</b> · up <b>${Math.floor(d.uptime_s)}s</b>`;

  let inflight = 0, blocked = 0, lag = 0;
  for (const p of d.partitions) {
    inflight += p.in_flight;
    blocked += p.blocked;
    if (p.hwm >= 0) lag += Math.max(0, p.hwm - Math.max(p.committed, 0));
  }
  $("c-produced").textContent = n(Math.round(d.produced_per_s));
  $("c-handled").textContent = n(Math.round(d.handled_per_s));
  $("c-inflight").textContent = n(inflight);
  $("c-blocked").textContent = n(blocked);
  $("c-lag").textContent = n(lag);
  $("c-dlq").textContent = n(d.dead_lettered);
  $("c-dlq-unit").textContent = `${n(d.failed_attempts)} failed attempts retried`;

  // One scale for every row: grow at once, shrink slowly, so rows compare.
  let need = 40;
  for (const p of d.partitions) need = Math.max(need, (end(p) - base(p)) * 1.15);
  span = need > span ? need : span + (need - span) * 0.06;
  $("axis-span").textContent = "+" + n(Math.round(span)) + " records";

  const seen = new Set();
  for (const p of d.partitions) {
    seen.add(p.partition);
    let row = rows.get(p.partition);
    if (!row) row = addRow(p.partition);
    row.history.push(p.blocked);
    if (row.history.length > HISTORY) row.history.shift();
    drawRow(row, p);
  }
  for (const [id, row] of rows) {
    if (!seen.has(id)) {
      row.el.remove();
      rows.delete(id);
    }
  }
  if (rows.size === 0) {
    if (!rowsEl.querySelector(".empty")) rowsEl.innerHTML = '<div class="empty">waiting for partitions to be assigned…</div>';
  } else {
    const empty = rowsEl.querySelector(".empty");
    if (empty) empty.remove();
  }

  const withData = d.partitions.filter((p) => p.delivered > 0 || p.safe > 0).length;
  if (withData > 0) {
    document.body.dataset.rendered = "true";
    document.body.dataset.partitions = String(d.partitions.length);
    if (!renderedOnce || document.title.indexOf(String(d.partitions.length)) < 0) {
      document.title = `safeack live · ${d.partitions.length} partitions`;
    }
    renderedOnce = true;
  }
}

function addRow(id) {
  const el = document.createElement("div");
  el.className = "row";
  el.dataset.partition = id;
  el.innerHTML =
    `<div class="pname">P${id}<small></small></div>` +
    `<div class="track"><canvas></canvas></div>` +
    `<div class="nums"><div class="line1"></div><div class="line2"></div></div>` +
    `<canvas class="spark"></canvas>`;
  // Keep rows ordered by partition.
  const after = [...rowsEl.querySelectorAll(".row")].find((r) => Number(r.dataset.partition) > id);
  rowsEl.insertBefore(el, after || null);
  const row = {
    el,
    track: el.querySelector(".track canvas"),
    state: el.querySelector(".pname small"),
    spark: el.querySelector(".spark"),
    line1: el.querySelector(".line1"),
    line2: el.querySelector(".line2"),
    history: [],
  };
  rows.set(id, row);
  return row;
}

function fit(canvas) {
  const dpr = window.devicePixelRatio || 1;
  const w = Math.max(1, Math.round(canvas.clientWidth * dpr));
  const h = Math.max(1, Math.round(canvas.clientHeight * dpr));
  if (canvas.width !== w || canvas.height !== h) {
    canvas.width = w;
    canvas.height = h;
  }
  const ctx = canvas.getContext("2d");
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  return { ctx, w: canvas.clientWidth, h: canvas.clientHeight };
}

let hatch = null;
function hatchPattern(ctx) {
  if (hatch) return hatch;
  const c = document.createElement("canvas");
  c.width = c.height = 8;
  const g = c.getContext("2d");
  g.fillStyle = "#1c2333";
  g.fillRect(0, 0, 8, 8);
  g.strokeStyle = C.unfetched;
  g.lineWidth = 3;
  g.beginPath();
  g.moveTo(-2, 10); g.lineTo(10, -2);
  g.moveTo(6, 10); g.lineTo(10, 6);
  g.moveTo(-2, 2); g.lineTo(2, -2);
  g.stroke();
  hatch = ctx.createPattern(c, "repeat");
  return hatch;
}

function drawRow(row, p) {
  const { ctx, w, h } = fit(row.track);
  ctx.clearRect(0, 0, w, h);
  const b0 = base(p);
  const pad = 6; // room for the commit bar and the head marker at the left edge
  const x = (off) => pad + ((off - b0) / span) * (w - pad - 2);
  const barY = 7, barH = h - 14;

  // Background track.
  ctx.fillStyle = "#10151f";
  roundRect(ctx, pad, barY, w - pad, barH, 4);
  ctx.fill();

  // In the log, not yet taken.
  if (p.hwm > p.delivered) {
    ctx.fillStyle = hatchPattern(ctx);
    ctx.fillRect(x(p.delivered), barY, Math.max(1, x(p.hwm) - x(p.delivered)), barH);
  }
  // Completed prefix not yet confirmed as committed.
  if (p.safe > b0) {
    ctx.fillStyle = C.safe;
    ctx.fillRect(pad, barY, Math.max(1, x(p.safe) - pad), barH);
  }
  // The retained window: blocked and unfinished runs.
  const held = p.oldest_unfinished >= 0 && p.oldest_age_s >= HELD_AFTER_S;
  p.runs.forEach((r, i) => {
    const [from, to, , done] = r;
    const x0 = x(from), x1 = x(to);
    if (done) {
      ctx.fillStyle = C.blocked;
      ctx.fillRect(x0, barY, Math.max(1, x1 - x0), barH);
    } else {
      const isHead = i === 0 && held;
      ctx.fillStyle = isHead ? C.head : C.unfinished;
      ctx.fillRect(x0, barY, Math.max(isHead ? 4 : 2, x1 - x0), barH);
    }
  });
  if (p.truncated && p.runs.length) {
    const last = p.runs[p.runs.length - 1][1];
    ctx.fillStyle = "rgba(139,150,168,.35)";
    ctx.fillRect(x(last), barY, Math.max(1, x(p.delivered) - x(last)), barH);
  }

  // The held head gets a marker above the bar.
  if (held) {
    const hx = x(p.oldest_unfinished);
    ctx.fillStyle = C.head;
    ctx.beginPath();
    ctx.moveTo(hx - 5, 0); ctx.lineTo(hx + 5, 0); ctx.lineTo(hx, 7);
    ctx.fill();
  }
  // Committed offset: the left edge, a bright bar.
  if (p.committed >= 0) {
    ctx.fillStyle = C.commit;
    ctx.fillRect(x(p.committed) - 3, 2, 3, h - 4);
  }

  row.el.classList.toggle("held", held);
  row.state.textContent = held ? "held" : p.paused ? "paused" : p.stuck ? "stuck" : "";
  const committed = p.committed >= 0 ? o(p.committed) : "–";
  row.line1.innerHTML =
    `<span class="safe">safe <b>${o(p.safe)}</b></span> · committed <b>${committed}</b> · end <b>${p.hwm >= 0 ? o(p.hwm) : "–"}</b>`;
  const head = held
    ? `<span class="headline">head @${o(p.oldest_unfinished)} ${p.oldest_age_s.toFixed(1)}s</span>`
    : `<span class="calm">${n(p.in_flight)} in flight</span>`;
  row.line2.innerHTML =
    `<span class="blk"><b>${n(p.blocked)}</b> blocked</span> · <span class="unf"><b>${n(p.unfinished)}</b> unfinished</span> · ${head}`;

  drawSpark(row);
}

function drawSpark(row) {
  const { ctx, w, h } = fit(row.spark);
  ctx.clearRect(0, 0, w, h);
  ctx.strokeStyle = C.line;
  ctx.lineWidth = 1;
  ctx.beginPath();
  ctx.moveTo(0, h - 0.5); ctx.lineTo(w, h - 0.5);
  ctx.stroke();
  const hist = row.history;
  if (hist.length < 2) return;
  const max = Math.max(10, ...hist);
  const step = w / (HISTORY - 1);
  const x0 = w - (hist.length - 1) * step;
  const top = 13; // below the label
  const y = (v) => h - 1 - (v / max) * (h - 1 - top);
  ctx.beginPath();
  ctx.moveTo(x0, h);
  hist.forEach((v, i) => ctx.lineTo(x0 + i * step, y(v)));
  ctx.lineTo(x0 + (hist.length - 1) * step, h);
  ctx.closePath();
  ctx.fillStyle = "rgba(59,142,234,.28)";
  ctx.fill();
  ctx.beginPath();
  hist.forEach((v, i) => {
    const px = x0 + i * step, py = y(v);
    if (i === 0) ctx.moveTo(px, py); else ctx.lineTo(px, py);
  });
  ctx.strokeStyle = C.blocked;
  ctx.lineWidth = 1.5;
  ctx.stroke();
  ctx.fillStyle = C.muted;
  ctx.font = "10px ui-monospace, monospace";
  ctx.textAlign = "left";
  ctx.fillText("max " + n(max), 0, 9);
}

function roundRect(ctx, x, y, w, h, r) {
  ctx.beginPath();
  ctx.moveTo(x + r, y);
  ctx.arcTo(x + w, y, x + w, y + h, r);
  ctx.arcTo(x + w, y + h, x, y + h, r);
  ctx.arcTo(x, y + h, x, y, r);
  ctx.arcTo(x, y, x + w, y, r);
  ctx.closePath();
}

function esc(s) {
  return String(s).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
}

poll();
