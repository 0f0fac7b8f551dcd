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
  // ``reason`` (typed into the confirm dialog) goes to the audit log via X-Audit-Reason.
  async function post(url, body, reason) {
    const headers = { "Content-Type": "application/json", "X-CSRFToken": csrf() };
    if (reason) headers["X-Audit-Reason"] = encodeURIComponent(reason);
    const res = await fetch(url, {
      method: "POST", credentials: "same-origin", headers,
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
  function plural(n, one, many) { return `${Number(n).toLocaleString("en-US")} ${n === 1 ? one : (many || one + "s")}`; }
  function level(x, warn, bad) { return x >= bad ? "bad" : x >= warn ? "warn" : "good"; }

  // ------------------------------------------------------------------ times and ids
  // "3 s ago" with the exact UTC time on hover, kept current once a second.
  function relative(seconds) {
    const future = seconds < 0, s = Math.abs(seconds);
    const day = 86400;
    const text = s < 90 ? Math.round(s) + " s" : s < 5400 ? Math.round(s / 60) + " min" : s < 129600 ? Math.round(s / 3600) + " h"
      : s < 45 * day ? Math.round(s / day) + " d" : s < 365 * day ? Math.round(s / (30.44 * day)) + " mo"
      : (s / (365.25 * day)).toFixed(1).replace(/\.0$/, "") + " y";
    return future ? "in " + text : text + " ago";
  }
  function exact(iso) { return new Date(iso).toISOString().replace("T", " ").replace(/\.\d+Z$/, " UTC").replace(/Z$/, " UTC"); }
  function ago(iso) {
    if (!iso) return document.createTextNode("—");
    return el("time", { cls: "ago", datetime: iso, title: exact(iso), text: relative((Date.now() - Date.parse(iso)) / 1000) });
  }
  function tickTimes() {
    // time.ago: drawn here or by |ago; time[data-rel]: the Rollouts templates.
    for (const t of document.querySelectorAll("time.ago[datetime], time[data-rel][datetime]")) {
      const at = Date.parse(t.getAttribute("datetime"));
      if (!Number.isNaN(at)) t.textContent = relative((Date.now() - at) / 1000);
    }
  }
  setInterval(tickTimes, 1000);
  function shorten(id, keep) { keep = keep || 22; return id.length <= keep ? id : id.slice(0, keep - 7) + "…" + id.slice(-6); }
  // A long id shortened (full on hover) with a copy button; linked to link + id if given
  // ("{}" in link marks where the id goes, e.g. "/runs/job/{}/").
  function shortId(id, link) {
    if (!id) return document.createTextNode("—");
    const code = el("code", { text: shorten(String(id)) });
    return el("span", { cls: "id", title: String(id) }, [
      link ? el("a", { href: link.includes("{}") ? link.replace("{}", encodeURIComponent(id)) : link + encodeURIComponent(id), cls: link.startsWith("/runs/job/") ? "run-link" : null }, [code]) : code,
      el("button", { type: "button", cls: "copy", "data-copy": String(id), "aria-label": "copy " + id, text: "copy" })]);
  }
  document.addEventListener("click", async (e) => {
    const b = e.target.closest && e.target.closest("button.copy[data-copy]");
    if (!b) return;
    e.preventDefault();
    try { await navigator.clipboard.writeText(b.dataset.copy); b.textContent = "copied"; }
    catch (err) { window.getSelection().selectAllChildren(b.previousElementSibling || b); b.textContent = "select+copy"; }
    setTimeout(() => { b.textContent = "copy"; }, 1500);
  });

  // ------------------------------------------------------------------ confirm dialog
  // templates/_confirm.html documents the contract: ONE dialog per page, for the JSON
  // actions (confirmAction: ``run(reason)`` does the action, its error shows in the
  // dialog) and for the Rollouts form posts (openConfirm: the dialog's form is posted).
  function fillConfirm(o) {
    const dlg = $("confirm-dialog");
    if (!dlg || typeof dlg.showModal !== "function") return null;
    $("confirm-title").textContent = o.title;
    $("confirm-what").textContent = o.what;
    const ok = $("confirm-ok");
    ok.textContent = o.verb || o.title;
    ok.className = o.danger ? "danger" : "";
    ok.disabled = false;
    $("confirm-form").action = o.action || "";
    $("confirm-percent-row").hidden = !o.percent;
    $("confirm-percent").required = !!o.percent;
    $("confirm-percent").value = "";
    $("confirm-reason").value = o.reason || "";
    $("confirm-next").value = location.pathname;
    const err = $("confirm-error");
    err.hidden = true; err.textContent = "";
    dlg.dataset.mode = o.mode;
    dlg.dataset.verb = o.dataVerb || "";
    return dlg;
  }
  function showConfirm(dlg, o) {
    dlg.showModal();
    (o.percent ? $("confirm-percent") : o.danger ? $("confirm-cancel") : $("confirm-reason")).focus();
  }
  function confirmAction(opts) {
    const dlg = fillConfirm({ ...opts, mode: "json" });
    if (!dlg) return Promise.resolve(false);
    const ok = $("confirm-ok"), reason = $("confirm-reason"), err = $("confirm-error");
    return new Promise((resolve) => {
      const done = (value) => { cleanup(); if (dlg.open) dlg.close(); resolve(value); };
      const onSubmit = async (e) => {
        e.preventDefault();
        ok.disabled = true;
        try { const r = await opts.run(reason.value.trim()); done(r === undefined ? true : r); }
        catch (ex) { err.textContent = ex.message; err.hidden = false; ok.disabled = false; }
      };
      const onClose = () => { cleanup(); resolve(false); };
      function cleanup() {
        $("confirm-form").removeEventListener("submit", onSubmit);
        dlg.removeEventListener("close", onClose);
      }
      $("confirm-form").addEventListener("submit", onSubmit);
      dlg.addEventListener("close", onClose);
      showConfirm(dlg, opts);
    });
  }
  // Cancel (and Esc, natively) closes whichever use of the dialog is open.
  document.addEventListener("click", (e) => {
    if (e.target instanceof Element && e.target.id === "confirm-cancel") $("confirm-dialog").close("cancel");
  });
  window.gitward = { confirmAction, post };
  // Declarative buttons: data-confirm-url, -body (JSON), -title, -what, -danger.
  document.addEventListener("click", async (e) => {
    const b = e.target.closest && e.target.closest("button[data-confirm-url]");
    if (!b) return;
    e.preventDefault();
    const body = b.dataset.confirmBody ? JSON.parse(b.dataset.confirmBody) : {};
    const label = b.textContent;
    const result = await confirmAction({
      title: b.dataset.confirmTitle || label, what: b.dataset.confirmWhat || label,
      danger: b.dataset.confirmDanger === "1",
      run: (reason) => post(b.dataset.confirmUrl, body, reason),
    });
    if (!result) return;
    b.disabled = true;
    b.textContent = result.moved !== undefined ? `${label}: ${result.moved} moved` : `${label}: started`;
    if (result && result.id) renderAction(result);
    b.dispatchEvent(new CustomEvent("gitward:done", { bubbles: true, detail: result }));
    refreshSoon();
  });

  // ------------------------------------------------------------------ socket
  const socketPath = document.body.dataset.liveSocket || "";
  const onRepoPage = /^\/ws\/repos\/\d+\//.test(socketPath), onRepoList = socketPath === "/ws/repos/";
  let ws = null;
  let retryMs = 500;
  let snapshotTimer = null;
  let retryTimer = null;
  let snapshots = 0;  // how many this page got: the first one is the state it was rendered in
  const state = { locks: new Map(), snapshot: null, repo: null, feed: [] };

  function setDot(mode) {
    const dot = $("live-dot"), label = $("live-state");
    if (dot) { dot.className = "dot " + mode; dot.title = mode; }
    if (label) label.textContent = mode;
  }
  function connect() {
    if (!socketPath || document.hidden) return;
    if (ws && ws.readyState <= WebSocket.OPEN) return;  // connecting or open already
    clearTimeout(retryTimer);
    const scheme = location.protocol === "https:" ? "wss://" : "ws://";
    const sock = new WebSocket(scheme + location.host + socketPath);
    ws = sock;
    sock.onopen = () => { retryMs = 500; setDot("live"); };
    sock.onmessage = (msg) => {
      const data = JSON.parse(msg.data);
      if (data.type === "snapshot") { snapshots += 1; onSnapshot(data.data); }
      else if (data.type === "events") {
        data.events.forEach(onEvent);
        if (data.dropped) refreshSoon();  // we missed some: resync from a snapshot
      }
    };
    sock.onclose = (ev) => {
      if (sock !== ws) return;  // a socket we let go on purpose (tab hidden)
      if (ev.code === 4401 || ev.code === 4403 || ev.code === 4404) { setDot("refused"); return; }
      setDot("reconnecting");
      retryTimer = setTimeout(connect, retryMs);
      retryMs = Math.min(retryMs * 2, 10000);
    };
  }
  // A hidden tab lets its socket go (no events to a page nobody sees); shown again it
  // connects, and the snapshot every connect begins with catches the page up.
  document.addEventListener("visibilitychange", () => {
    if (!socketPath) return;
    if (document.hidden) {
      clearTimeout(retryTimer);
      const sock = ws; ws = null;
      if (sock) sock.close(1000, "hidden");
      setDot("paused");
    } else {
      setDot("reconnecting");
      connect();
    }
  });
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
    // A reconnect or a tab shown again: catch up. And a page the server reused from an
    // earlier render (body data-reused, dashboard/web/page_cache.py): it may predate an event
    // sent before this socket joined, so its regions are fetched afresh once.
    if (snapshots > 1 || (snapshots === 1 && document.body.dataset.reused === "1")) swapAllRegions();
    if (onRepoPage && $("analytics-results")) { onAnalyticsSnapshot(data); return; }
    if (onRepoPage) { renderRepo(data); return; }
    if (onRepoList) return;
    if (socketPath.startsWith("/ws/rollouts/")) { onRolloutsSnapshot(data); return; }
    state.snapshot = data;
    if (data.activity) { state.feed = data.activity.slice(0, FEED_MAX); renderFeed(); }
    const now = performance.now();
    state.locks = new Map(data.locks.map((l) => [l.key, { ...l, expiresAt: now + l.ttl_ms }]));
    renderOps(data);
    renderLocks();
  }

  function onEvent(ev) {
    const t = ev.type;
    if (onRepoPage) { onRepoEvent(ev); return; }
    if (socketPath.startsWith("/ws/rollouts/")) { onRolloutEvent(ev); return; }
    onRegionEvent(ev);
    if (onRepoList) return;
    if (isActivity(ev)) { state.feed.unshift(ev); state.feed.length = Math.min(state.feed.length, FEED_MAX); renderFeed(); }
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
      if (cell) { cell.dataset.at = ev.last_seen; cell.replaceChildren(ago(ev.last_seen)); } else refreshSoon();
    } else if (t === "action.progress") {
      renderAction(ev);
      if (ev.state === "done") refreshSoon();
    } else {
      refreshSoon();
    }
  }

  // ------------------------------------------------------------------ recent activity
  // The overview's feed (dashboard/infra/activity_feed.py keeps the list): seeded from the page's
  // snapshot, then every event worth a line is prepended, newest first; the select
  // filters by kind. Every value is text (textContent), links are built from ids.
  const FEED_MAX = 100;
  const TICKS = new Set(["job.progress", "lock.extended", "worker.heartbeat", "fetch.changed"]);
  function isActivity(ev) {
    if (TICKS.has(ev.type)) return false;
    return ev.type !== "action.progress" || ev.state !== "running";
  }
  // Events of a repository carry its name (``repo_name``; ``name`` and the redacted ``url``
  // on repo.changed): the link shows it, "repository #id" only for an event without one.
  function repoLink(id, name, url) { return id ? el("a", { href: `/repos/${encodeURIComponent(id)}/`, text: name || `repository #${id}`, title: url || null }) : "?"; }
  function describe(ev) {
    const [family, what] = String(ev.type).split(".", 2);
    if (family === "job" && !ev.run) return [`queue ${ev.queue} ${ev.paused ? "paused" : "resumed"}`];
    if (family === "job") {
      const verb = { queued: "queued", started: "started", succeeded: "succeeded", failed: "failed (will retry)", dead: "dead (dead letters)", deferred: "deferred (lock busy)" }[what] || what;
      return [el("a", { href: `/runs/${encodeURIComponent(ev.run)}/`, text: `${ev.kind || "job"} run #${ev.run}` }), ` ${verb}`,
        ev.attempt ? `, attempt ${ev.attempt}` : "", ev.repo ? " · " : "", ev.repo ? repoLink(ev.repo, ev.repo_name) : null];
    }
    if (family === "lock") {
      const res = [ev.repo ? repoLink(ev.repo, ev.repo_name) : null, ev.repo ? " · " : "", ev.what || ev.key];
      if (what === "acquired") return ["lock taken on ", ...res, " by ", ev.worker || "?", ev.token ? `, token ${ev.token}` : ""];
      if (what === "lost") return ["lock lost: ", ...res, ev.job ? ` (job ${shorten(ev.job)})` : ""];
      return [ev.forced ? "lock force-released: " : "lock released: ", ...res, ev.token ? `, token now ${ev.token}` : ""];
    }
    if (family === "repo") return [repoLink(ev.repo, ev.name || ev.url, ev.url), ` is ${ev.status || "changed"}`, ev.error ? `: ${ev.error}` : ""];
    if (family === "dlq") return [el("a", { href: "/dead-letters/", text: "dead letters" }), " changed"];
    if (family === "action") return [`${ev.kind} #${ev.action}: ${ev.done}/${ev.total} ${ev.state}`];
    if (family === "audit") return [el("a", { href: `/audit/?action=${encodeURIComponent(ev.action)}`, text: ev.action }), ` by ${ev.actor} on ${ev.target}`, ev.outcome ? ` — ${ev.outcome}` : "", ev.reason ? ` (reason: ${ev.reason})` : ""];
    if (family === "rollout") return [el("a", { href: ev.rollout ? `/rollouts/${encodeURIComponent(ev.rollout)}/` : "/rollouts/", text: `rollout ${ev.key || ev.rollout || ""}`.trim() }), ` ${ev.rollout_state || ev.version_state || what}`, ev.ramp_percent ? ` ${ev.ramp_percent}%` : ""];
    return [ev.type];
  }
  function renderFeed() {
    const list = $("activity-list");
    if (!list) return;
    const kind = ($("activity-kind") || {}).value || "";
    const rows = state.feed.filter((ev) => !kind || String(ev.type).startsWith(kind + "."));
    list.replaceChildren(...(rows.length ? rows.slice(0, 50).map((ev) => el("li", { "data-type": ev.type, "data-at": ev.at }, [
      ago(new Date(ev.at * 1000).toISOString()), " ", el("span", { cls: "pill kind", text: ev.type }), " ", ...describe(ev)]))
      : [el("li", { cls: "muted empty", text: kind ? `No ${kind} events yet.` : "No activity yet." })]));
  }
  document.addEventListener("change", (e) => { if (e.target instanceof Element && e.target.id === "activity-kind") renderFeed(); });

  // ------------------------------------------------------------------ live regions
  // Server-rendered tables (filtered and paged there) kept live: an event that may
  // change one fetches the page again (at most once a second) and swaps the table in —
  // never while a dialog is open. Same origin, escaped by the server.
  const REGIONS = [
    ["audit-table", (t) => t === "audit.recorded"],
    ["runs-table", (t) => t.startsWith("job.") && t !== "job.progress"],
    ["repo-table", (t) => t === "repo.changed"],
    ["run-live", (t, ev) => t.startsWith("job.") && String(ev.run) === (($("run-live") || {}).dataset || {}).run],
  ];
  // A page's own URL fetched again for a live region: rendered afresh by the server
  // (dashboard/web/page_cache.py reuses whole pages for a second, which may predate the
  // event that asks for this fetch).
  function fetchFresh(url) {
    return fetch(url, { credentials: "same-origin", headers: { "X-Gitward-Fresh": "1" } });
  }
  const regionTimers = new Map();
  function swapSoon(id) {
    if (regionTimers.has(id)) return;
    regionTimers.set(id, setTimeout(async () => {
      try {
        if (dialogOpen()) return;
        const res = await fetchFresh(location.href);
        if (!res.ok) return;
        const doc = new DOMParser().parseFromString(await res.text(), "text/html");
        const fresh = doc.getElementById(id), current = $(id);
        if (fresh && current && !dialogOpen()) { current.replaceWith(document.importNode(fresh, true)); tickTimes(); }
      } catch (err) { /* the next event or snapshot tries again */ }
      finally { setTimeout(() => regionTimers.delete(id), 1000); }
    }, 150));
  }
  function onRegionEvent(ev) {
    for (const [id, wants] of REGIONS) if ($(id) && wants(String(ev.type), ev)) swapSoon(id);
    if (ev.type === "job.progress") progressRow(ev);
  }
  function swapAllRegions() { for (const [id] of REGIONS) if ($(id)) swapSoon(id); }
  // A repository row's progress, straight from the event (no fetch).
  function progressRow(ev) {
    const row = document.querySelector(`#repo-table tr[data-repo-id="${CSS.escape(String(ev.repo))}"]`);
    if (!row || !ev.total) return;
    const pc = Math.min(100, Math.round(1000 * ev.analyzed / ev.total) / 10);
    const cells = row.querySelectorAll("td");
    cells[3].replaceChildren(el("progress", { max: 100, value: pc, "aria-label": "analysed" }), " ", el("span", { cls: "small", text: pc + "%" }));
    cells[4].textContent = `${ev.analyzed} / ${plural(ev.total, "commit")}`;
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
        tools.append(button(verb, `${verb[0].toUpperCase() + verb.slice(1)} queue ${x.name}: ` +
          (x.paused ? `workers take its ${plural(x.backlog, "queued job")} again.` : `workers stop taking its ${plural(x.backlog, "queued job")} within a second; ${plural(x.running, "running job")} finish.`),
          (reason) => post(`/api/queues/${verb}`, { queue: x.name }, reason), !x.paused));
      }
      return el("tr", {}, [
        el("td", {}, [x.name, x.paused ? " " : null, x.paused ? el("span", { cls: "pill warn", text: "⏸ paused" }) : null]),
        el("td", {}, [x.version ? shortId(x.version) : "—", x.current ? el("span", { cls: "pill good", text: "current" }) : null]),
        el("td", {}, x.backlog === null || x.backlog === undefined ? ["—"] : [plural(x.backlog, "job"),
          (x.backlog_host || x.backlog_parked) ? " " : null,
          (x.backlog_host || x.backlog_parked) ? el("span", { cls: "small muted", text: `(${x.backlog_host} on host queues, ${x.backlog_parked} parked)` }) : null]),
        el("td", {}, [x.oldest_age_s === null ? "—" : el("span", { cls: level(x.oldest_age_s, 60, 600), text: x.oldest_age_s + " s" })]),
        td(x.running ?? "—"), td(x.jobs_per_min), td(x.retries),
        el("td", {}, [el("span", { cls: level(x.failure_rate, 0.05, 0.2), text: pct(x.failure_rate) })]), tools]);
    }), "no queues", 9);
    spark("spark-throughput", s.series.throughput, s.series.minutes, "jobs/min");
    spark("spark-backlog", s.series.backlog, s.series.minutes, "queued");
    setText("spark-throughput-total", s.series.throughput.reduce((a, b) => a + b, 0));
    setText("spark-backlog-now", [...s.series.backlog].reverse().find((b) => b !== null) ?? 0);
    setText("dlq-total", s.dlq.dead);
    setText("dlq-groups", plural(s.dlq.group_count, "group"));
    setText("integrity-open", s.integrity || 0);
    replaceRows($("workers-body"), s.workers.map((w) => el("tr", { "data-worker": w.name, id: "worker-" + w.name, cls: w.dead ? "stale" : null }, [
      td(w.name, "path"), td(`${w.host} · ${w.pid}`), el("td", {}, [w.version ? shortId(w.version) : "—"]),
      el("td", {}, [w.dead ? el("span", { cls: "bad", text: "✕ gone" }) : w.state]), td(w.rss_mb ? w.rss_mb + " MB" : "—"),
      el("td", {}, w.job ? [shortId(w.job, "/runs/job/{}/"), ` (${elapsed(w.job_started_at)})`] : ["—"]),
      el("td", { cls: "seen", "data-at": w.last_seen }, [ago(w.last_seen)])])), "No workers have reported.", 7);
    const c = $("contention");
    if (c) for (const cell of c.querySelectorAll("[data-field]")) cell.textContent = s.contention[cell.dataset.field];
    const contended = $("contended");
    if (contended) contended.replaceChildren(...(s.contention.most_contended.length ? s.contention.most_contended.map((r) =>
      el("li", {}, [el("a", { href: `/repos/${r.repo}/`, text: r.url }), ` — ${r.refusals}`])) : [el("li", { cls: "muted", text: "none" })]));
    renderFetchHosts(s.fetch_hosts);
    renderDlq(s);
    renderIntegrity(s);
    s.actions.forEach(renderAction);
    loadOffers();
  }
  function setText(id, v) { const n = $(id); if (n) n.textContent = String(v); }
  function elapsed(iso) { if (!iso) return ""; const s = Math.max(0, (Date.now() - Date.parse(iso)) / 1000); return s < 120 ? Math.round(s) + " s" : Math.round(s / 60) + " min"; }
  // Redraws a sparkline: its line, its peak label and the per-minute hover titles.
  function spark(id, values, minutes, unit) {
    const svg = $(id); if (!svg) return;
    const nums = values.map((v) => v || 0), peak = Math.max(1, ...nums), step = 240 / Math.max(1, nums.length - 1);
    svg.querySelector("polyline").setAttribute("points", nums.map((n, i) => `${(i * step).toFixed(1)},${(38 - 36 * n / peak).toFixed(1)}`).join(" "));
    setText(id + "-peak", Math.max(0, ...nums));
    const hover = svg.querySelector("g.hover");
    if (hover && minutes) {
      const w = 240 / Math.max(1, values.length), ns = "http://www.w3.org/2000/svg";
      hover.replaceChildren(...values.map((v, i) => {
        const r = document.createElementNS(ns, "rect"), t = document.createElementNS(ns, "title");
        r.setAttribute("x", (i * w).toFixed(1)); r.setAttribute("y", "0"); r.setAttribute("width", w.toFixed(2)); r.setAttribute("height", "40");
        t.textContent = `${(minutes[i] || "").slice(11, 16)} UTC · ${v === null ? "no sample" : v + " " + unit}`;
        r.append(t); return r;
      }));
    }
  }

  function renderLocks() {
    const tbody = $("locks-body");
    if (!tbody) return;
    const canRelease = $("locks-table").dataset.canRelease === "1";
    const rows = [...state.locks.values()].sort((a, b) => a.key.localeCompare(b.key)).map((l) => {
      const resource = el("td", {}, [l.repo ? el("a", { href: `/repos/${l.repo}/`, text: l.repo_name || String(l.repo) }) : null, l.repo ? " · " : "", l.what || l.key]);
      const holder = el("td", {}, [l.worker ? el("a", { href: `/workers/#worker-${encodeURIComponent(l.worker)}`, text: l.worker }) : "?", " · ",
        shortId(l.job, "/runs/job/{}/"), l.stale ? " " : null, l.stale ? el("span", { cls: "pill bad", text: "✕ holder gone" }) : null]);
      const action = el("td");
      if (canRelease) {
        const btn = el("button", { type: "button", cls: "small danger", text: "force release" });
        btn.addEventListener("click", async () => {
          const r = await confirmAction({
            title: "Force release", danger: true,
            what: `Force-release the lock on ${l.repo_name ? l.repo_name + " · " : ""}${l.what || l.key}: it is deleted on ${plural(l.masters, "master")} and its fencing token (${l.token}) is bumped, so the holder (${l.worker || "?"}, job ${l.job || "?"}) can no longer write and its attempt is retried.`,
            run: (reason) => post("/api/locks/release", { key: l.key }, reason),
          });
          if (r) btn.textContent = `released · token ${r.token}`;
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
      if (l) {
        const left = Math.max(0, l.expiresAt - now) / 1000;
        cell.textContent = left.toFixed(1) + " s";
        cell.className = "ttl " + level(-left, -(l.ttl_ms / 2000), -2);  // red under 2 s, amber under half
      }
    }
  }
  setInterval(tickTtl, 200);

  // ------------------------------------------------------------------ dead letters
  // The groups are rendered by the server (filtered and paged there): on a change the
  // page is fetched again and #dlq swapped in, keeping the groups that were open. The
  // first snapshot swaps too, as on the Rollouts pages: the page may predate it (a dead
  // letter written between the render and the socket's join sent its event to nobody,
  // and the unfiltered groups are a shared copy up to the TTL old: docs/live-view.md).
  // A snapshot that comes during a swap is swapped for once that one ends.
  let dlqSwapping = false, dlqLast = null, dlqWanted = null;
  async function renderDlq(s) {
    if (!$("dlq") || !s.dlq.groups) return;
    dlqWanted = JSON.stringify(s.dlq.groups.map((g) => [g.group, g.count])) + s.dlq.dead;
    if (dlqWanted === dlqLast || dlqSwapping) return;
    dlqSwapping = true;
    try {
      while (dlqWanted !== dlqLast) {
        const sig = dlqWanted;
        const res = await fetchFresh(location.href);
        if (!res.ok) return;
        const doc = new DOMParser().parseFromString(await res.text(), "text/html");
        const fresh = doc.getElementById("dlq"), box = $("dlq");
        if (!fresh || !box) return;
        const open = new Set([...box.querySelectorAll("details[open]")].map((d) => d.dataset.group));
        const node = document.importNode(fresh, true);
        for (const d of node.querySelectorAll("details.group")) if (open.has(d.dataset.group)) d.open = true;
        box.replaceWith(node);
        wireGroups(node);
        tickTimes();
        loadOffers();  // the offers beside the groups just drawn
        dlqLast = sig;
      }
    } catch (err) { /* the next snapshot tries again */ }
    finally { dlqSwapping = false; }
  }
  // The integrity group (verification mismatches, docs/analytics.md#verification) is
  // rendered by the server too: #integrity carries the marks it was rendered from
  // ([id, checked_at] of each open mismatch), and a snapshot whose marks differ (a new
  // mismatch, a new pass, a clear) fetches the page again and swaps the section in,
  // keeping the mismatches that were open; one during a swap is swapped for after it.
  let integritySwapping = false, integrityWanted = null;
  async function renderIntegrity(s) {
    if (!$("integrity") || !s.integrity_marks) return;
    integrityWanted = JSON.stringify(s.integrity_marks);
    if (integritySwapping || integrityWanted === $("integrity").dataset.marks) return;
    integritySwapping = true;
    try {
      while ($("integrity") && integrityWanted !== $("integrity").dataset.marks) {
        const sig = integrityWanted;
        if (dialogOpen()) { refreshSoon(); return; }  // never under the operator's eyes
        const res = await fetchFresh(location.href);
        if (!res.ok) return;
        const doc = new DOMParser().parseFromString(await res.text(), "text/html");
        const fresh = doc.getElementById("integrity"), box = $("integrity");
        if (!fresh || !box || dialogOpen()) return;
        const open = new Set([...box.querySelectorAll("details[open]")].map((d) => d.dataset.verification));
        const node = document.importNode(fresh, true);
        for (const d of node.querySelectorAll("details[data-verification]")) if (open.has(d.dataset.verification)) d.open = true;
        box.replaceWith(node);
        // The page may be older than the snapshot (its marks then differ again): the
        // next snapshot swaps once more, rather than this loop refetching at once.
        if (node.dataset.marks !== sig) break;
      }
    } catch (err) { /* the next snapshot tries again */ }
    finally { integritySwapping = false; }
  }
  // The Workers page's Git hosts table, drawn from each snapshot (textContent only).
  function renderFetchHosts(hosts) {
    const body = $("fetch-hosts-body");
    if (!body || hosts === undefined) return;
    if (hosts === null) { replaceRows(body, [], "The queue server does not answer: host limits unknown.", 6); return; }
    replaceRows(body, hosts.map((h) => el("tr", { "data-host": h.host, title: h.text }, [
      td(h.host, "path"), td(`${h.in_use}/${h.limit}`, "fetch-slots"), td(h.waiting, "fetch-waiting"),
      td(h.tokens, "fetch-tokens"), td(h.rate ? `${h.rate}/s, burst ${h.burst}` : null),
      el("td", { cls: "fetch-backoff" }, [h.backoff_text ? el("span", { cls: "bad", text: `until ${h.backoff_text} UTC` }) : "—"])])),
      "No git host fetched under a limit yet.", 6);
  }
  function wireGroups(box) {
    const canRetry = box.dataset.canRetry === "1", canDiscard = box.dataset.canDiscard === "1";
    for (const details of box.querySelectorAll("details.group")) {
      details.addEventListener("toggle", () => { if (details.open) loadGroup(details, details.dataset.group, canRetry, canDiscard); });
      if (details.open) loadGroup(details, details.dataset.group, canRetry, canDiscard);
    }
  }

  // A button that asks in the confirm dialog first; ``danger`` makes it (and the
  // dialog's confirm button) red.
  function button(label, question, action, danger) {
    const b = el("button", { type: "button", cls: danger ? "small danger" : "small", text: label });
    b.addEventListener("click", async (e) => {
      e.preventDefault();
      const r = await confirmAction({ title: label[0].toUpperCase() + label.slice(1), what: question, danger: !!danger, run: action });
      if (!r) return;
      b.disabled = true;
      b.textContent = r.moved !== undefined ? `${label}: ${r.moved} moved` : `${label}: done`;
      if (r.id) renderAction(r);
      refreshSoon();
    });
    return b;
  }
  // The runs of a group, newest first, 50 at a time ("show more" asks for 50 more, up
  // to the API's 500; beyond that the Runs screen searches them all).
  async function loadGroup(details, group, canRetry, canDiscard, limit) {
    limit = limit || 50;
    const box = details.querySelector(".runs");
    if (limit === 50) box.replaceChildren(el("p", { cls: "muted", text: "loading…" }));
    const res = await fetch(`/api/dlq/${encodeURIComponent(group)}?limit=${limit}`, { credentials: "same-origin" });
    if (!res.ok) { box.replaceChildren(el("p", { cls: "muted", text: "no runs" })); return; }
    const data = await res.json();
    box.replaceChildren(...data.runs.map((r) => {
      const head = el("p", {}, [el("a", { href: `/runs/${r.id}/`, text: `run #${r.id}` }), " ", shortId(r.job_id), " · ",
        el("a", { href: `/repos/${r.repository.id}/`, text: r.repository.url }), ` · ${plural(r.attempts, "attempt")} · `, el("span", { cls: "error", text: r.error })]);
      const tools = el("span", { cls: "tools" });
      if (canRetry) tools.append(button("retry", `Retry run #${r.id} (${shorten(r.job_id)}) of ${r.repository.url} with a fresh budget of attempts.`, (reason) => post("/api/dlq/retry", { runs: [r.id] }, reason)));
      if (canDiscard) tools.append(el("span", { cls: "danger-zone" }, [button("discard", `Discard run #${r.id} (${shorten(r.job_id)}) of ${r.repository.url}. It will never be retried.`, (reason) => post("/api/dlq/discard", { runs: [r.id] }, reason), true)]));
      head.append(" ", tools);
      const attempts = el("ol", { cls: "attempts" }, r.history.map((a) => el("li", {}, [
        `${a.outcome} on `, a.worker ? el("a", { href: `/workers/#worker-${encodeURIComponent(a.worker)}`, text: a.worker }) : "?",
        ` (pid ${a.pid ?? "?"}, ${shorten(a.version || "?")}) `, ago(a.started_at), ": ", el("span", { cls: "error", text: a.error }),
        a.traceback ? el("details", {}, [el("summary", { text: "traceback" }), el("pre", { text: a.traceback })]) : null])));
      return el("div", { cls: "run", "data-run": r.id }, [head, attempts]);
    }));
    const total = Number(details.dataset.count || 0);
    if (data.runs.length >= limit && total > limit) {
      const more = el("p", { cls: "pager" }, [`${data.runs.length} of ${plural(total, "run")} shown · `]);
      if (limit < 500) {
        const b = el("button", { type: "button", cls: "small secondary", text: "show 50 more" });
        b.addEventListener("click", () => loadGroup(details, group, canRetry, canDiscard, limit + 50));
        more.append(b, " · ");
      }
      more.append(el("a", { href: "/runs/?state=dead&q=" + encodeURIComponent(details.querySelector("summary").dataset.cause || ""), text: "all in the Runs screen" }));
      box.append(more);
    }
  }
  function renderAction(a) {
    const box = $("actions");
    if (!box) return;
    const id = a.action ?? a.id;
    let row = box.querySelector(`[data-action="${id}"]`);
    if (!row) { row = el("p", { cls: "flash", "data-action": id }); box.append(row); }
    row.replaceChildren(`${a.kind} #${id}: `, el("progress", { max: a.total || 1, value: a.done, "aria-label": `${a.kind} progress` }), ` ${a.done}/${a.total} ${a.state}`);
  }

  // ------------------------------------------------------------------ repository page
  const ACTIVE = new Set(["queued", "syncing", "analyzing"]);
  function renderRepo(r) {
    state.repo = r;
    const bar = $("repo-progress"), text = $("repo-progress-text"), status = $("repo-status"), err = $("repo-error");
    const box = $("repo-state");
    const was = box ? box.dataset.status : null;
    if (bar) bar.value = r.progress;
    if (text) text.textContent = `${r.progress}% · ${r.commits_analyzed} / ${plural(r.commits_total, "commit")}`;
    if (status) { status.textContent = r.status; status.className = "status s-" + r.status; }
    if (err) { err.textContent = r.error || ""; err.hidden = !r.error; }
    // A lock outliving the analysis is being let go as its job exits: say so, so the
    // status ("ready") and the list of holders never contradict each other.
    if (r.holders) $("repo-holders").replaceChildren(...(r.holders.length ? r.holders.map((h) => el("li", { "data-key": h.key }, [
      `${h.what} — `, ACTIVE.has(r.status) ? null : el("span", { cls: "pill warn", text: "releasing" }),
      ACTIVE.has(r.status) ? null : " the analysis ended; the lock is let go as its job exits — ",
      "held by ", el("a", { href: `/workers/#worker-${encodeURIComponent(h.worker || "")}`, text: h.worker || "?" }),
      " (job ", shortId(h.job, "/runs/job/{}/"), `, token ${h.token})`])) : [el("li", { cls: "muted", text: "no locks held" })]));
    if (r.waiting) $("repo-waiting").replaceChildren(...r.waiting.map((w) => el("li", { text: w })));
    if (box) box.dataset.status = r.status;
    if (was && ACTIVE.has(was) && !ACTIVE.has(r.status)) swapResults();
  }
  function onRepoEvent(ev) {
    // An analytics page: any change but a progress tick asks for a snapshot (at most
    // one a second), whose marks say whether the results changed.
    if ($("analytics-results")) { if (ev.type !== "job.progress") refreshSoon(); return; }
    const r = state.repo || {};
    if (ev.type === "job.progress") {
      const total = ev.total || r.commits_total || 0;
      renderRepo({ ...r, commits_analyzed: ev.analyzed, commits_total: total,
        progress: total ? Math.min(100, Math.round(1000 * ev.analyzed / total) / 10) : 0 });
    } else if (ev.type === "repo.changed") {
      renderRepo({ ...r, ...ev });
      if (ev.integrity) swapResults();  // a verification's badge, or results withheld
      refreshSoon();
    } else {
      refreshSoon();  // holders and reasons to wait
    }
  }
  // The results are server-rendered: once the analysis ends, fetch the page again and
  // swap in its results section (same origin, escaped by the server) — no reload.
  async function swapResults() {
    const res = await fetchFresh(location.href);
    if (!res.ok) return;
    const doc = new DOMParser().parseFromString(await res.text(), "text/html");
    const fresh = doc.getElementById("results"), current = $("results");
    if (fresh && current) current.replaceWith(document.importNode(fresh, true));
  }

  // ------------------------------------------------------------------ analytics pages
  // A repository's analyses (hotspots, coupling, ownership, age, authors, a file) are
  // rendered by the server; #analytics-results carries the marks of the results it was
  // rendered from (served fingerprint, head, commits stored, analysis end, verification:
  // dashboard/live/snapshots.py results_marks). A snapshot of the repository's socket
  // with other marks, while it is not being analysed, fetches the page again and swaps
  // the results and the badge/provenance line in: a push analysed, a verification pass,
  // a clear — without a reload. A 400/404/409 page (a bad parameter, results withheld)
  // carries both regions too, so it is swapped like a 200.
  let analyticsSwapping = false, analyticsWanted = null;
  async function onAnalyticsSnapshot(r) {
    if (!r.results_marks || ACTIVE.has(r.status)) return;
    analyticsWanted = r.results_marks;
    if (analyticsSwapping || !$("analytics-results") || analyticsWanted === $("analytics-results").dataset.marks) return;
    analyticsSwapping = true;
    try {
      while ($("analytics-results") && analyticsWanted !== $("analytics-results").dataset.marks) {
        const sig = analyticsWanted;
        const res = await fetchFresh(location.href);
        if (res.status >= 500 || res.redirected) return;
        const doc = new DOMParser().parseFromString(await res.text(), "text/html");
        const fresh = doc.getElementById("analytics-results"), head = doc.getElementById("analytics-status");
        if (!fresh || !$("analytics-results")) return;
        $("analytics-results").replaceWith(document.importNode(fresh, true));
        if (head && $("analytics-status")) $("analytics-status").replaceWith(document.importNode(head, true));
        tickTimes();
        if (fresh.dataset.marks !== sig) break;  // the page is newer: its own event follows
      }
    } catch (err) { /* the next snapshot tries again */ }
    finally { analyticsSwapping = false; }
  }

  // ------------------------------------------------------------------ rollouts
  // The Rollouts pages are server-rendered; every rollout.* event (and the first
  // snapshot, and one that differs from the last, after a reconnect) fetches the page
  // again and swaps its live region in (same origin, escaped by the server) — never
  // while a confirm step is open, so a dialog never changes under the operator's eyes.
  // While a rollout is settling (warming, verified without its diff yet, a request
  // pending), the page is refetched every 2 s too: those changes are written without a
  // rollout.* event.
  let swapTimer = null, swapPending = false, lastRollouts = null;
  // The confirm dialog (templates/_confirm.html) or any other.
  function dialogOpen() { return !!document.querySelector("dialog[open]"); }
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
    const res = await fetchFresh(location.href);
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
  // The first snapshot is newer than the page (rendered, then the socket connected: a
  // change in between sent its event to nobody), so it swaps once too; later ones swap
  // when they differ from the one before.
  function onRolloutsSnapshot(data) {
    const sig = JSON.stringify(data.rollouts);
    if (sig !== lastRollouts) swapRolloutsSoon();
    lastRollouts = sig;
  }
  function onRolloutEvent(ev) {
    if (String(ev.type).startsWith("rollout.")) swapRolloutsSoon();
  }
  setInterval(() => {
    const live = $("rollouts-live");
    if (live && live.dataset.poll) swapRolloutsSoon(0);
  }, 2000);


  // The confirm step of every rollout button (server-rendered or drawn here): the same
  // dialog, in form mode: its form posts the reason (and a percentage) to the button's URL.
  function openConfirm(btn) {
    const o = {
      mode: "form", action: btn.dataset.confirm, title: btn.dataset.title || btn.textContent,
      what: btn.dataset.plan || "", percent: btn.dataset.percent === "1", danger: btn.dataset.danger === "1",
      verb: btn.dataset.title ? `Confirm: ${btn.dataset.title}` : "Confirm", dataVerb: btn.dataset.verb || "",
    };
    const dlg = fillConfirm(o);
    if (dlg) showConfirm(dlg, { ...o, danger: false });
  }
  document.addEventListener("click", (e) => {
    const btn = e.target instanceof Element ? e.target.closest("button[data-confirm]") : null;
    if (btn) { e.preventDefault(); openConfirm(btn); }
  });
  document.addEventListener("close", (e) => {
    if (e.target instanceof HTMLDialogElement && swapPending && !dialogOpen()) { swapPending = false; swapRolloutsSoon(0); }
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
    const o = { mode: "form", title: "Start rollout", what: plan, verb: "Confirm: start rollout", dataVerb: "start", reason: String(f.get("reason") || "") };
    const dlg = fillConfirm(o);
    if (dlg) showConfirm(dlg, o);
  });
  document.addEventListener("submit", (e) => {
    const form = e.target;
    if (!(form instanceof HTMLFormElement) || form.id !== "confirm-form") return;
    const dialog = $("confirm-dialog");
    if (dialog.dataset.mode !== "form" || dialog.dataset.verb !== "start") return;
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
      cells[3].replaceChildren(el("progress", { max: 100, value: r.progress, "aria-label": "analysed" }), " ", el("span", { cls: "small", text: r.progress + "%" }));
      cells[4].textContent = `${r.commits_analyzed} / ${plural(r.commits_total, "commit")}`;
      if (ACTIVE.has(r.status)) setTimeout(() => pollRow(row), 2000);
    } catch (e) { setTimeout(() => pollRow(row), 5000); }
  }

  // Phones stack each table row as "header: value" lines (CSS, max-width 640px): every
  // cell carries its column's header as data-label, for rows drawn now and later.
  function labelCells(root) {
    const sel = "table.grid:not(.timeline)";
    const tables = root.matches && root.matches(sel) ? [root] : root.querySelectorAll ? root.querySelectorAll(sel) : [];
    for (const table of tables) {
      const heads = [...table.querySelectorAll("thead th")].map((th) => th.textContent.trim());
      if (!heads.length) continue;
      for (const row of table.querySelectorAll("tbody tr")) {
        [...row.children].forEach((cell, i) => {
          if (cell.colSpan > 1) return;  // "No locks held.": a message, not a column
          if (heads[i] && cell.dataset.label !== heads[i]) cell.dataset.label = heads[i];
        });
      }
    }
  }
  new MutationObserver((records) => {
    for (const r of records) for (const n of r.addedNodes) if (n.nodeType === 1) labelCells(n.closest("table") || n);
  }).observe(document.documentElement, { childList: true, subtree: true });

  document.addEventListener("DOMContentLoaded", () => {
    labelCells(document);
    const seed = $("activity-seed");  // the feed as the page was rendered (overview)
    if (seed) { try { state.feed = JSON.parse(seed.textContent) || []; } catch (e) { state.feed = []; } renderFeed(); }
    const dlqBox = $("dlq");
    if (dlqBox) wireGroups(dlqBox);
    if (socketPath) connect();
    tickTimes();
    if (!socketPath) {
      for (const row of document.querySelectorAll("#repo-table tr[data-repo-id]")) if (ACTIVE.has(row.dataset.status)) pollRow(row);
    }
  });
})();
