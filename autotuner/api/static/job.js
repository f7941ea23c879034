// A job's page: the Pareto scatter, live progress (polls GET /v1/jobs/{id} every 2 s while
// the job is queued or running, and reloads the results when a trial lands), cancel.
"use strict";

(() => {
  const root = document.getElementById("job");
  const jobId = root.dataset.jobId;
  const jobName = document.title.split(" · ")[0];
  const plot = document.getElementById("pareto-plot");
  const selection = document.getElementById("selection");
  const active = (status) => status === "queued" || status === "running";
  const configUrl = (number, format) =>
    `/v1/jobs/${encodeURIComponent(jobId)}/trials/${number}/config?format=${format}`;

  // ---------------------------------------------------------------- the scatter

  const plotConfig = {
    displaylogo: false, responsive: true,
    modeBarButtonsToRemove: ["lasso2d", "select2d"],
    toImageButtonOptions: { filename: `${jobName}-pareto` },
  };

  function figure() {
    return JSON.parse(document.getElementById("figure-data").textContent);
  }

  function draw() {
    const { data, layout } = figure();
    Plotly.react(plot, data, layout, plotConfig);
  }

  function link(text, href, className, download) {
    const a = document.createElement("a");
    a.textContent = text;
    a.href = href;
    a.className = className;
    if (download !== undefined) {
      a.download = download;
      a.dataset.download = "";
    }
    return a;
  }

  function select(number) {
    const row = document.getElementById(`trial-${number}`);
    selection.replaceChildren();
    const title = document.createElement("strong");
    title.textContent = `Trial ${number}`;
    selection.append(title);
    const status = row && row.querySelector(".badge");
    if (status) selection.append(" ", status.cloneNode(true));
    const downloadable = row && row.querySelector("a[data-download]");
    if (downloadable) {
      selection.append(
        " ",
        link("Download verl YAML", configUrl(number, "yaml"), "btn small",
             `${jobName}-trial${number}.yaml`),
        " ",
        link("overrides", configUrl(number, "overrides"), "btn small ghost",
             `${jobName}-trial${number}.overrides`));
    }
    if (row) selection.append(" ", link("show in the table", `#trial-${number}`, "small"));
    selection.hidden = false;
    for (const marked of document.querySelectorAll("tr.selected")) marked.classList.remove("selected");
    if (row) row.classList.add("selected");
  }

  draw();
  plot.on("plotly_click", (event) => {
    const point = event.points && event.points[0];
    if (point && point.customdata !== undefined) select(point.customdata);
  });

  // ---------------------------------------------------------------- live updates

  function setProgress(job) {
    const bar = root.querySelector("[data-progress]");
    bar.setAttribute("aria-valuenow", job.trials_done);
    const fill = bar.firstElementChild;
    fill.style.width = `${job.trials_total ? (100 * job.trials_done / job.trials_total) : 0}%`;
    fill.className = `progress-fill status-${job.status}`;
    root.querySelector("[data-progress-text]").textContent = `${job.trials_done} / ${job.trials_total}`;
    const elapsed = root.querySelector("[data-elapsed]");
    if (elapsed) elapsed.textContent = autotuner.formatDuration(job.elapsed_s) || "—";
    const eta = root.querySelector("[data-eta]");
    if (eta) eta.textContent = autotuner.formatDuration(job.eta_s) || "—";
  }

  // Re-render the parts of the page that depend on the trials, from the server's HTML.
  async function reloadResults() {
    const response = await fetch(location.pathname, { headers: { Accept: "text/html" } });
    if (!response.ok) return false;
    const page = new DOMParser().parseFromString(await response.text(), "text/html");
    const fresh = page.getElementById("job");
    const old = document.getElementById("trials-table");
    const sorted = old && old.dataset.sortKey
      ? { key: old.dataset.sortKey, direction: old.dataset.sortDirection } : null;
    for (const part of root.querySelectorAll("[data-live]")) {
      const replacement = page.getElementById(part.id);
      if (replacement) part.replaceWith(document.importNode(replacement, true));
    }
    for (const key of ["status", "trialsDone", "cancelRequested"]) root.dataset[key] = fresh.dataset[key];
    for (const input of root.querySelectorAll("input[data-token]")) input.value = autotuner.token();
    const table = document.getElementById("trials-table");
    if (table && sorted) autotuner.sortTable(table, sorted.key, sorted.direction);
    draw();
    return true;
  }

  async function poll() {
    let job;
    try {
      const response = await autotuner.api(`/v1/jobs/${encodeURIComponent(jobId)}`);
      if (response.ok) job = await response.json();
    } catch (_) { /* the service restarting: try again */ }
    if (job) {
      setProgress(job);
      const changed = job.status !== root.dataset.status
        || String(job.trials_done) !== root.dataset.trialsDone
        || String(job.cancel_requested) !== root.dataset.cancelRequested;
      if (changed) {
        try {
          await reloadResults();
        } catch (_) { /* next time */ }
      }
    }
    schedule();
  }

  let timer = null;
  function schedule() {
    if (timer === null && active(root.dataset.status)) {
      timer = setTimeout(() => {
        timer = null;
        poll();
      }, 2000);
    }
  }
  schedule();

  // ---------------------------------------------------------------- cancel

  document.addEventListener("click", async (event) => {
    const button = event.target.closest("#cancel-button");
    if (!button) return;
    if (!confirm("Cancel this job? Trials measured so far are kept.")) return;
    const errorBox = document.getElementById("action-error");
    button.disabled = true;
    const response = await autotuner.api(`/v1/jobs/${encodeURIComponent(jobId)}/cancel`,
                                          { method: "POST" });
    if (!response.ok) {
      button.disabled = false;
      autotuner.showError(errorBox, `Not cancelled (${response.status}): ${await autotuner.problem(response)}`);
      return;
    }
    await reloadResults();
    schedule();
  });
})();
