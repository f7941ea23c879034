// The jobs page: submit a job spec to POST /v1/jobs; keep the listed jobs' progress live.
"use strict";

(() => {
  const form = document.getElementById("submit-form");
  const spec = document.getElementById("spec");
  const errorBox = document.getElementById("submit-error");
  const button = document.getElementById("submit-button");

  function contentType(text) {
    const trimmed = text.trim();
    if (trimmed.startsWith("{")) {
      try {
        JSON.parse(trimmed);
        return "application/json";
      } catch (_) { /* not JSON: let the YAML parser say what is wrong */ }
    }
    return "application/yaml";
  }

  // One Idempotency-Key per submission: sending the same text again after the service could
  // not be reached (the first request may have got through) reuses it, so the service
  // returns the job that request created instead of queueing a second one.
  let pending = null; // {text, key} of a submission that got no answer
  function newKey() {
    const bytes = crypto.getRandomValues(new Uint8Array(16));
    return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
  }

  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    autotuner.showError(errorBox, "");
    button.disabled = true;
    const text = spec.value;
    if (!pending || pending.text !== text) pending = { text, key: newKey() };
    try {
      const response = await autotuner.api("/v1/jobs", {
        method: "POST",
        headers: { "Content-Type": contentType(text), "Idempotency-Key": pending.key },
        body: text,
      });
      pending = null; // answered: the next submission is a new one
      if (response.status === 201 || response.status === 200) {
        const created = await response.json();
        location.assign(`/jobs/${encodeURIComponent(created.id)}`);
        return;
      }
      let message = await autotuner.problem(response);
      if (response.status === 401) message += "\nEnter the service's API token above.";
      autotuner.showError(errorBox, `Not submitted (${response.status}): ${message}`);
    } catch (error) {
      autotuner.showError(errorBox, `Cannot reach the service: ${error}`);
    } finally {
      button.disabled = false;
    }
  });

  // Progress of the listed jobs, while any of them is queued or running.
  const table = document.getElementById("jobs");
  if (!table) return;
  const active = (status) => status === "queued" || status === "running";
  const rows = () => Array.from(table.tBodies[0].rows);

  // As web.py's runs_note: the best throughput's runs.
  function runsNote(best) {
    if (best.throughput_tokens_per_s_per_gpu == null) return "";
    const runs = best.runs;
    if (!runs || runs.runs < 2) return "(1 run)";
    return `(median of ${runs.runs}, spread ${(runs.spread_pct || 0).toFixed(1)}%)`;
  }

  async function refresh() {
    const wanted = new Map(rows().filter((r) => active(r.dataset.status))
      .map((r) => [r.dataset.jobId, r]));
    if (!wanted.size) return false;
    for (const [id, row] of wanted) {
      const response = await autotuner.api(`/v1/jobs/${encodeURIComponent(id)}`);
      if (!response.ok) continue;
      const job = await response.json();
      row.dataset.status = job.status;
      const badge = row.querySelector("[data-status-cell] .badge");
      badge.className = `badge status-${job.status}`;
      badge.textContent = job.status;
      const bar = row.querySelector("[data-progress]");
      bar.setAttribute("aria-valuenow", job.trials_done);
      const fill = bar.firstElementChild;
      fill.style.width = `${job.trials_total ? (100 * job.trials_done / job.trials_total) : 0}%`;
      fill.className = `progress-fill status-${job.status}`;
      row.querySelector("[data-progress-text]").textContent = `${job.trials_done} / ${job.trials_total}`;
      row.querySelector("[data-elapsed]").textContent = autotuner.formatDuration(job.elapsed_s);
      const best = job.best || {};
      row.querySelector("[data-best-throughput]").textContent = autotuner.formatNumber(best.throughput_tokens_per_s_per_gpu);
      row.querySelector("[data-best-runs]").textContent = runsNote(best);
      row.querySelector("[data-best-memory]").textContent = autotuner.formatNumber(best.peak_memory_gib);
    }
    return true;
  }

  async function loop() {
    let again = true;
    try {
      again = await refresh();
    } catch (_) { /* the service restarting: try again later */ }
    if (again) setTimeout(loop, 3000);
  }
  setTimeout(loop, 3000);
})();
