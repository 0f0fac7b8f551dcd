// gitward live view: one websocket per page (operations or one repository), a snapshot
// on every (re)connect, then coalesced events. Everything that comes from repositories
// or workers is inserted with textContent / DOM nodes, never as HTML.
(function () {
  "use strict";

  // ------------------------------------------------------------------ helpers
  // A job id (lock holder, worker's current job) as a link to its run page.
  function runLink(job) { return el("a", { href: `/runs/job/${encodeURIComponent(job)}/`, cls: "run-link", text: job }); }

  function el(tag, attrs, children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "text") node.textContent = String(v);
      else if (k === "cls") node.className = v;
      else if (k.startsWith("data-")) node.setAttribute(k, String(v));
      else node.setAttribute(k, String(v));
    }
    for (const child of children || []) {
      if (child === null || child === undefined) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }
  const $ = (id) => document.getElementById(id);
  function csrf() {
    const m = document.cookie.match(/(?:^|; )csrftoken=([^;]+)/);
    return m ? decodeURIComponent(m[1]) : "";
  }
  async function post(url, body) {
    const res = await fetch(url, {
      method: "POST", credentials: "same-origin",
      headers: { "Content-Type": "application/json", "X-CSRFToken": csrf() },
      body: JSON.stringify(body),
    });
    let data = {};
    try { data = await res.json(); } catch (e) { /* not JSON */ }
    if (!res.ok) throw new Error(data.error || ("HTTP " + res.status));
    return data;
  }
  function replaceRows(tbody, rows, emptyText, cols) {
    if (!tbody) return;
    tbody.replaceChildren(...(rows.length ? rows : [el("tr", { cls: "empty" }, [el("td", { colspan: cols, cls: "muted", text: emptyText })])]));
  }
  function td(text, cls) { return el("td", { text: text === null || text === undefined ? "—" : text, cls }); }
  function pct(x) { return (Math.round(x * 1000) / 10) + "%"; }

  // ------------------------------------------------------------------ socket
  const socketPath = document.body.dataset.liveSocket;
  let ws = null;
  let retryMs = 500;
  let snapshotTimer = null;
  const state = { locks: new Map(), snapshot: null, repo: null };

  function setDot(mode) {
    const dot = $("live-dot"), label = $("live-state");
    if (dot) { dot.className = "dot " + mode; dot.title = mode; }
    if (label) label.textContent = mode;
  }
  function connect() {
    if (!socketPath) return;
    const scheme = location.protocol === "https:" ? "wss://" : "ws://";
    ws = new WebSocket(scheme + location.host + socketPath);
    ws.onopen = () => { retryMs = 500; setDot("live"); };
    ws.onmessage = (msg) => {
      const data = JSON.parse(msg.data);
      if (data.type === "snapshot") onSnapshot(data.data);
      else if (data.type === "events") {
        data.events.forEach(onEvent);
        if (data.dropped) refreshSoon();  // we missed some: resync from a snapshot
      }
    };
    ws.onclose = (ev) => {
      if (ev.code === 4401 || ev.code === 4403 || ev.code === 4404) { setDot("refused"); return; }
      setDot("reconnecting");
      setTimeout(connect, retryMs);
      retryMs = Math.min(retryMs * 2, 10000);
    };
  }
  // Aggregates (queue rates, DLQ groups, workers) come from snapshots, asked for at most
  // once a second while events arrive; locks and progress are applied event by event.
  function refreshSoon() {
    if (snapshotTimer) return;
    snapshotTimer = setTimeout(() => {
      snapshotTimer = null;
      if (ws && ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify({ type: "snapshot" }));
    }, 1000);
  }

  function onSnapshot(data) {
    if (socketPath.startsWith("/ws/repos/")) { renderRepo(data); return; }
    if (socketPath.startsWith("/ws/rollouts/")) { onRolloutsSnapshot(data); return; }
    state.snapshot = data;
    const now = performance.now();
    state.locks = new Map(data.locks.map((l) => [l.key, { ...l, expiresAt: now + l.ttl_ms }]));
    renderOps(data);
    renderLocks();
  }

  function onEvent(ev) {
    const t = ev.type;
    if (socketPath.startsWith("/ws/repos/")) { onRepoEvent(ev); return; }
    if (socketPath.startsWith("/ws/rollouts/")) { onRolloutEvent(ev); return; }
    if (t === "lock.acquired") {
      state.locks.set(ev.key, { ...ev, expiresAt: performance.now() + ev.ttl_ms });
      renderLocks();
    } else if (t === "lock.extended") {
      const row = state.locks.get(ev.key);
      if (row) { row.extensions = ev.extensions; row.ttl_ms = ev.ttl_ms; row.expiresAt = performance.now() + ev.ttl_ms; renderLocks(); }
      else refreshSoon();
    } else if (t === "lock.released" || t === "lock.lost") {
      state.locks.delete(ev.key);
      renderLocks();
    } else if (t === "worker.heartbeat") {
      const cell = document.querySelector(`#workers-body tr[data-worker="${CSS.escape(ev.worker)}"] .seen`);
      if (cell) cell.textContent = ev.last_seen; else refreshSoon();
    } else if (t === "action.progress") {
      renderAction(ev);
      if (ev.state === "done") refreshSoon();
    } else {
      refreshSoon();
    }
  }

  // ------------------------------------------------------------------ ops page
  function renderOps(s) {
    const q = s.quorum;
    const banner = $("quorum-banner");
    if (banner) {
      banner.replaceChildren();
      const qs = s.queue_server;
      if (qs && !qs.ok) banner.append(el("p", { cls: "banner bad", id: "queue-server-banner", text: `${qs.error}: submissions are accepted and enqueued when it returns; queue counts and live updates are paused` }));
      if (q.state === "lost") banner.append(el("p", { cls: "banner bad", text: `no quorum: ${q.up}/${q.total} masters up — no lock can be taken, work waits` }));
      else if (q.state === "at_risk") banner.append(el("p", { cls: "banner warn", text: `quorum at risk: ${q.up}/${q.total} masters` }));
    }
    const pill = $("quorum");
    if (pill) { pill.textContent = `quorum ${q.up}/${q.total}`; pill.className = "pill " + (q.state === "ok" ? "good" : q.state === "at_risk" ? "warn" : "bad"); }
    replaceRows($("nodes-body"), s.redis_nodes.map((n) => el("tr", {}, [
      td(n.url), el("td", {}, [el("span", { cls: n.up ? "good" : "bad", text: n.up ? "up" : `down (${n.error})` })]),
      td(n.up ? n.latency_ms + " ms" : "—")])), "no masters", 3);
    const canPause = $("queues-table") && $("queues-table").dataset.canPause === "1";
    replaceRows($("queues-body"), s.queues.map((x) => {
      const tools = el("td");
      if (canPause) {
        const verb = x.paused ? "resume" : "pause";
        tools.append(button(verb, `${verb[0].toUpperCase() + verb.slice(1)} queue ${x.name}? ` +
          (x.paused ? "Workers take its jobs again." : "Workers stop taking its jobs within a second; running jobs finish."),
          () => post(`/api/queues/${verb}`, { queue: x.name })));
      }
      return el("tr", {}, [
        el("td", {}, [x.name, x.paused ? el("span", { cls: "pill warn", text: "paused" }) : null]),
        el("td", {}, [x.version || "—", x.current ? el("span", { cls: "pill good", text: "current" }) : null]),
        td(x.backlog ?? "—"), td(x.oldest_age_s === null ? "—" : x.oldest_age_s + "s"), td(x.running ?? "—"),
        td(x.jobs_per_min), td(x.retries), td(pct(x.failure_rate)), tools]);
    }), "no queues", 9);
    spark("spark-throughput", s.series.throughput);
    spark("spark-backlog", s.series.backlog);
    setText("spark-throughput-total", s.series.throughput.reduce((a, b) => a + b, 0));
    setText("spark-backlog-now", [...s.series.backlog].reverse().find((b) => b !== null) ?? 0);
    setText("dlq-total", s.dlq.dead);
    setText("dlq-groups", s.dlq.group_count);
    replaceRows($("workers-body"), s.workers.map((w) => el("tr", { "data-worker": w.name, cls: w.dead ? "stale" : null }, [
      td(w.name), td(w.host), td(w.pid), td(w.version), td(w.state), td(w.rss_mb ? w.rss_mb + " MB" : "—"),
      el("td", {}, w.job ? [runLink(w.job), ` (${elapsed(w.job_started_at)})`] : ["—"]), el("td", { cls: "seen", text: w.last_seen })])), "No workers have reported.", 8);
    const c = $("contention");
    if (c) for (const cell of c.querySelectorAll("[data-field]")) cell.textContent = s.contention[cell.dataset.field];
    const contended = $("contended");
    if (contended) contended.replaceChildren(...(s.contention.most_contended.length ? s.contention.most_contended.map((r) =>
      el("li", {}, [el("a", { href: `/repos/${r.repo}/`, text: r.url }), ` — ${r.refusals}`])) : [el("li", { cls: "muted", text: "none" })]));
    renderDlq(s);
    s.actions.forEach(renderAction);
    loadOffers();
  }
  function setText(id, v) { const n = $(id); if (n) n.textContent = String(v); }
  function elapsed(iso) { if (!iso) return ""; const s = Math.max(0, (Date.now() - Date.parse(iso)) / 1000); return s < 120 ? Math.round(s) + "s" : Math.round(s / 60) + "m"; }
  function spark(id, values) {
    const svg = $(id); if (!svg) return;
    const nums = values.map((v) => v || 0), peak = Math.max(1, ...nums), step = 240 / Math.max(1, nums.length - 1);
    svg.querySelector("polyline").setAttribute("points", nums.map((n, i) => `${(i * step).toFixed(1)},${(38 - 36 * n / peak).toFixed(1)}`).join(" "));
  }

  function renderLocks() {
    const tbody = $("locks-body");
    if (!tbody) return;
    const canRelease = $("locks-table").dataset.canRelease === "1";
    const rows = [...state.locks.values()].sort((a, b) => a.key.localeCompare(b.key)).map((l) => {
      const resource = el("td", {}, [l.repo ? el("a", { href: `/repos/${l.repo}/`, text: l.repo_name || String(l.repo) }) : null, l.repo ? " · " : "", l.what || l.key]);
      const holder = el("td", {}, [`${l.worker || "?"} · `, l.job ? runLink(l.job) : "?", l.stale ? el("span", { cls: "pill bad", text: "holder gone" }) : null]);
      const action = el("td");
      if (canRelease) {
        const btn = el("button", { cls: "small danger", text: "force release" });
        btn.addEventListener("click", async () => {
          if (!confirm(`Force-release ${l.key}?\n\nThe lock is deleted on every master and its fencing token is bumped, so the holder (${l.worker}, job ${l.job}) can no longer write.`)) return;
          try { const r = await post("/api/locks/release", { key: l.key }); btn.textContent = `released · token ${r.token}`; }
          catch (e) { alert(e.message); }
        });
        action.append(btn);
      }
      return el("tr", { "data-key": l.key, cls: l.stale ? "stale" : null }, [
        resource, holder, el("td", { cls: "token", text: l.token ?? "—" }), td(`${l.agreeing}/${l.masters}`),
        el("td", { cls: "ttl", "data-key": l.key, text: "" }), td(l.extensions ?? 0), action]);
    });
    replaceRows(tbody, rows, "No locks held.", 7);
    tickTtl();
  }
  function tickTtl() {
    const now = performance.now();
    for (const cell of document.querySelectorAll("#locks-body td.ttl")) {
      const l = state.locks.get(cell.dataset.key);
      if (l) cell.textContent = (Math.max(0, l.expiresAt - now) / 1000).toFixed(1) + "s";
    }
  }
  setInterval(tickTtl, 200);

  // ------------------------------------------------------------------ dead letters
  function renderDlq(s) {
    const body = $("dlq-body");
    if (!body || !s.dlq.groups) return;
    const open = new Set([...body.querySelectorAll("details[open]")].map((d) => d.dataset.group));
    const box = $("dlq");
    const canRetry = box.dataset.canRetry === "1", canDiscard = box.dataset.canDiscard === "1";
    if (!s.dlq.groups.length) { body.replaceChildren(el("p", { cls: "muted empty", text: "The dead-letter queue is empty." })); return; }
    body.replaceChildren(...s.dlq.groups.map((g) => {
      const summary = el("summary", {}, [el("strong", { text: g.count }), ` · ${g.cause} `,
        el("span", { cls: "muted small", text: `· ${g.repositories} repos · ${g.versions} versions · first ${g.first_seen} · last ${g.last_seen}` })]);
      const details = el("details", { cls: "group", "data-group": g.group }, [summary, el("div", { cls: "runs" })]);
      const tools = el("p", { cls: "tools" });
      if (canRetry) tools.append(button("retry group", `Retry all ${g.count} runs of “${g.cause}”? Each gets a fresh budget of attempts.`, () => post("/api/dlq/retry", { group: g.group })));
      if (canDiscard) tools.append(button("discard group", `Discard all ${g.count} runs of “${g.cause}”? They will not be retried.`, () => post("/api/dlq/discard", { group: g.group })));
      details.querySelector(".runs").before(tools);
      details.addEventListener("toggle", () => { if (details.open) loadGroup(details, g.group, canRetry, canDiscard); });
      if (open.has(g.group)) { details.open = true; }
      return details;
    }));
    applyDlqFilter();
  }
  // Filters the groups shown (cause text, and the loaded runs' repositories and errors).
  function applyDlqFilter() {
    const box = $("dlq-filter");
    if (!box) return;
    const needle = box.value.trim().toLowerCase();
    for (const d of document.querySelectorAll("#dlq-body details.group")) {
      d.hidden = needle !== "" && !d.textContent.toLowerCase().includes(needle);
    }
  }
  document.addEventListener("input", (e) => { if (e.target && e.target.id === "dlq-filter") applyDlqFilter(); });

  function button(label, question, action) {
    const b = el("button", { cls: "small", text: label });
    b.addEventListener("click", async (e) => {
      e.preventDefault();
      if (!confirm(question)) return;
      b.disabled = true;
      try { const r = await action(); b.textContent = r.moved !== undefined ? `${label}: ${r.moved} moved` : `${label}: started`; if (r.id) renderAction(r); }
      catch (err) { b.textContent = `${label}: ${err.message}`; }
      refreshSoon();
    });
    return b;
  }
  async function loadGroup(details, group, canRetry, canDiscard) {
    const box = details.querySelector(".runs");
    box.replaceChildren(el("p", { cls: "muted", text: "loading…" }));
    const res = await fetch(`/api/dlq/${encodeURIComponent(group)}`, { credentials: "same-origin" });
    if (!res.ok) { box.replaceChildren(el("p", { cls: "muted", text: "no runs" })); return; }
    const data = await res.json();
    box.replaceChildren(...data.runs.map((r) => {
      const head = el("p", {}, [el("a", { href: `/runs/${r.id}/` }, [el("strong", { text: r.job_id })]), ` · ${r.repository.url} · ${r.attempts} attempts · `, el("span", { cls: "error", text: r.error })]);
      if (canRetry) head.append(" ", button("retry", `Retry run ${r.job_id} with a fresh budget of attempts?`, () => post("/api/dlq/retry", { runs: [r.id] })));
      if (canDiscard) head.append(" ", button("discard", `Discard run ${r.job_id}? It will not be retried.`, () => post("/api/dlq/discard", { runs: [r.id] })));
      const attempts = el("ol", { cls: "attempts" }, r.history.map((a) => el("li", {}, [
        `${a.outcome} on ${a.worker || "?"} (pid ${a.pid ?? "?"}, ${a.version}) at ${a.started_at}: `, el("span", { cls: "error", text: a.error }),
        a.traceback ? el("details", {}, [el("summary", { text: "traceback" }), el("pre", { text: a.traceback })]) : null])));
      return el("div", { cls: "run", "data-run": r.id }, [head, attempts]);
    }));
  }
  function renderAction(a) {
    const box = $("actions");
    if (!box) return;
    const id = a.action ?? a.id;
    let row = box.querySelector(`[data-action="${id}"]`);
    if (!row) { row = el("p", { cls: "flash", "data-action": id }); box.append(row); }
    row.replaceChildren(`${a.kind} #${id}: `, el("progress", { max: a.total || 1, value: a.done }), ` ${a.done}/${a.total} ${a.state}`);
  }

  // ------------------------------------------------------------------ repository page
  const ACTIVE = new Set(["queued", "syncing", "analyzing"]);
  function renderRepo(r) {
    state.repo = r;
    const bar = $("repo-progress"), text = $("repo-progress-text"), status = $("repo-status"), err = $("repo-error");
    const box = $("repo-state");
    const was = box ? box.dataset.status : null;
    if (bar) bar.value = r.progress;
    if (text) text.textContent = `${r.progress}% · ${r.commits_analyzed} / ${r.commits_total} commits`;
    if (status) { status.textContent = r.status; status.className = "status s-" + r.status; }
    if (err) { err.textContent = r.error || ""; err.hidden = !r.error; }
    if (r.holders) $("repo-holders").replaceChildren(...r.holders.map((h) => el("li", { "data-key": h.key, text: `${h.what} — held by ${h.worker} (job ${h.job}, token ${h.token})` })));
    if (r.waiting) $("repo-waiting").replaceChildren(...r.waiting.map((w) => el("li", { text: w })));
    if (box) box.dataset.status = r.status;
    if (was && ACTIVE.has(was) && !ACTIVE.has(r.status)) swapResults();
  }
  function onRepoEvent(ev) {
    const r = state.repo || {};
    if (ev.type === "job.progress") {
      const total = ev.total || r.commits_total || 0;
      renderRepo({ ...r, commits_analyzed: ev.analyzed, commits_total: total,
        progress: total ? Math.min(100, Math.round(1000 * ev.analyzed / total) / 10) : 0 });
    } else if (ev.type === "repo.changed") {
      renderRepo({ ...r, ...ev });
      refreshSoon();
    } else {
      refreshSoon();  // holders and reasons to wait
    }
  }
  // The results are server-rendered: once the analysis ends, fetch the page again and
  // swap in its results section (same origin, escaped by the server) — no reload.
  async function swapResults() {
    const res = await fetch(location.href, { credentials: "same-origin" });
    if (!res.ok) return;
    const doc = new DOMParser().parseFromString(await res.text(), "text/html");
    const fresh = doc.getElementById("results"), current = $("results");
    if (fresh && current) current.replaceWith(document.importNode(fresh, true));
  }

  // ------------------------------------------------------------------ rollouts
  // The Rollouts pages are server-rendered; every rollout.* event (and a snapshot that
  // differs from the page, after a reconnect) fetches the page again and swaps its live
  // region in (same origin, escaped by the server) — never while a confirm step is open,
  // so a dialog never changes under the operator's eyes. While a rollout is settling
  // (warming, verified without its diff yet, a request pending), the page is refetched
  // every 2 s too: those changes are written without a rollout.* event.
  let swapTimer = null, swapPending = false, lastRollouts = null;
  function dialogOpen() { const d = $("confirm-dialog"); return !!(d && d.open); }
  function swapRolloutsSoon(delay) {
    if (!$("rollouts-live")) return;
    if (swapTimer) { swapPending = true; return; }
    swapTimer = setTimeout(async () => {
      try { await swapRollouts(); } finally {
        swapTimer = null;
        if (swapPending) { swapPending = false; swapRolloutsSoon(200); }
      }
    }, delay === undefined ? 150 : delay);
  }
  async function swapRollouts() {
    if (dialogOpen()) { swapPending = true; return; }
    const res = await fetch(location.href, { credentials: "same-origin" });
    if (!res.ok) return;
    const doc = new DOMParser().parseFromString(await res.text(), "text/html");
    const fresh = doc.getElementById("rollouts-live"), current = $("rollouts-live");
    if (!fresh || !current || dialogOpen()) { swapPending = true; return; }
    const open = new Set([...current.querySelectorAll("details[data-key]")].filter((d) => d.open).map((d) => d.dataset.key));
    current.replaceWith(document.importNode(fresh, true));
    for (const d of $("rollouts-live").querySelectorAll("details[data-key]")) if (open.has(d.dataset.key)) d.open = true;
    tickTimes();
    window.dispatchEvent(new CustomEvent("gitward:rollouts-swapped"));
  }
  function onRolloutsSnapshot(data) {
    const sig = JSON.stringify(data.rollouts);
    if (lastRollouts !== null && sig !== lastRollouts) swapRolloutsSoon();
    lastRollouts = sig;
  }
  function onRolloutEvent(ev) {
    if (String(ev.type).startsWith("rollout.")) swapRolloutsSoon();
  }
  setInterval(() => {
    const live = $("rollouts-live");
    if (live && live.dataset.poll) swapRolloutsSoon(0);
  }, 2000);

  // Relative times ("12s ago") from each <time datetime> with data-rel, kept current.
  function ago(iso) {
    const s = Math.max(0, (Date.now() - Date.parse(iso)) / 1000);
    if (s < 60) return Math.round(s) + "s ago";
    if (s < 3600) return Math.round(s / 60) + "m ago";
    if (s < 86400) return Math.round(s / 3600) + "h ago";
    return Math.round(s / 86400) + "d ago";
  }
  function tickTimes() {
    for (const t of document.querySelectorAll("time[data-rel]")) {
      const iso = t.getAttribute("datetime");
      if (iso) t.textContent = ago(iso);
    }
  }
  setInterval(tickTimes, 1000);

  // The confirm step of every rollout button (server-rendered or drawn here): a modal
  // <dialog> naming exactly what will happen, with an optional reason for the audit log.
  function openConfirm(btn) {
    const dialog = $("confirm-dialog");
    if (!dialog) return;
    const form = $("confirm-form");
    form.action = btn.dataset.confirm;
    $("confirm-title").textContent = btn.dataset.title || btn.textContent;
    $("confirm-plan").textContent = btn.dataset.plan || "";
    const needsPercent = btn.dataset.percent === "1";
    $("confirm-percent-row").hidden = !needsPercent;
    $("confirm-percent").required = needsPercent;
    $("confirm-percent").value = "";
    $("confirm-reason").value = "";
    $("confirm-next").value = location.pathname;
    const ok = $("confirm-ok");
    ok.textContent = btn.dataset.title ? `Confirm: ${btn.dataset.title}` : "Confirm";
    ok.className = btn.dataset.danger === "1" ? "danger" : "";
    dialog.dataset.verb = btn.dataset.verb || "";
    dialog.showModal();
    (needsPercent ? $("confirm-percent") : $("confirm-reason")).focus();
  }
  document.addEventListener("click", (e) => {
    const btn = e.target instanceof Element ? e.target.closest("button[data-confirm]") : null;
    if (btn) { e.preventDefault(); openConfirm(btn); return; }
    if (e.target instanceof Element && e.target.id === "confirm-cancel") $("confirm-dialog").close("cancel");
  });
  document.addEventListener("close", (e) => {
    if (e.target && e.target.id === "confirm-dialog" && swapPending) { swapPending = false; swapRolloutsSoon(0); }
  }, true);

  // Starting a rollout: the form's submit opens the same confirm step, naming the config.
  document.addEventListener("submit", (e) => {
    const form = e.target;
    if (!(form instanceof HTMLFormElement) || form.id !== "start-form" || form.dataset.confirmed === "1") return;
    e.preventDefault();
    const f = new FormData(form);
    const paths = String(f.get("exclude_paths") || "").split(/[\n,]/).map((x) => x.trim()).filter(Boolean);
    const config = `detect_renames=${f.get("detect_renames") ? "true" : "false"}, ignore_whitespace=${f.get("ignore_whitespace") ? "true" : "false"}, exclude_paths=[${paths.join(", ")}]`;
    const plan = `start a rollout of ${f.get("queue")} with ${config}: register the version (its own queue ${f.get("queue")}@<fingerprint>), ` +
      `a driver takes locks:queue:${f.get("queue")}:deploy, warms the warm set under the new fingerprint and opens the gate only if the verdict passes; ` +
      `then ramp ${String(f.get("steps") || "").split(/[\s,]+/).filter(Boolean).map((x) => x.replace(/%$/, "") + "%").join(" → ")} ` +
      (f.get("auto") ? "automatically, health-checked between steps." : "when you promote each step.");
    const dialog = $("confirm-dialog");
    $("confirm-title").textContent = "Start rollout";
    $("confirm-plan").textContent = plan;
    $("confirm-percent-row").hidden = true;
    $("confirm-percent").required = false;
    $("confirm-reason").value = String(f.get("reason") || "");
    $("confirm-ok").textContent = "Confirm: start rollout";
    $("confirm-ok").className = "";
    dialog.dataset.verb = "start";
    dialog.showModal();
    $("confirm-reason").focus();
  });
  document.addEventListener("submit", (e) => {
    const form = e.target;
    if (!(form instanceof HTMLFormElement) || form.id !== "confirm-form") return;
    const dialog = $("confirm-dialog");
    if (dialog.dataset.verb !== "start") return;
    e.preventDefault();
    const start = $("start-form");
    start.querySelector("[name=reason]").value = $("confirm-reason").value;
    start.dataset.confirmed = "1";
    dialog.close("ok");
    start.submit();
  });

  // "roll back to V" beside the dead letters (groups whose runs come from a ramping or
  // newly current version) and on the overview (a failing canary): from /rollouts/offers/.
  let offersBusy = false, lastOffers = null;
  async function loadOffers() {
    const dlq = $("dlq"), overview = $("rollback-offers");
    if (!dlq && !overview) return;
    if (lastOffers) applyOffers(lastOffers);  // at once: the groups were just redrawn
    if (offersBusy) return;
    offersBusy = true;
    try {
      const res = await fetch("/rollouts/offers/", { credentials: "same-origin" });
      if (res.ok) { lastOffers = await res.json(); applyOffers(lastOffers); }
    } catch (err) { /* the next snapshot tries again */ }
    finally { offersBusy = false; }
  }
  function applyOffers(data) {
    if ($("dlq")) {
      for (const d of document.querySelectorAll("#dlq-body details.group")) {
        // In the summary: visible (and clickable) while the group is collapsed.
        const summary = d.querySelector("summary");
        const o = data.groups[d.dataset.group];
        const had = summary.querySelector(".offer");
        if (had && o && had.dataset.rollout === String(o.rollout)) continue;
        if (had) had.remove();
        if (!o) continue;
        const box = el("span", { cls: "offer", "data-rollout": o.rollout }, [el("span", { cls: "small bad", text: ` ${o.why} ` })]);
        if (data.can_rollback) box.append(offerButton(o));
        summary.append(box);
      }
    }
    const overview = $("rollback-offers");
    if (overview) {
      overview.replaceChildren(...data.canary.map((o) => el("p", { cls: "banner bad offer", "data-rollout": o.rollout },
        [`${o.from}: ${o.why} `, data.can_rollback ? offerButton(o) : null])));
    }
  }
  function offerButton(o) {
    return el("button", { type: "button", cls: "small danger", "data-confirm": `/rollouts/${o.rollout}/rollback/`,
      "data-verb": "rollback", "data-title": `Roll back to ${o.to}`, "data-plan": o.plan, "data-danger": "1", text: `roll back to ${o.to}` });
  }

  // ------------------------------------------------------------------ plain pages
  // The repository list has no socket: it refreshes the rows of active repositories.
  async function pollRow(row) {
    try {
      const res = await fetch(`/api/repos/${encodeURIComponent(row.dataset.repoId)}`, { credentials: "same-origin" });
      if (!res.ok) return;
      const r = await res.json();
      row.dataset.status = r.status;
      const cells = row.querySelectorAll("td");
      cells[2].replaceChildren(el("span", { cls: "status s-" + r.status, text: r.status }));
      cells[3].replaceChildren(el("progress", { max: 100, value: r.progress }), " ", el("span", { cls: "small", text: r.progress + "%" }));
      cells[4].textContent = `${r.commits_analyzed} / ${r.commits_total}`;
      if (ACTIVE.has(r.status)) setTimeout(() => pollRow(row), 2000);
    } catch (e) { setTimeout(() => pollRow(row), 5000); }
  }

  document.addEventListener("DOMContentLoaded", () => {
    if (socketPath) connect();
    tickTimes();
    if (!socketPath || !socketPath.startsWith("/ws/ops/")) {
      for (const row of document.querySelectorAll("#repo-table tr[data-repo-id]")) if (ACTIVE.has(row.dataset.status)) pollRow(row);
    }
  });
})();
