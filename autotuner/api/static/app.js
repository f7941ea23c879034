// Shared by every page: the API token, calls to the JSON API, its error messages,
// downloads, and sortable tables. No framework, no build step.
"use strict";

const autotuner = (() => {
  const body = document.body;
  const TOKEN_KEY = "autotuner.token";
  const readsNeedToken = body.dataset.readsNeedToken === "true";
  const tokenCookie = body.dataset.tokenCookie;

  function token() {
    return sessionStorage.getItem(TOKEN_KEY) || "";
  }

  // Kept in this tab's sessionStorage; also in a session cookie when the pages themselves
  // need it (a non-loopback service), since a page load cannot send a bearer header.
  function setToken(value) {
    value = value.trim();
    if (value) sessionStorage.setItem(TOKEN_KEY, value);
    else sessionStorage.removeItem(TOKEN_KEY);
    if (readsNeedToken) {
      const secure = location.protocol === "https:" ? "; Secure" : "";
      document.cookie = value
        ? `${tokenCookie}=${encodeURIComponent(value)}; Path=/; SameSite=Strict${secure}`
        : `${tokenCookie}=; Path=/; Max-Age=0; SameSite=Strict${secure}`;
    }
    for (const input of document.querySelectorAll("input[data-token]")) {
      if (input.value !== value) input.value = value;
    }
  }

  function headers(extra) {
    const out = Object.assign({}, extra || {});
    if (token()) out.Authorization = `Bearer ${token()}`;
    return out;
  }

  function api(path, options) {
    options = Object.assign({}, options || {});
    options.headers = headers(options.headers);
    return fetch(path, options);
  }

  // The API's error body in one line, naming each field (as the CLI prints it).
  async function problem(response) {
    let detail;
    try {
      detail = (await response.json()).detail;
    } catch (_) {
      return `${response.status} ${response.statusText}`;
    }
    if (Array.isArray(detail)) {
      return detail.map((item) => {
        let loc = (item.loc || []).map(String);
        if (loc[0] === "body") loc = loc.slice(1);
        return `${loc.join(".") || "(job)"}: ${item.msg}`;
      }).join("\n");
    }
    return String(detail);
  }

  function showError(box, message) {
    box.textContent = message;
    box.hidden = !message;
  }

  // Downloads are plain links; when reads need the token they go through fetch instead.
  document.addEventListener("click", async (event) => {
    const link = event.target.closest("a[data-download]");
    if (!link || !readsNeedToken) return;
    event.preventDefault();
    const response = await api(link.href);
    if (!response.ok) {
      alert(`download failed: ${await problem(response)}`);
      return;
    }
    const url = URL.createObjectURL(await response.blob());
    const a = document.createElement("a");
    a.href = url;
    a.download = link.getAttribute("download") || "";
    document.body.appendChild(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(url), 10000);
  });

  // As the server formats them: 4 significant digits, thousands separated.
  function formatNumber(value) {
    if (value === null || value === undefined) return "";
    if (Math.abs(value) >= 1000) return Math.round(value).toLocaleString("en-US");
    if (Number.isInteger(value)) return String(value);
    return String(Number(value.toPrecision(4)));
  }

  function formatDuration(seconds) {
    if (seconds === null || seconds === undefined) return "";
    seconds = Math.max(0, Math.round(seconds));
    const h = Math.floor(seconds / 3600), m = Math.floor((seconds % 3600) / 60), s = seconds % 60;
    const pad = (n) => String(n).padStart(2, "0");
    if (h) return `${h} h ${pad(m)} min`;
    return m ? `${m} min ${pad(s)} s` : `${s} s`;
  }

  // ---------------------------------------------------------------- sortable tables

  function cellValue(row, index, type) {
    const cell = row.cells[index];
    const raw = cell ? (cell.dataset.sort ?? cell.textContent.trim()) : "";
    if (raw === "") return null;
    if (type === "number") {
      const n = Number(raw);
      return Number.isNaN(n) ? null : n;
    }
    return raw.toLowerCase();
  }

  function sortTable(table, key, direction) {
    const headers = Array.from(table.tHead.rows[0].cells);
    const index = headers.findIndex((th) => th.dataset.key === key);
    if (index < 0) return;
    const type = headers[index].dataset.type;
    const sign = direction === "descending" ? -1 : 1;
    const tbody = table.tBodies[0];
    const rows = Array.from(tbody.rows).map((row, position) => ({
      row, position, value: cellValue(row, index, type),
    }));
    rows.sort((a, b) => {
      if (a.value === null || b.value === null) {  // empty cells last, either way
        if (a.value === b.value) return a.position - b.position;
        return a.value === null ? 1 : -1;
      }
      if (a.value < b.value) return -sign;
      if (a.value > b.value) return sign;
      return a.position - b.position;
    });
    for (const { row } of rows) tbody.appendChild(row);
    for (const th of headers) {
      if (th.dataset.key) th.setAttribute("aria-sort", th.dataset.key === key ? direction : "none");
    }
    table.dataset.sortKey = key;
    table.dataset.sortDirection = direction;
  }

  document.addEventListener("click", (event) => {
    const button = event.target.closest("table.sortable th[data-key] button");
    if (!button) return;
    const th = button.closest("th");
    const table = th.closest("table");
    const current = th.getAttribute("aria-sort");
    // Numbers start high-to-low (the fastest first), text A-to-Z.
    const first = th.dataset.type === "number" && th.dataset.key !== "number"
      ? "descending" : "ascending";
    const next = current === "none" || !current
      ? first : (current === "ascending" ? "descending" : "ascending");
    sortTable(table, th.dataset.key, next);
  });

  // ---------------------------------------------------------------- token fields

  for (const input of document.querySelectorAll("input[data-token]")) {
    input.value = token();
    input.addEventListener("input", () => setToken(input.value));
  }
  const tokenForm = document.getElementById("token-form");
  if (tokenForm) {
    tokenForm.addEventListener("submit", (event) => {
      event.preventDefault();
      setToken(tokenForm.querySelector("input[data-token]").value);
      location.reload();
    });
  }

  return { api, problem, showError, sortTable, token, setToken, formatNumber, formatDuration };
})();
