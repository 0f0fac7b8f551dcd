// Keeps repository progress live while an analysis runs. Everything from repositories
// is inserted with textContent (never innerHTML), so commit data cannot inject markup.
(function () {
  "use strict";
  const ACTIVE = new Set(["queued", "syncing", "analyzing"]);

  function fmt(state) {
    return state.progress + "% · " + state.commits_analyzed + " / " + state.commits_total + " commits";
  }

  async function poll(box) {
    const id = box.dataset.repoId;
    let state;
    try {
      const res = await fetch("/api/repos/" + encodeURIComponent(id), { credentials: "same-origin" });
      if (!res.ok) throw new Error(res.status);
      state = await res.json();
    } catch (e) {
      setTimeout(() => poll(box), 3000);
      return;
    }
    const bar = document.getElementById("repo-progress");
    const text = document.getElementById("repo-progress-text");
    const status = document.getElementById("repo-status");
    const err = document.getElementById("repo-error");
    if (bar) bar.value = state.progress;
    if (text) text.textContent = fmt(state);
    if (status) { status.textContent = state.status; status.className = "status s-" + state.status; }
    if (err) { err.textContent = state.error || ""; err.hidden = !state.error; }
    const was = box.dataset.status;
    box.dataset.status = state.status;
    if (ACTIVE.has(state.status)) {
      setTimeout(() => poll(box), 1000);
    } else if (ACTIVE.has(was) && state.status === "ready") {
      // Results are server-rendered: fetch them once, now that they are complete.
      window.location.reload();
    }
  }

  document.addEventListener("DOMContentLoaded", () => {
    const box = document.getElementById("repo-state");
    if (box && ACTIVE.has(box.dataset.status)) poll(box);
  });
})();
