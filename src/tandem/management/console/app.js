// The Tandem web console: plain JavaScript, no build step, no library (decision 0070).
//
// It talks only to the management API (/api, docs/management.md), polls it every POLL_MS while
// the tab is visible, and builds every element with `h()` below: text from the broker (queue
// names, message headers and bodies) is always set as text, never parsed as HTML.
"use strict";

(() => {
  const POLL_MS = 2000; // how often a page asks for fresh numbers
  const CHART_SECONDS = 300; // the throughput chart's span
  const PAGE_SIZES = [25, 50, 100, 500];

  const state = {
    session: null, // {user, roles, csrf} from POST /api/login
    security: null, // does the broker ask for a login? (GET /api/whoami says)
    overview: null, // the latest GET /api/overview
    reachable: true,
    series: [], // [{t, in, out}] msg/s from the overviews, for the chart
    overviewListeners: new Set(),
    queues: { search: "", page: 1, pageSize: 25, sort: "name", desc: false },
  };

  // ------------------------------------------------------------------ DOM
  /** An element: h("td", {class: "num", dataset: {field: "x"}}, "text", child, ...). */
  function h(tag, attrs, ...children) {
    const el = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === undefined || value === null || value === false) continue;
      if (key === "dataset") Object.assign(el.dataset, value);
      else if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
      else if (key === "class") el.className = value;
      else if (value === true) el.setAttribute(key, "");
      else el.setAttribute(key, String(value));
    }
    append(el, children);
    return el;
  }

  function append(el, children) {
    for (const child of children.flat(Infinity)) {
      if (child === undefined || child === null || child === false) continue;
      el.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return el;
  }

  function replace(el, ...children) {
    el.replaceChildren();
    return append(el, children);
  }

  const $ = (sel) => document.querySelector(sel);

  // ------------------------------------------------------------ formats
  const intFmt = new Intl.NumberFormat("en");
  const rateFmt = new Intl.NumberFormat("en", { maximumFractionDigits: 1 });
  const axisFmt = new Intl.NumberFormat("en", { maximumFractionDigits: 2 });

  function num(v) {
    return typeof v === "number" ? intFmt.format(v) : v === null || v === undefined ? "–" : String(v);
  }

  function rate(v) {
    return typeof v === "number" ? rateFmt.format(v) : "–";
  }

  function bytes(v) {
    if (typeof v !== "number") return "–";
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0;
    let x = v;
    while (x >= 1024 && i < units.length - 1) {
      x /= 1024;
      i += 1;
    }
    return `${i === 0 ? x : x.toFixed(1)} ${units[i]}`;
  }

  function duration(seconds) {
    if (typeof seconds !== "number") return "–";
    const s = Math.floor(seconds);
    const d = Math.floor(s / 86400);
    const hh = Math.floor((s % 86400) / 3600);
    const mm = Math.floor((s % 3600) / 60);
    if (d) return `${d}d ${hh}h`;
    if (hh) return `${hh}h ${mm}m`;
    if (mm) return `${mm}m ${s % 60}s`;
    return `${s}s`;
  }

  /** A time from the API: epoch seconds or milliseconds, or an ISO string. */
  function when(v) {
    if (v === null || v === undefined || v === "") return "–";
    let d;
    if (typeof v === "number") d = new Date(v > 1e12 ? v : v * 1000);
    else d = new Date(v);
    if (Number.isNaN(d.getTime())) return String(v);
    const pad = (n) => String(n).padStart(2, "0");
    return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
  }

  function yesNo(v) {
    return v === true ? "yes" : v === false ? "no" : "–";
  }

  /** Any JSON value as text for a cell (objects compact). */
  function text(v) {
    if (v === null || v === undefined) return "–";
    if (typeof v === "number") return num(v);
    if (typeof v === "boolean") return yesNo(v);
    if (typeof v === "object") return JSON.stringify(v);
    return String(v);
  }

  function stateClass(s) {
    if (s === "active" || s === "in-sync") return "ok";
    if (s === "stopped" || s === "unreachable" || s === "unreplicated") return "bad";
    return "warn";
  }

  // ----------------------------------------------------------------- API
  class ApiError extends Error {
    constructor(status, code, message) {
      super(message);
      this.status = status;
      this.code = code;
    }
  }

  async function api(method, path, body) {
    // X-Requested-With: a 401 then carries no WWW-Authenticate, so the browser shows our login
    // page rather than its own password prompt.
    const headers = { Accept: "application/json", "X-Requested-With": "XMLHttpRequest" };
    if (body !== undefined) headers["Content-Type"] = "application/json";
    if (method !== "GET" && state.session && state.session.csrf) headers["X-Tandem-CSRF"] = state.session.csrf;
    let resp;
    try {
      resp = await fetch(path, {
        method,
        headers,
        body: body === undefined ? undefined : JSON.stringify(body),
        credentials: "same-origin",
        cache: "no-store",
      });
    } catch (e) {
      throw new ApiError(0, "UNREACHABLE", "the broker does not answer");
    }
    const raw = await resp.text();
    let data = null;
    if (raw) {
      try {
        data = JSON.parse(raw);
      } catch (e) {
        data = null;
      }
    }
    if (!resp.ok) {
      const err = (data && data.error) || {};
      const e = new ApiError(resp.status, err.code || `HTTP_${resp.status}`, err.message || resp.statusText);
      if (resp.status === 401 && path !== "/api/login") loggedOut();
      throw e;
    }
    return data;
  }

  const qpath = (name) => `/api/queues/${encodeURIComponent(name)}`;

  // ------------------------------------------------------------- session
  function saveSession(s) {
    // The CSRF token stays in memory: after a reload GET /api/whoami gives it again.
    if (s) state.security = !!s.security;
    state.session = s && s.security ? s : null;
    showWho();
  }

  function showWho() {
    const who = $("#who");
    const s = state.session;
    who.hidden = !s;
    $("#logout").hidden = !s;
    if (s) who.textContent = s.roles && s.roles.length ? `${s.user} (${s.roles.join(", ")})` : s.user;
  }

  function loggedOut() {
    saveSession(null);
    stopOverviewPoll();
    if (!location.hash.startsWith("#/login")) {
      const back = location.hash && location.hash !== "#/login" ? location.hash : "#/overview";
      location.hash = `#/login?next=${encodeURIComponent(back)}`;
    }
  }

  async function logout() {
    try {
      await api("POST", "/api/logout");
    } catch (e) {
      // logged out either way
    }
    loggedOut();
  }

  // ------------------------------------------------------- the overview
  // One poller for the whole console: the header's HA badge and the throughput chart need it on
  // every page, and the chart keeps its samples while other pages are shown.
  let overviewTimer = null;
  let overviewLoop = 0; // the running loop's number; 0: none (a late answer of a stopped loop is dropped)
  let loops = 0;
  let downSince = null; // when the broker stopped answering

  function startOverviewPoll() {
    if (overviewLoop === 0) {
      loops += 1;
      overviewLoop = loops;
      pollOverview(overviewLoop);
    }
  }

  function stopOverviewPoll() {
    overviewLoop = 0;
    clearTimeout(overviewTimer);
  }

  async function pollOverview(loop) {
    if (loop !== overviewLoop) return;
    // A hidden tab asks for nothing (its chart keeps a gap); it catches up when shown again.
    if (!document.hidden) {
      try {
        const ov = await api("GET", "/api/overview");
        if (loop !== overviewLoop) return;
        state.overview = ov;
        state.reachable = true;
        downSince = null;
        const now = Date.now();
        const r = ov.rates || {};
        if (typeof r.in === "number" || typeof r.out === "number") {
          state.series.push({ t: now, in: r.in || 0, out: r.out || 0 });
        }
        while (state.series.length && now - state.series[0].t > CHART_SECONDS * 1000) state.series.shift();
        setBanner(null);
      } catch (e) {
        if (loop !== overviewLoop || e.status === 401) return; // stopped, or loggedOut() took over
        state.reachable = e.status !== 0;
        if (e.status === 0 && downSince === null) downSince = Date.now();
        setBanner(e.status === 0 ? `The broker does not answer (since ${when(downSince)}); retrying.` : e.message);
      }
      showBadge();
      for (const fn of state.overviewListeners) fn();
    }
    overviewTimer = setTimeout(() => pollOverview(loop), POLL_MS);
  }

  function setBanner(message) {
    const b = $("#banner");
    if (!message) {
      b.hidden = true;
      return;
    }
    b.textContent = message;
    b.hidden = false;
  }

  function showBadge() {
    const badge = $("#broker-badge");
    const ov = state.overview;
    if (!ov) return;
    const st = state.reachable ? ov.state : "unreachable";
    badge.className = `badge ${stateClass(st)}`;
    const name = ov.name || "broker";
    badge.textContent = [name, ov.role === name ? null : ov.role, st].filter(Boolean).join(" · ");
    badge.dataset.state = st;
    badge.hidden = false;
  }

  // --------------------------------------------------------------- chart
  /** Draws the in/out rates of `series` over the last CHART_SECONDS on `canvas`. */
  function drawChart(canvas, series) {
    canvas.dataset.points = String(series.length); // how many samples it shows (for tests)
    const dpr = window.devicePixelRatio || 1;
    const w = canvas.clientWidth;
    const hgt = canvas.clientHeight;
    if (!w || !hgt) return;
    if (canvas.width !== Math.round(w * dpr) || canvas.height !== Math.round(hgt * dpr)) {
      canvas.width = Math.round(w * dpr);
      canvas.height = Math.round(hgt * dpr);
    }
    const ctx = canvas.getContext("2d");
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, w, hgt);
    const css = getComputedStyle(document.documentElement);
    const colour = (name) => css.getPropertyValue(name).trim();
    const pad = { l: 52, r: 12, t: 10, b: 24 };
    const pw = w - pad.l - pad.r;
    const ph = hgt - pad.t - pad.b;
    const now = Date.now();
    const t0 = now - CHART_SECONDS * 1000;
    const peak = Math.max(1, ...series.map((p) => Math.max(p.in, p.out)));
    const top = niceCeil(peak);
    ctx.font = "11px system-ui, sans-serif";
    ctx.fillStyle = colour("--muted");
    ctx.strokeStyle = colour("--line");
    ctx.lineWidth = 1;
    ctx.textAlign = "right";
    ctx.textBaseline = "middle";
    for (let i = 0; i <= 4; i += 1) {
      const y = pad.t + ph - (ph * i) / 4;
      ctx.beginPath();
      ctx.moveTo(pad.l, Math.round(y) + 0.5);
      ctx.lineTo(pad.l + pw, Math.round(y) + 0.5);
      ctx.stroke();
      ctx.fillText(axisFmt.format((top * i) / 4), pad.l - 6, y);
    }
    ctx.textAlign = "center";
    ctx.textBaseline = "top";
    for (let m = 0; m <= CHART_SECONDS / 60; m += 1) {
      const x = pad.l + pw - (pw * m * 60) / CHART_SECONDS;
      ctx.fillText(m === 0 ? "now" : `-${m} min`, x, pad.t + ph + 6);
    }
    if (series.length === 0) {
      ctx.fillText("waiting for samples…", pad.l + pw / 2, pad.t + ph / 2 - 6);
      return;
    }
    const xy = (p, key) => [pad.l + (pw * (p.t - t0)) / (CHART_SECONDS * 1000), pad.t + ph - (ph * p[key]) / top];
    for (const [key, name] of [
      ["in", "--in"],
      ["out", "--out"],
    ]) {
      ctx.strokeStyle = colour(name);
      ctx.lineWidth = 2;
      ctx.beginPath();
      series.forEach((p, i) => {
        const [x, y] = xy(p, key);
        // A gap (the tab was hidden, the broker did not answer) stays a gap.
        if (i === 0 || p.t - series[i - 1].t > 3 * POLL_MS) ctx.moveTo(Math.max(x, pad.l), y);
        else ctx.lineTo(x, y);
      });
      ctx.stroke();
    }
  }

  /** A replicating primary's lag: records sent to the backup and not yet acknowledged. */
  function lagText(lag) {
    if (lag === null || lag === undefined) return "– (no backup)";
    if (typeof lag !== "object") return text(lag);
    const oldest = lag.oldest_unacknowledged_s;
    const n = lag.records;
    return `${num(n)} record${n === 1 ? "" : "s"} behind` + (n && typeof oldest === "number" ? `, oldest sent ${oldest.toFixed(3)} s ago` : "");
  }

  function niceCeil(v) {
    const p = 10 ** Math.floor(Math.log10(v));
    for (const m of [1, 2, 2.5, 5, 10]) if (v <= m * p) return m * p;
    return 10 * p;
  }

  // ------------------------------------------------------------- dialogs
  /**
   * A modal confirmation: `fields` are inputs shown in it; `action(values)` runs on OK and the
   * dialog stays open with its error if it throws. Resolves with the action's result, or null
   * when cancelled.
   */
  function confirmDialog({ title, body, fields = [], ok = "OK", danger = true, action }) {
    const dlg = $("#dialog");
    const form = $("#dialog-form");
    const okBtn = $("#dialog-ok");
    const err = $("#dialog-error");
    replace($("#dialog-title"), title);
    const inputs = {};
    const rows = fields.map((f) => {
      const id = `dlg-${f.name}`;
      let input;
      if (f.type === "checkbox") {
        input = h("input", { id, name: f.name, type: "checkbox" });
        inputs[f.name] = input;
        return h("label", { class: "check", for: id }, input, f.label);
      }
      input = h("input", {
        id,
        name: f.name,
        type: f.type || "text",
        placeholder: f.placeholder,
        required: f.required,
        min: f.min,
      });
      if (f.value !== undefined) input.value = f.value;
      inputs[f.name] = input;
      return [h("label", { for: id }, f.label), input];
    });
    replace($("#dialog-body"), body ? h("p", {}, body) : null, rows);
    okBtn.textContent = ok;
    okBtn.className = danger ? "danger" : "primary";
    okBtn.disabled = false;
    err.hidden = true;
    return new Promise((resolve) => {
      const finish = (value) => {
        form.onsubmit = null;
        $("#dialog-cancel").onclick = null;
        dlg.oncancel = null;
        if (dlg.open) dlg.close();
        resolve(value);
      };
      form.onsubmit = async (ev) => {
        ev.preventDefault();
        if (!form.reportValidity()) return;
        const values = {};
        for (const [name, input] of Object.entries(inputs)) {
          values[name] = input.type === "checkbox" ? input.checked : input.value.trim();
        }
        okBtn.disabled = true;
        try {
          finish(await action(values));
        } catch (e) {
          err.textContent = e.message;
          err.hidden = false;
          okBtn.disabled = false;
        }
      };
      $("#dialog-cancel").onclick = () => finish(null);
      dlg.oncancel = () => finish(null);
      dlg.showModal();
      const first = Object.values(inputs)[0];
      (first || okBtn).focus();
    });
  }

  // ------------------------------------------------------------ widgets
  function card(label, value, testid) {
    return h("div", { class: "card" }, h("div", { class: "label" }, label), h("div", { class: "value", "data-testid": testid }, value));
  }

  /** A key/value table of a JSON object; nested objects as their own table. */
  function kvTable(obj) {
    const rows = Object.entries(obj || {}).map(([k, v]) =>
      h("tr", {}, h("th", {}, k), h("td", {}, v && typeof v === "object" && !Array.isArray(v) ? kvTable(v) : isTime(k, v) ? when(v) : renderAny(v))),
    );
    return h("table", { class: "kv" }, h("tbody", {}, rows));
  }

  /** A time stamp by its key's name (`activated_at`, `since`, `last_failover`). */
  function isTime(key, v) {
    return typeof v === "number" && /(_at|since|failover|^when)$/.test(key);
  }

  /** A list of objects as a table (columns: the union of their keys). */
  function listTable(items) {
    if (!items.length) return h("p", { class: "muted" }, "none");
    const cols = [...new Set(items.flatMap((o) => Object.keys(o)))];
    return h(
      "table",
      {},
      h("thead", {}, h("tr", {}, cols.map((c) => h("th", {}, c)))),
      h("tbody", {}, items.map((o) => h("tr", {}, cols.map((c) => h("td", {}, isTime(c, o[c]) ? when(o[c]) : text(o[c])))))),
    );
  }

  function renderAny(v) {
    if (Array.isArray(v)) {
      if (v.length && v.every((x) => x && typeof x === "object" && !Array.isArray(x))) return listTable(v);
      return v.map(text).join(", ") || "–";
    }
    if (v && typeof v === "object") return kvTable(v);
    return text(v);
  }

  // Hands a list endpoint's items (an array, or `{items}`) to `show`; on an error the box in
  // `err` says why and the items on screen stay as they were.
  async function loadList(path, err, show) {
    let items;
    try {
      const res = await api("GET", path);
      items = Array.isArray(res) ? res : res.items || [];
    } catch (e) {
      replace(err, errorBox(e));
      return;
    }
    replace(err);
    show(items);
  }

  function errorBox(e) {
    if (e.code === "NOT_ACTIVE") {
      return h("p", { class: "notice" }, "This server is not active (a waiting backup): only the overview answers here. ", e.message);
    }
    return h("p", { class: "error" }, `${e.code}: ${e.message}`);
  }

  function notice(el, message, ok = true) {
    replace(el, h("p", { class: ok ? "notice ok" : "error", role: "status" }, message));
  }

  /** A sortable table head; `sort` {key, desc} is changed in place and `onSort` called. */
  function sortableHead(columns, sort, onSort) {
    return h(
      "thead",
      {},
      h(
        "tr",
        {},
        columns.map((c) => {
          if (!c.sort) return h("th", { class: c.num ? "num" : "" }, c.label);
          const active = sort.key === c.key;
          return h(
            "th",
            {
              class: `sortable${c.num ? " num" : ""}`,
              "aria-sort": active ? (sort.desc ? "descending" : "ascending") : "none",
              dataset: { sort: c.key },
              onclick: () => {
                if (sort.key === c.key) sort.desc = !sort.desc;
                else {
                  sort.key = c.key;
                  sort.desc = !!c.num; // numbers: biggest first
                }
                onSort();
              },
            },
            c.label,
          );
        }),
      ),
    );
  }

  function sortRows(items, key, desc) {
    const get = (o) => key.split(".").reduce((x, k) => (x == null ? x : x[k]), o);
    const out = [...items].sort((a, b) => {
      const x = get(a);
      const y = get(b);
      if (x === y) return 0;
      if (x === null || x === undefined) return 1;
      if (y === null || y === undefined) return -1;
      return x < y ? -1 : 1;
    });
    return desc ? out.reverse() : out;
  }

  // --------------------------------------------------------------- views
  // A view: mount(main, params) builds the page and returns {refresh, stop}; refresh runs now
  // and every POLL_MS while the page is shown and the tab visible.

  function loginView(main, params) {
    stopOverviewPoll();
    $("#nav").hidden = true;
    $("#broker-badge").hidden = true;
    const user = h("input", { id: "username", name: "username", autocomplete: "username", required: true, autofocus: true });
    const pass = h("input", { id: "password", name: "password", type: "password", autocomplete: "current-password", required: true });
    const err = h("p", { class: "error", role: "alert", "data-testid": "login-error", hidden: true });
    const btn = h("button", { class: "primary", type: "submit" }, "Log in");
    const form = h(
      "form",
      {
        class: "panel login",
        onsubmit: async (ev) => {
          ev.preventDefault();
          btn.disabled = true;
          err.hidden = true;
          try {
            const s = await api("POST", "/api/login", { username: user.value, password: pass.value });
            saveSession(s);
            location.hash = params.get("next") || "#/overview";
          } catch (e) {
            err.textContent = e.status === 401 || e.status === 403 ? "Wrong user name or password." : e.message;
            err.hidden = false;
            btn.disabled = false;
          }
        },
      },
      h("h1", {}, "Log in to Tandem"),
      h("label", { for: "username" }, "User"),
      user,
      h("label", { for: "password" }, "Password"),
      pass,
      err,
      btn,
    );
    replace(main, form);
    user.focus();
    return {};
  }

  function overviewView(main) {
    const cards = h("div", { class: "grid" });
    const ha = h("div", { class: "panel", "data-testid": "ha-panel" });
    const canvas = h("canvas", { class: "chart", "data-testid": "throughput-chart", role: "img", "aria-label": "messages per second in and out" });
    const rates = h("span", { class: "muted" });
    replace(
      main,
      h("h1", {}, "Overview"),
      cards,
      h(
        "div",
        { class: "two" },
        ha,
        h(
          "div",
          { class: "panel" },
          h("h2", {}, "Throughput ", rates),
          canvas,
          h(
            "div",
            { class: "legend" },
            h("span", {}, h("span", { class: "swatch in" }), "in (added, msg/s)"),
            h("span", {}, h("span", { class: "swatch out" }), "out (acknowledged, msg/s)"),
          ),
        ),
      ),
    );

    function render() {
      const ov = state.overview;
      drawChart(canvas, state.series);
      if (!ov) return;
      const r = ov.rates || {};
      replace(rates, "· now ", h("span", { "data-testid": "rate-in" }, rate(r.in)), " in, ", h("span", { "data-testid": "rate-out" }, rate(r.out)), " out");
      replace(
        cards,
        card("Messages", num(ov.messages), "total-messages"),
        card("In delivery", num(ov.delivering)),
        card("Paged", num(ov.paged)),
        card("Queues", num(ov.queues)),
        card("Consumers", num(ov.consumers)),
        card("Connections", num(ov.connections)),
        card("Memory held", bytes(ov.memory_bytes)),
        card("Uptime", duration(ov.uptime_s)),
      );
      const st = state.reachable ? ov.state : "unreachable";
      const lag = ov.replication_lag;
      replace(
        ha,
        h("h2", {}, "High availability"),
        h(
          "table",
          { class: "kv" },
          h(
            "tbody",
            {},
            h("tr", {}, h("th", {}, "State"), h("td", {}, h("span", { class: `badge ${stateClass(st)}`, "data-testid": "ha-state" }, st))),
            h("tr", {}, h("th", {}, "Role"), h("td", { "data-testid": "ha-role" }, text(ov.role))),
            h("tr", {}, h("th", {}, "HA policy"), h("td", {}, text(ov.ha_policy))),
            h("tr", {}, h("th", {}, "Peer"), h("td", {}, text(ov.peer || ov.replication_peer))),
            ov.replication !== undefined
              ? h("tr", {}, h("th", {}, "Replication"), h("td", {}, h("span", { class: `badge ${stateClass(ov.replication)}`, "data-testid": "replication" }, text(ov.replication))))
              : null,
            lag !== undefined ? h("tr", {}, h("th", {}, "Replication lag"), h("td", { "data-testid": "replication-lag" }, lagText(lag))) : null,
            h("tr", {}, h("th", {}, "Node"), h("td", {}, text(ov.node_id))),
            h("tr", {}, h("th", {}, "Version"), h("td", {}, text(ov.version))),
            h("tr", {}, h("th", {}, "Active for"), h("td", {}, ov.state === "active" ? duration(ov.active_for_s) : "not active")),
          ),
        ),
        h("p", {}, h("a", { href: "#/broker" }, "Pair members, failovers and the journal →")),
      );
    }

    state.overviewListeners.add(render);
    const onResize = () => drawChart(canvas, state.series);
    window.addEventListener("resize", onResize);
    render();
    return {
      stop() {
        state.overviewListeners.delete(render);
        window.removeEventListener("resize", onResize);
      },
    };
  }

  const QUEUE_COLUMNS = [
    { key: "name", label: "Name", sort: true },
    { key: "address", label: "Address", sort: true },
    { key: "message_count", label: "Ready", sort: true, num: true },
    { key: "delivering_count", label: "In delivery", sort: true, num: true },
    { key: "paged_count", label: "Paged", sort: true, num: true },
    { key: "consumer_count", label: "Consumers", sort: true, num: true },
    { key: "rates.added", label: "In/s", num: true },
    { key: "rates.acked", label: "Acked/s", num: true },
    { key: "state", label: "State" },
  ];

  function queuesView(main) {
    const q = state.queues;
    const sort = { key: q.sort, desc: q.desc };
    const search = h("input", { type: "search", placeholder: "Filter by name", "aria-label": "Filter queues by name", value: q.search });
    const size = h("select", { "aria-label": "Queues per page" }, PAGE_SIZES.map((n) => h("option", { value: n, selected: n === q.pageSize }, `${n} per page`)));
    const total = h("span", { class: "muted", "data-testid": "queue-total" });
    const table = h("table", { "data-testid": "queues-table" });
    const tbody = h("tbody");
    const pager = h("div", { class: "pager" });
    const err = h("div");
    let typing = null;
    let clientSort = false; // the server refused our sort key: sort each page here

    search.addEventListener("input", () => {
      clearTimeout(typing);
      typing = setTimeout(() => {
        q.search = search.value.trim();
        q.page = 1;
        view.refresh();
      }, 250);
    });
    size.addEventListener("change", () => {
      q.pageSize = Number(size.value);
      q.page = 1;
      view.refresh();
    });

    function head() {
      return sortableHead(QUEUE_COLUMNS, sort, () => {
        q.sort = sort.key;
        q.desc = sort.desc;
        replace(table, head(), tbody);
        view.refresh();
      });
    }
    replace(table, head(), tbody);
    replace(main, h("h1", {}, "Queues"), h("div", { class: "toolbar" }, search, size, h("span", { class: "grow" }), total), err, table, pager);

    let asked = 0; // the newest request: typing, paging and the timer overlap, the last one wins
    const view = {
      async refresh() {
        const mine = (asked += 1);
        const params = new URLSearchParams({ page: String(q.page), page_size: String(q.pageSize) });
        if (q.search) params.set("name", q.search);
        if (!clientSort) params.set("sort", (sort.desc ? "-" : "") + sort.key);
        let res;
        try {
          res = await api("GET", `/api/queues?${params}`);
        } catch (e) {
          if (mine !== asked) return undefined;
          if (e.status === 400 && !clientSort && e.message.includes("sort")) {
            clientSort = true;
            return view.refresh();
          }
          replace(err, errorBox(e));
          return;
        }
        if (mine !== asked) return undefined;
        replace(err);
        const items = clientSort ? sortRows(res.items || [], sort.key, sort.desc) : res.items || [];
        const pages = Math.max(1, Math.ceil((res.total || 0) / q.pageSize));
        total.textContent = `${num(res.total)} queue${res.total === 1 ? "" : "s"}`;
        replace(
          tbody,
          items.length
            ? items.map((it) =>
                h(
                  "tr",
                  { dataset: { queue: it.name } },
                  h("td", { dataset: { field: "name" } }, h("a", { href: `#/queue/${encodeURIComponent(it.name)}` }, it.name)),
                  h("td", { dataset: { field: "address" } }, text(it.address)),
                  ["message_count", "delivering_count", "paged_count", "consumer_count"].map((f) => h("td", { class: "num", dataset: { field: f } }, num(it[f]))),
                  h("td", { class: "num", dataset: { field: "rate_added" } }, rate((it.rates || {}).added)),
                  h("td", { class: "num", dataset: { field: "rate_acked" } }, rate((it.rates || {}).acked)),
                  h("td", { dataset: { field: "state" } }, it.paused ? h("span", { class: "badge warn" }, "paused") : it.temporary ? h("span", { class: "badge" }, "temporary") : ""),
                ),
              )
            : h("tr", {}, h("td", { colspan: QUEUE_COLUMNS.length, class: "muted" }, q.search ? `No queue name contains “${q.search}”.` : "No queues.")),
        );
        replace(
          pager,
          h("button", { type: "button", disabled: q.page <= 1, onclick: () => ((q.page -= 1), view.refresh()) }, "‹ Previous"),
          h("span", { class: "muted" }, `page ${q.page} of ${pages}`),
          h("button", { type: "button", disabled: q.page >= pages, onclick: () => ((q.page += 1), view.refresh()) }, "Next ›"),
        );
        return undefined;
      },
      stop() {
        clearTimeout(typing);
      },
    };
    return view;
  }

  function queueView(main, params, name) {
    const title = h("h1", {}, name);
    const cards = h("div", { class: "grid" });
    const msg = h("div", { "data-testid": "queue-notice" });
    const settings = h("div", { class: "panel" });
    const consumers = h("div", { class: "panel" });
    const err = h("div");
    const count = h("input", { type: "number", min: 1, max: 1000, value: 20, "aria-label": "How many messages", class: "narrow" });
    const selector = h("input", { type: "text", class: "selector", placeholder: "selector, e.g. priority > 4", "aria-label": "Browse selector" });
    const messages = h("div", { "data-testid": "messages" });
    const pauseBtn = h("button", { type: "button", onclick: () => togglePause() }, "Pause");
    let stat = null;

    const actions = h(
      "div",
      { class: "actions" },
      pauseBtn,
      h("button", { type: "button", onclick: () => purge() }, "Purge…"),
      h("button", { type: "button", onclick: () => move() }, "Move…"),
      h("button", { type: "button", onclick: () => retry() }, "Retry dead letters…"),
    );
    replace(
      main,
      h("p", {}, h("a", { href: "#/queues" }, "← Queues")),
      title,
      h("div", { class: "toolbar" }, actions),
      msg,
      err,
      cards,
      h(
        "div",
        { class: "panel" },
        h("h2", {}, "Messages"),
        h(
          "form",
          {
            class: "toolbar",
            onsubmit: (ev) => {
              ev.preventDefault();
              browse();
            },
          },
          h("label", {}, "First ", count),
          selector,
          h("button", { type: "submit", class: "primary" }, "Browse"),
        ),
        messages,
      ),
      h("div", { class: "two" }, settings, consumers),
    );

    async function refresh() {
      try {
        stat = await api("GET", qpath(name));
      } catch (e) {
        replace(err, errorBox(e));
        return;
      }
      replace(err);
      const s = stat;
      replace(
        title,
        s.name,
        s.paused ? h("span", { class: "badge warn", "data-testid": "paused" }, "paused") : null,
        h("span", { class: "badge" }, s.routing_type),
        s.durable ? h("span", { class: "badge" }, "durable") : h("span", { class: "badge" }, "non-durable"),
        s.temporary ? h("span", { class: "badge" }, "temporary") : null,
      );
      pauseBtn.textContent = s.paused ? "Resume" : "Pause";
      replace(
        cards,
        card("Ready", num(s.message_count), "queue-messages"),
        card("In delivery", num(s.delivering_count)),
        card("Paged", num(s.paged_count)),
        card("Scheduled", num(s.scheduled_count)),
        card("Consumers", num(s.consumer_count)),
        card("Added", num(s.messages_added)),
        card("Acknowledged", num(s.messages_acknowledged)),
        card("Expired", num(s.messages_expired)),
        card("Dead-lettered", num(s.messages_killed)),
        card("Memory", bytes(s.memory_bytes)),
      );
      replace(settings, h("h2", {}, "Settings in force"), kvTable({ address: s.address, filter: s.filter, exclusive: s.exclusive, last_value_key: s.last_value_key, ...(s.settings || {}) }));
      const cons = Array.isArray(s.consumers) ? s.consumers : [];
      replace(consumers, h("h2", {}, `Consumers (${cons.length})`), listTable(cons));
    }

    async function browse() {
      const p = new URLSearchParams({ count: String(Math.min(1000, Math.max(1, Number(count.value) || 20))) });
      if (selector.value.trim()) p.set("selector", selector.value.trim());
      replace(messages, h("p", { class: "muted" }, "Browsing…"));
      let list;
      try {
        list = await api("GET", `${qpath(name)}/messages?${p}`);
      } catch (e) {
        replace(messages, errorBox(e));
        return;
      }
      const items = Array.isArray(list) ? list : list.items || list.messages || [];
      if (!items.length) {
        replace(messages, h("p", { class: "muted", "data-testid": "no-messages" }, "No messages."));
        return;
      }
      replace(
        messages,
        h(
          "table",
          { "data-testid": "messages-table" },
          h("thead", {}, h("tr", {}, ["Seq", "ID", "Priority", "Durable", "Deliveries", "Expires", "Size", "Headers", "Body"].map((c) => h("th", {}, c)))),
          h(
            "tbody",
            {},
            items.map((m) =>
              h(
                "tr",
                { dataset: { seq: m.seq } },
                h("td", { class: "num" }, text(m.seq)),
                h("td", {}, text(m.id)),
                h("td", { class: "num" }, text(m.priority)),
                h("td", {}, yesNo(m.durable)),
                h("td", { class: "num" }, text(m.delivery_count)),
                h("td", {}, m.expiration ? when(m.expiration) : "never"),
                h("td", { class: "num" }, bytes(m.body_size), m.large ? h("span", { class: "badge" }, "large") : null, m.paged ? h("span", { class: "badge" }, "paged") : null),
                h("td", {}, m.headers && Object.keys(m.headers).length ? kvTable(m.headers) : "–"),
                h("td", { dataset: { field: "body" } }, bodyPreview(m)),
              ),
            ),
          ),
        ),
      );
    }

    function bodyPreview(m) {
      const preview = m.body_preview;
      if (preview === null || preview === undefined) return "–";
      const cut = typeof m.body_size === "number" && m.body_size > previewLength(m);
      let shown = preview;
      if (m.body_encoding === "base64") {
        try {
          const raw = atob(preview);
          shown = Array.from(raw, (c) => c.charCodeAt(0).toString(16).padStart(2, "0")).join(" ");
        } catch (e) {
          shown = preview;
        }
      }
      return h("div", { class: "preview" }, m.body_encoding === "base64" ? h("span", { class: "muted" }, "binary (hex): ") : null, h("pre", {}, shown), cut ? h("span", { class: "muted" }, `… (${bytes(m.body_size)} in all)`) : null);
    }

    function previewLength(m) {
      if (m.body_encoding === "base64") return Math.floor((m.body_preview.length * 3) / 4);
      return new TextEncoder().encode(m.body_preview).length;
    }

    async function after(promise, say) {
      const result = await promise;
      if (result !== null) {
        notice(msg, say(result || {}));
        refresh();
        browse();
      }
    }

    function purge() {
      const n = stat ? num(stat.message_count) : "all";
      after(
        confirmDialog({
          title: `Purge ${name}?`,
          body: `Remove the ${n} messages waiting in ${name}. Messages in delivery are not removed. This cannot be undone.`,
          ok: "Purge",
          action: () => api("DELETE", `${qpath(name)}/messages`),
        }),
        (r) => `Removed ${num(r.removed)} message${r.removed === 1 ? "" : "s"}.`,
      );
    }

    function move() {
      after(
        confirmDialog({
          title: `Move messages from ${name}`,
          body: "Each message matching the selector (all when empty) is sent to the address and removed from this queue (kept here too with Copy).",
          fields: [
            { name: "to", label: "To address", required: true },
            { name: "selector", label: "Selector (optional)", placeholder: "e.g. kind = 'refund'" },
            { name: "limit", label: "At most (optional)", type: "number", min: 1 },
            { name: "copy", label: "Copy (leave them in this queue)", type: "checkbox" },
          ],
          ok: "Move",
          action: (v) => {
            const body = { to: v.to, copy: v.copy };
            if (v.selector) body.selector = v.selector;
            if (v.limit) body.limit = Number(v.limit);
            return api("POST", `${qpath(name)}/move`, body);
          },
        }),
        (r) => `${r.copied !== undefined ? "Copied" : "Moved"} ${num(r.moved !== undefined ? r.moved : r.copied)} message(s).`,
      );
    }

    function retry() {
      after(
        confirmDialog({
          title: `Retry dead letters in ${name}`,
          body: "Each message matching the selector (all when empty) goes back to the address it was dead-lettered from.",
          fields: [{ name: "selector", label: "Selector (optional)" }],
          ok: "Retry",
          danger: false,
          action: (v) => api("POST", `${qpath(name)}/retry`, v.selector ? { selector: v.selector } : {}),
        }),
        (r) => `Sent ${num(r.retried)} message(s) back to their original address.`,
      );
    }

    function togglePause() {
      const paused = !!(stat && stat.paused);
      after(
        confirmDialog({
          title: paused ? `Resume ${name}?` : `Pause ${name}?`,
          body: paused ? "Consumers get messages from this queue again." : "The queue keeps receiving messages but delivers none to its consumers until it is resumed; this holds across a restart or a failover.",
          ok: paused ? "Resume" : "Pause",
          danger: !paused,
          action: () => api("POST", `${qpath(name)}/${paused ? "resume" : "pause"}`),
        }),
        (r) => (r.paused ? "Paused: nothing is delivered." : "Resumed."),
      );
    }

    browse();
    return { refresh };
  }

  function connectionsView(main) {
    const sort = { key: "since", desc: true };
    const cols = [
      { key: "id", label: "ID", sort: true },
      { key: "peer", label: "Peer", sort: true },
      { key: "protocol", label: "Protocol", sort: true },
      { key: "user", label: "User", sort: true },
      { key: "tls", label: "TLS", sort: true },
      { key: "since", label: "Since", sort: true },
      { key: "sessions", label: "Sessions", sort: true, num: true },
      { key: "consumers", label: "Consumers", sort: true, num: true },
      { key: "", label: "" },
    ];
    const msg = h("div");
    const err = h("div");
    const tbody = h("tbody");
    const table = h("table", { "data-testid": "connections-table" });
    let items = [];
    const head = () => sortableHead(cols, sort, () => (replace(table, head(), tbody), render()));
    replace(table, head(), tbody);
    replace(main, h("h1", {}, "Connections"), msg, err, table);

    function render() {
      replace(
        tbody,
        items.length
          ? sortRows(items, sort.key, sort.desc).map((c) =>
              h(
                "tr",
                { dataset: { connection: c.id } },
                h("td", {}, text(c.id)),
                h("td", {}, text(c.peer)),
                h("td", {}, text(c.protocol)),
                h("td", {}, text(c.user)),
                h("td", {}, yesNo(c.tls)),
                h("td", {}, when(c.since)),
                h("td", { class: "num" }, num(Array.isArray(c.sessions) ? c.sessions.length : c.sessions)),
                h("td", { class: "num" }, num(Array.isArray(c.consumers) ? c.consumers.length : c.consumers)),
                h("td", {}, h("button", { type: "button", onclick: () => close(c) }, "Close…")),
              ),
            )
          : h("tr", {}, h("td", { colspan: cols.length, class: "muted" }, "No connections.")),
      );
    }

    async function close(c) {
      const r = await confirmDialog({
        title: `Close connection ${c.id}?`,
        body: `The connection from ${c.peer} (${c.protocol}${c.user ? `, user ${c.user}` : ""}) is closed; its unacknowledged messages go back to their queues. A failover-aware client reconnects.`,
        ok: "Close connection",
        action: () => api("DELETE", `/api/connections/${encodeURIComponent(c.id)}`).then((x) => x || {}),
      });
      if (r !== null) {
        notice(msg, `Closed connection ${c.id}.`);
        view.refresh();
      }
    }

    const view = {
      refresh: () =>
        loadList("/api/connections", err, (got) => {
          items = got;
          render();
        }),
    };
    return view;
  }

  function consumersView(main) {
    const sort = { key: "queue", desc: false };
    const cols = [
      { key: "queue", label: "Queue", sort: true },
      { key: "connection", label: "Connection", sort: true },
      { key: "session", label: "Session", sort: true },
      { key: "id", label: "ID", sort: true },
      { key: "selector", label: "Selector", sort: true },
      { key: "delivering", label: "In delivery", sort: true, num: true },
      { key: "since", label: "Since", sort: true },
    ];
    const err = h("div");
    const tbody = h("tbody");
    const table = h("table", { "data-testid": "consumers-table" });
    let items = [];
    const head = () => sortableHead(cols, sort, () => (replace(table, head(), tbody), render()));
    replace(table, head(), tbody);
    replace(main, h("h1", {}, "Consumers"), err, table);

    function render() {
      replace(
        tbody,
        items.length
          ? sortRows(items, sort.key, sort.desc).map((c) =>
              h(
                "tr",
                {},
                h("td", {}, h("a", { href: `#/queue/${encodeURIComponent(c.queue)}` }, text(c.queue))),
                h("td", {}, text(c.connection)),
                h("td", {}, text(c.session)),
                h("td", {}, text(c.id)),
                h("td", {}, text(c.selector)),
                h("td", { class: "num" }, num(c.delivering)),
                h("td", {}, when(c.since)),
              ),
            )
          : h("tr", {}, h("td", { colspan: cols.length, class: "muted" }, "No consumers.")),
      );
    }

    return {
      refresh: () =>
        loadList("/api/consumers", err, (got) => {
          items = got;
          render();
        }),
    };
  }

  function addressesView(main) {
    const sort = { key: "name", desc: false };
    const cols = [
      { key: "name", label: "Name", sort: true },
      { key: "routing_types", label: "Routing" },
      { key: "queues", label: "Queues" },
      { key: "size_bytes", label: "Memory", sort: true, num: true },
      { key: "paged_messages", label: "Paged", sort: true, num: true },
      { key: "blocked_producers", label: "Blocked producers", sort: true, num: true },
      { key: "messages_dropped", label: "Dropped", sort: true, num: true },
    ];
    const err = h("div");
    const tbody = h("tbody");
    const table = h("table", { "data-testid": "addresses-table" });
    let items = [];
    const head = () => sortableHead(cols, sort, () => (replace(table, head(), tbody), render()));
    replace(table, head(), tbody);
    replace(main, h("h1", {}, "Addresses"), err, table);

    function render() {
      replace(
        tbody,
        items.length
          ? sortRows(items, sort.key, sort.desc).map((a) =>
              h(
                "tr",
                { dataset: { address: a.name } },
                h("td", {}, a.name),
                h("td", {}, text((a.routing_types || []).join(", "))),
                h(
                  "td",
                  {},
                  (a.queues || []).map((q, i) => [i ? ", " : "", h("a", { href: `#/queue/${encodeURIComponent(q)}` }, q)]),
                ),
                h("td", { class: "num" }, bytes(a.size_bytes)),
                h("td", { class: "num" }, num(a.paged_messages)),
                h("td", { class: "num" }, num(a.blocked_producers)),
                h("td", { class: "num" }, num(a.messages_dropped)),
              ),
            )
          : h("tr", {}, h("td", { colspan: cols.length, class: "muted" }, "No addresses.")),
      );
    }

    return {
      refresh: () =>
        loadList("/api/addresses", err, (got) => {
          items = got;
          render();
        }),
    };
  }

  function brokerView(main) {
    const ha = h("div", { class: "panel", "data-testid": "ha-detail" });
    const journal = h("div", { class: "panel", "data-testid": "journal-detail" });
    replace(main, h("h1", {}, "HA and journal"), ha, journal);
    return {
      async refresh() {
        await Promise.all([
          api("GET", "/api/ha").then(
            (r) => replace(ha, h("h2", {}, "High availability"), renderAny(r)),
            (e) => replace(ha, h("h2", {}, "High availability"), errorBox(e)),
          ),
          api("GET", "/api/journal").then(
            (r) => replace(journal, h("h2", {}, "Journal"), renderAny(r)),
            (e) => replace(journal, h("h2", {}, "Journal"), errorBox(e)),
          ),
        ]);
      },
    };
  }

  // -------------------------------------------------------------- router
  const ROUTES = {
    login: loginView,
    overview: overviewView,
    queues: queuesView,
    queue: queueView,
    addresses: addressesView,
    connections: connectionsView,
    consumers: consumersView,
    broker: brokerView,
  };

  let current = null; // {view, timer, gen}
  let generation = 0;

  function parseHash() {
    const raw = location.hash.replace(/^#\/?/, "");
    const [path, query] = raw.split("?");
    const parts = path.split("/").filter(Boolean).map(decodeURIComponent);
    return { name: parts[0] || "overview", args: parts.slice(1), params: new URLSearchParams(query || "") };
  }

  function route() {
    if (current) {
      clearTimeout(current.timer);
      if (current.view.stop) current.view.stop();
    }
    const gen = (generation += 1);
    const { name, args, params } = parseHash();
    if (name === "login" && state.security === false) {
      location.hash = "#/overview"; // nothing to log in to
      return;
    }
    const mount = ROUTES[name];
    const main = $("#view");
    if (!mount) {
      replace(main, h("h1", {}, "Not found"), h("p", {}, h("a", { href: "#/overview" }, "Overview")));
      current = null;
      return;
    }
    if (name !== "login") {
      $("#nav").hidden = false;
      startOverviewPoll();
    }
    for (const a of document.querySelectorAll("#nav a")) {
      a.classList.toggle("current", a.dataset.route === name || (name === "queue" && a.dataset.route === "queues"));
    }
    document.title = `Tandem · ${name === "queue" ? args[0] : name}`;
    const view = mount(main, params, ...args) || {};
    current = { view, timer: null, gen };
    if (view.refresh) tick();

    async function tick() {
      if (!current || current.gen !== gen) return;
      if (!document.hidden) {
        try {
          await view.refresh();
        } catch (e) {
          // a view shows its own errors; keep polling
        }
      }
      if (current && current.gen === gen) current.timer = setTimeout(tick, POLL_MS);
    }
  }

  async function boot() {
    $("#logout").addEventListener("click", logout);
    window.addEventListener("hashchange", route);
    // Who we are: 401 when not logged in (or the session ended), and loggedOut() sends us to the
    // login page; with security off nobody logs in.
    try {
      saveSession(await api("GET", "/api/whoami"));
    } catch (e) {
      if (e.status === 401) {
        if (location.hash.startsWith("#/login")) route();
        return; // otherwise loggedOut() changed the hash: hashchange routes
      }
      setBanner(e.status === 0 ? "The broker does not answer." : e.message);
    }
    route();
  }

  boot();
})();
