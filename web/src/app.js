// ctuner web UI: the dashboard, the config builder and the launch view over
// the JSON API of `ctuner serve` (docs/webui.md). Plain JS, no framework;
// charts by uPlot (bundled, see scripts/web_build.sh). The picked run is
// followed by its event stream (/stream: metrics, log, status), one reader from
// the last step and byte it has, so every point and log event arrives once; if
// the stream drops, the page polls (metrics?since=STEP, log?offset=N) from
// there until it opens the stream again.
"use strict";

const $ = (id) => document.getElementById(id);
const el = (tag, attrs = {}, ...kids) => {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") e.className = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else if (v !== undefined && v !== null) e.setAttribute(k, v);
  }
  for (const k of kids) e.append(k);
  return e;
};

// The header's connection line; the token message stays until the page has it.
function connMsg(text) {
  if ($("conn").className !== "needtoken") $("conn").textContent = text;
}

async function api(method, path, body) {
  const opt = { method, headers: {}, credentials: "same-origin" };
  if (method === "POST") { // the server refuses other POSTs (no cross-site forms)
    opt.headers["Content-Type"] = "application/json";
    opt.body = JSON.stringify(body === undefined ? {} : body);
  }
  const r = await fetch("/api/" + path, opt);
  let d = null;
  try { d = await r.json(); } catch (e) { d = null; }
  if (r.status === 401) {
    $("conn").textContent = "this server needs its access token: open the URL it printed when it started " +
      "(http://HOST:PORT/?token=…) once in this browser";
    $("conn").className = "needtoken";
  }
  if (!r.ok && !(d && (d.check || d.problems))) throw new Error((d && d.error) || r.status + " " + r.statusText);
  return d;
}

// ---------------------------------------------------------------- views
const views = ["dashboard", "builder", "launch"];
function show() {
  const v = views.includes(location.hash.slice(1)) ? location.hash.slice(1) : "dashboard";
  for (const x of views) {
    $("view-" + x).hidden = x !== v;
    $("nav-" + x).classList.toggle("on", x === v);
  }
  if (v === "builder") builder.init();
  if (v === "launch") launch.refresh();
}
window.addEventListener("hashchange", show);

// ---------------------------------------------------------------- dashboard
const dash = {
  runs: [], cur: null, points: [], last: -1, run: null, plots: {}, vcount: -1, timer: null,
  es: null, retryAt: 0, polling: false, refreshing: false, again: false,
};

function fmtNum(x) {
  if (x === null || x === undefined || !isFinite(x)) return "–";
  const a = Math.abs(x);
  return a !== 0 && (a < 1e-3 || a >= 1e5) ? x.toExponential(3) : String(+x.toPrecision(5));
}
function fmtAxis(x) {
  if (x === null || !isFinite(x)) return "";
  const a = Math.abs(x);
  return a !== 0 && (a < 1e-3 || a >= 1e5) ? x.toExponential(1) : String(+x.toPrecision(4));
}
function fmtTime(s) {
  if (!isFinite(s) || s < 0) return "–";
  s = Math.round(s);
  return s >= 3600 ? `${Math.floor(s / 3600)}h${String(Math.floor(s / 60) % 60).padStart(2, "0")}m`
                   : `${Math.floor(s / 60)}m${String(s % 60).padStart(2, "0")}s`;
}

async function loadRuns() {
  try {
    const d = await api("GET", "runs");
    connMsg("");
    dash.runs = d.runs;
    const ul = $("run-list");
    ul.replaceChildren(...d.runs.map((r) => el("li", {
      class: r.name === dash.cur ? "on" : "", "data-run": r.name, onclick: () => pick(r.name),
    }, el("span", {}, r.name), el("span", { class: "badge " + r.status }, r.status))));
    $("runs-empty").hidden = d.runs.length > 0;
    if (!dash.cur && d.runs.length) pick((d.runs.find((r) => r.status === "running") || d.runs[0]).name);
    launch.fillRuns();
    builder.fillLoad();
  } catch (e) {
    connMsg("server unreachable: " + e.message);
  }
}

function pick(name, force) {
  if (dash.cur === name && !force) return;
  closeStream();
  dash.cur = name;
  dash.points = [];
  dash.last = -1;
  dash.vcount = -1;
  dash.vall = false;
  dash.ckKey = "";
  dash.logOff = 0;
  dash.logTail = "";
  dash.events = [];
  dash.run = null;
  dash.retryAt = 0;
  $("events").replaceChildren(el("li", { class: "muted" }, "none yet (runs started from this page have a log)"));
  for (const p of Object.values(dash.plots)) p.destroy();
  dash.plots = {};
  renderCharts();
  for (const li of $("run-list").children) li.classList.toggle("on", li.dataset.run === name);
  $("run-none").hidden = true;
  $("run-body").hidden = false;
  $("run-name").textContent = name;
  $("run-why").hidden = true;
  $("validation").replaceChildren(el("p", { class: "muted" }, "No validation images yet."));
  refreshRun();
  if (!openStream()) pollOnce();
}

// The picked run's event stream: metrics, log and status events from the last
// step and log byte the page has. The browser would reconnect a dropped stream
// from the start it was opened with (every event again), so on an error the
// page closes it, polls from where it is, and opens a new one 5 s later.
function openStream() {
  closeStream();
  const name = dash.cur;
  if (!name || !window.EventSource || dash.polling) return false;
  const es = new EventSource(`/api/runs/${encodeURIComponent(name)}/stream?since=${dash.last}&offset=${dash.logOff}`);
  dash.es = es;
  const mine = (f) => (ev) => { if (dash.es === es && dash.cur === name) f(JSON.parse(ev.data)); };
  es.addEventListener("metrics", mine(addMetrics));
  es.addEventListener("log", mine(addLog));
  es.addEventListener("status", mine(() => refreshRun()));
  es.addEventListener("gone", mine(() => closeStream()));
  es.onerror = () => {
    if (dash.es !== es) return;
    closeStream();
    dash.retryAt = Date.now() + 5000;
  };
  return true;
}
function closeStream() {
  if (dash.es) dash.es.close();
  dash.es = null;
}

function addMetrics(m) {
  for (const p of m.points) if (typeof p.loss === "number" && p.step > dash.last) dash.points.push(p);
  if (m.last_step > dash.last) dash.last = m.last_step;
  if (dash.run) renderHead(dash.run);
  renderCharts();
}

// Events: the log lines that say something happened (the trainer's "step N: ..."
// lines, warnings and errors, health), newest first.
const EVENT = /^step \d+: |\[ctuner\] (WARN|ERROR)|circuit breaker|health|rank \d+ of \d+:|^==== ctuner serve|^ctuner \w+: /;
function addLog(d) {
  if (d.offset < dash.logOff) { dash.events = []; dash.logTail = ""; } // a new log: read from 0
  const text = dash.logTail + d.text, cut = text.lastIndexOf("\n");
  dash.logTail = text.slice(cut + 1);
  for (const line of text.slice(0, cut + 1).split("\n")) if (EVENT.test(line)) dash.events.push(line);
  dash.logOff = d.offset;
  const ev = dash.events.slice(-200).reverse();
  if (ev.length) $("events").replaceChildren(...ev.map((l) => el("li", {
    class: /ERROR|rank \d+ of|circuit|^ctuner \w+: /.test(l) ? "error" : /WARN/.test(l) ? "warn" : "" }, l)));
}

// The run's own state (status, processes, checkpoints, validation): on a
// status event and every tick; one request at a time.
async function refreshRun() {
  const name = dash.cur;
  if (!name) return;
  if (dash.refreshing) { dash.again = true; return; }
  dash.refreshing = true;
  try {
    const run = await api("GET", "runs/" + encodeURIComponent(name));
    if (name !== dash.cur) return;
    if (run.step < dash.last) { // rewritten (a resume from an earlier checkpoint): read it again
      dash.refreshing = false;
      return pick(name, true);
    }
    dash.run = run;
    renderHead(run);
    const ckKey = JSON.stringify(run.checkpoints.map((c) => [c.name, c.complete]));
    if (ckKey !== dash.ckKey) { dash.ckKey = ckKey; renderCheckpoints(run.checkpoints); }
    await pollValidation(name);
  } catch (e) {
    connMsg(e.message);
  } finally {
    dash.refreshing = false;
  }
  if (dash.again) { dash.again = false; refreshRun(); }
}

// Without a stream: the metrics after the last step and the log after the
// last byte, one poll at a time.
async function pollOnce() {
  const name = dash.cur;
  if (!name || dash.polling || dash.es) return;
  dash.polling = true;
  try {
    for (let more = true; more && name === dash.cur;) {
      const m = await api("GET", `runs/${encodeURIComponent(name)}/metrics?since=${dash.last}`);
      if (name !== dash.cur) return;
      addMetrics(m);
      more = m.more;
    }
    while (dash.run && dash.run.has_log && name === dash.cur) {
      const d = await api("GET", `runs/${encodeURIComponent(name)}/log?offset=${dash.logOff}`);
      if (name !== dash.cur) return;
      addLog(d);
      if (d.offset >= d.size) break;
    }
  } catch (e) {
    connMsg(e.message);
  } finally {
    dash.polling = false;
  }
}

function renderHead(run) {
  const st = $("run-status");
  st.textContent = run.status;
  st.className = "badge " + run.status;
  $("run-step").textContent = run.max_train_steps ? `${run.step} / ${run.max_train_steps}` : String(run.step);
  const recent = dash.points.slice(-20).map((p) => p.seconds).filter((s) => s > 0);
  const spi = recent.length ? recent.reduce((a, b) => a + b, 0) / recent.length : NaN;
  const sps = 1 / spi;
  $("run-sps").textContent = isFinite(sps) ? sps.toFixed(2) : "–";
  $("run-eta").textContent = run.status === "running" && run.max_train_steps
    ? fmtTime((run.max_train_steps - run.step) * spi) : "–";
  $("run-ranks").textContent = run.ranks ? `${run.ranks} rank${run.ranks > 1 ? "s" : ""}` +
    (run.status === "running" && run.pid ? ` · pid ${run.pid}` : "") +
    (run.exit_code !== null ? ` · exit ${run.exit_code}` : "") : "";
  // per-process status of a running run: mpirun and each rank (or the one trainer)
  const procs = run.processes || [], states = { R: "running", S: "sleeping", D: "in I/O", Z: "exited", T: "stopped" };
  $("run-procs").hidden = !procs.length;
  $("run-procs").tBodies[0].replaceChildren(...procs.map((p) => el("tr", {},
    el("td", {}, p.rank >= 0 ? `rank ${p.rank}` : p.name), el("td", {}, String(p.pid)),
    el("td", {}, states[p.state] || p.state), el("td", {}, `${p.cpu_s.toFixed(1)} s`), el("td", {}, `${p.rss_mb.toFixed(0)} MB`))));
  // why a failed or stopped run ended: the exit reason and its log's fatal lines
  const why = (run.status === "failed" || run.status === "stopped") && run.exit_reason;
  $("run-why").hidden = !why;
  if (why) {
    $("run-why").className = "why " + run.status;
    $("run-reason").textContent = run.exit_reason;
    $("run-fatal").textContent = (run.fatal || []).join("\n");
    $("run-fatal").hidden = !(run.fatal || []).length;
  }
  $("run-stop").disabled = run.status !== "running" || !run.pid;
  $("run-resume").disabled = run.status === "running" || !run.config;
}

function smooth(ys, a) {
  let s = null;
  return ys.map((y) => {
    if (y === null || !isFinite(y)) return null;
    s = s === null ? y : a * s + (1 - a) * y;
    return s;
  });
}

function renderCharts() {
  const a = +$("smooth").value, log = $("logscale").checked;
  const lo = $("range-lo").value === "" ? -Infinity : +$("range-lo").value;
  const hi = $("range-hi").value === "" ? Infinity : +$("range-hi").value;
  const pts = dash.points.filter((p) => p.step >= lo && p.step <= hi);
  $("points-n").textContent = `${pts.length} points`;
  const xs = pts.map((p) => p.step);
  const series = {
    loss: ["loss", "#2f6fdf"], lr: ["lr", "#2d8a4e"], grad: ["grad_norm", "#b97a00"],
  };
  for (const [id, [field, color]] of Object.entries(series)) {
    const raw = pts.map((p) => (typeof p[field] === "number" && (!log || p[field] > 0) ? p[field] : null));
    const data = id === "lr" ? [xs, raw] : [xs, raw, smooth(raw, a)];
    // the newest values in the heading, without hovering (the legend follows the cursor)
    const n = xs.length - 1;
    $("last-" + id).textContent = n < 0 ? "" : `step ${xs[n]}: ${fmtNum(raw[n])}` +
      (id === "lr" ? "" : ` (smoothed ${fmtNum(data[2][n])})`);
    const host = $("chart-" + id);
    const key = id + (log ? ":log" : ":lin");
    let plot = dash.plots[id];
    if (plot && plot._key !== key) { plot.destroy(); plot = null; }
    if (!plot) {
      const w = Math.max(300, host.clientWidth - 10);
      plot = new uPlot({
        width: w, height: 210, legend: { show: true },
        scales: { x: { time: false }, y: { distr: log ? 3 : 1 } },
        axes: [{ label: "step" }, { size: 70, values: (u, vals) => vals.map(fmtAxis) }],
        series: id === "lr" ? [{ label: "step" }, { label: field, stroke: color, width: 2, points: { show: false } }]
          : [{ label: "step" }, { label: field, stroke: color + "55", width: 1, points: { show: false } },
            { label: field + " (smoothed)", stroke: color, width: 2, points: { show: false } }],
      }, data, host);
      plot._key = key;
      dash.plots[id] = plot;
      if (!dash.resize && window.ResizeObserver) { // the charts follow their panels' width
        dash.resize = new ResizeObserver(() => {
          for (const [pid, pl] of Object.entries(dash.plots))
            pl.setSize({ width: Math.max(300, $("chart-" + pid).clientWidth - 10), height: 210 });
        });
        for (const pid of Object.keys(series)) dash.resize.observe($("chart-" + pid));
      }
    } else {
      plot.setData(data);
    }
  }
}

async function pollValidation(name) {
  const d = await api("GET", `runs/${encodeURIComponent(name)}/validation`);
  if (name !== dash.cur || d.images.length === dash.vcount) return;
  dash.vcount = d.images.length;
  const bystep = new Map();
  for (const im of d.images) {
    if (!bystep.has(im.step)) bystep.set(im.step, []);
    bystep.get(im.step).push(im);
  }
  const all = [...bystep.keys()].sort((x, y) => y - x);
  const steps = dash.vall ? all : all.slice(0, 3);
  const more = all.length > steps.length ? [el("button", { onclick: () => { dash.vall = true; dash.vcount = -1; pollValidation(name); } },
    `show all ${all.length} validation steps`)] : [];
  const base = `/api/runs/${encodeURIComponent(name)}/files/`;
  $("validation").replaceChildren(...(steps.length ? steps.map((s) => el("div", { class: "vstep" },
    el("h3", {}, `step ${s}`),
    el("div", { class: "imgs" }, ...bystep.get(s).map((im) => el("figure", {},
      el("a", { href: base + im.file, target: "_blank" },
        el("img", { src: base + im.file, class: im.grid ? "grid" : "", alt: im.prompt || "grid", loading: "lazy" })),
      el("figcaption", {}, im.grid ? "grid" : (im.prompt || "")))))))
    : [el("p", { class: "muted" }, "No validation images yet.")]), ...more);
}

// `ctuner checkpoint export` on the server: one Flux-layout safetensors file, then its link.
async function exportCkpt(btn, ckpt, dtype) {
  const name = dash.cur;
  btn.disabled = true;
  btn.textContent = "exporting…";
  try {
    const d = await api("POST", `runs/${encodeURIComponent(name)}/export`, { checkpoint: ckpt, dtype });
    btn.replaceWith(el("a", { href: `/api/runs/${encodeURIComponent(name)}/files/${d.file}`, download: d.file.split("/").pop() },
      d.file.split("/").pop()));
  } catch (e) {
    btn.textContent = "export failed";
    btn.title = e.message;
  }
}

function renderCheckpoints(cks) {
  const base = `/api/runs/${encodeURIComponent(dash.cur)}/files/`;
  const rows = [...cks].sort((a, b) => b.step - a.step).map((c) => el("tr", {},
    el("td", {}, String(c.step)),
    el("td", {}, c.complete ? "complete" : "being written"),
    el("td", {}, ...c.files.map((f) => el("a", { href: base + c.name + "/" + f.name, download: f.name },
      `${f.name} (${(f.size / 1048576).toFixed(1)} MB)`))),
    el("td", {}, ...(c.complete ? ["f32", "bf16"].map((dtype) => el("button", { class: "small", onclick: (ev) => exportCkpt(ev.target, c.name, dtype) },
      `export ${dtype}`)) : []))));
  $("checkpoints").tBodies[0].replaceChildren(...(rows.length ? rows
    : [el("tr", {}, el("td", { colspan: 3, class: "muted" }, "none yet"))]));
}

$("smooth").addEventListener("input", () => { $("smooth-v").textContent = (+$("smooth").value).toFixed(2); renderCharts(); });
for (const id of ["logscale", "range-lo", "range-hi"]) $(id).addEventListener("change", renderCharts);
$("run-stop").addEventListener("click", async () => {
  try { await api("POST", `runs/${encodeURIComponent(dash.cur)}/stop`); } catch (e) { alert(e.message); }
  refreshRun();
});
$("run-resume").addEventListener("click", async () => {
  try {
    await api("POST", "runs", { name: dash.cur, ranks: (dash.run && dash.run.ranks) || 1, resume: true });
  } catch (e) { alert(e.message); }
  refreshRun();
});

// ---------------------------------------------------------------- config builder
const builder = {
  keys: null, values: {}, datasets: [], problems: [], checkTimer: null, inited: false,
  async init() {
    if (this.inited) return;
    this.inited = true;
    const d = await api("GET", "keys");
    this.keys = d.keys;
    this.datasets = [{ id: "data", type: "local", instance_data_dir: "", caption_strategy: "textfile", crop: false }];
    this.renderKeys();
    this.renderDatasets();
    for (const id of ["ds-on", "ds-stage", "ds-offopt", "ds-offparam", "ds-bf16", "ds-micro", "ds-accum", "b-ranks"])
      $(id).addEventListener("input", () => this.changed());
    $("ds-on").addEventListener("change", () => this.changed());
    $("b-filter").addEventListener("input", () => this.renderKeys());
    $("b-only-set").addEventListener("change", () => this.renderKeys());
    $("b-add-ds").addEventListener("click", () => {
      this.datasets.push({ id: "data" + (this.datasets.length + 1), type: "local", instance_data_dir: "", caption_strategy: "textfile", crop: false });
      this.renderDatasets(); this.changed();
    });
    $("b-save").addEventListener("click", () => this.save(false));
    $("b-load").addEventListener("change", () => this.load($("b-load").value));
    $("b-launch").addEventListener("click", () => this.save(true));
    $("b-queue").addEventListener("click", () => this.save(true, true));
    this.changed();
  },
  parse(k, text) {
    if (text === "") return undefined;
    if (k.type === "int") return Number.isInteger(+text) ? +text : text;
    if (k.type === "number") return isFinite(+text) ? +text : text;
    if (k.type === "bool") return text === "true";
    return text;
  },
  field(k) {
    const v = this.values[k.name];
    const set = v !== undefined;
    const extra = [];
    let input;
    if (k.type === "bool") {
      input = el("select", { "data-key": k.name }, el("option", { value: "" }, `default (${k.default})`),
        el("option", { value: "true" }, "true"), el("option", { value: "false" }, "false"));
      input.value = set ? String(v) : "";
    } else if (k.choices && k.open) { /* suggestions, and any other value (a checkpoint path) */
      input = el("input", { "data-key": k.name, list: "dl-" + k.name, type: "text",
        placeholder: k.default === null ? "unset" : k.default });
      input.value = set ? String(v) : "";
      extra.push(el("datalist", { id: "dl-" + k.name }, ...k.choices.map((c) => el("option", { value: c }))));
    } else if (k.choices) { /* a fixed list of values: a drop-down */
      input = el("select", { "data-key": k.name }, el("option", { value: "" }, `default (${k.default === null ? "unset" : k.default})`),
        ...k.choices.map((c) => el("option", { value: c }, c)));
      input.value = set ? String(v) : "";
    } else {
      input = el("input", { "data-key": k.name, placeholder: k.default === null ? "unset" : k.default,
        type: "text", inputmode: k.type === "int" || k.type === "number" ? "decimal" : "text" });
      input.value = set ? String(v) : "";
    }
    input.addEventListener("change", () => {
      const nv = this.parse(k, input.value.trim());
      if (nv === undefined) delete this.values[k.name]; else this.values[k.name] = nv;
      this.changed();
    });
    const prob = this.problems.find((p) => !p.warning && p.key === k.name);
    return el("div", { class: "key" + (set ? " set" : "") + (prob ? " problem" : ""), id: "key-" + k.name },
      el("div", { class: "name" }, k.name, el("div", { class: "help" }, `${k.type}${k.models !== "all" ? " · " + k.models : ""}`)),
      input, el("div", { class: "help" }, k.help), ...extra, ...(prob ? [el("div", { class: "err" }, prob.message)] : []));
  },
  // The keys by section (the first rule a name matches), each a collapsible group.
  sections: [
    ["LoRA", /^(lora_|lycoris|validation_lycoris|init_lora|use_dora|flux_lora)/],
    ["precision", /precision|_dtype$|^quantize_via$|^gradient_checkpointing|^num_threads$/],
    ["validation", /^(validation_|num_validation|user_prompt_library|evaluation_type|controlnet|disable_validation)/],
    ["distributed", /^(zero_stage|offload_|reduce_bucket_size|deepspeed_config|distributed_timeout)/],
    ["optimizer", /^(optimizer|adam_|muon_|mup_|lamb_|var_|freeze_step|local_step|max_grad_norm|grad_clip|max_nonfinite|use_ema|ema_)/],
    ["schedule", /^(train_batch_size|gradient_accumulation|max_train_steps|num_train_epochs|learning_rate|lr_|warmup_|seed$|timestep_sampling|logit_|flow_|checkpoint|resume_from)/],
    ["data", /^(resolution|data_backend|aspect_|allow_dataset|disable_bucket|compress_disk|disk_cache|dataloader|minimum_image|caption_|output_dir)/],
    ["logging", /^(report_to|logging_dir|tracker_|webhook_|health_|disk_low|disable_progress|output_aws)/],
    ["model", /./],
  ],
  section(name) { return this.sections.find(([, re]) => re.test(name))[0]; },
  renderKeys() {
    const f = $("b-filter").value.trim().toLowerCase(), only = $("b-only-set").checked;
    const keys = this.keys.filter((k) => (!f || k.name.includes(f) || k.help.toLowerCase().includes(f)) &&
      (!only || this.values[k.name] !== undefined) && k.name !== "output_dir" && k.name !== "data_backend_config");
    this.closed = this.closed || new Set();
    const order = ["model", "data", "optimizer", "schedule", "precision", "distributed", "LoRA", "validation", "logging"];
    $("b-keys").replaceChildren(...order.map((sec) => {
      const ks = keys.filter((k) => this.section(k.name) === sec);
      if (!ks.length) return "";
      const nset = ks.filter((k) => this.values[k.name] !== undefined).length;
      const d = el("details", { class: "section", "data-section": sec },
        el("summary", {}, sec[0].toUpperCase() + sec.slice(1), el("span", { class: "muted small" }, ` ${ks.length} keys` + (nset ? `, ${nset} set` : ""))),
        ...ks.map((k) => this.field(k)));
      d.open = !this.closed.has(sec) || !!f; // a filter opens every section it matches
      d.addEventListener("toggle", () => { if (d.open) this.closed.delete(sec); else this.closed.add(sec); });
      return d;
    }));
  },
  renderDatasets() {
    const fields = [["id", "text"], ["instance_data_dir", "text"], ["caption_strategy", ["textfile", "filename", "instanceprompt", "parquet"]],
      ["resolution", "text"], ["repeats", "text"], ["crop", ["false", "true"]]];
    $("b-datasets").replaceChildren(...this.datasets.map((ds, i) => el("div", { class: "dataset grid2" },
      ...fields.map(([name, kind]) => {
        let inp;
        if (Array.isArray(kind)) {
          inp = el("select", { "data-ds": name }, ...kind.map((o) => el("option", {}, o)));
          inp.value = String(ds[name] ?? kind[0]);
        } else {
          inp = el("input", { "data-ds": name, value: ds[name] ?? "" });
        }
        inp.addEventListener("change", () => {
          let v = inp.value.trim();
          if (name === "crop") v = v === "true";
          else if ((name === "resolution" || name === "repeats") && v !== "" && isFinite(+v)) v = +v;
          if (v === "") delete ds[name]; else ds[name] = v;
          this.changed();
        });
        return el("label", {}, name + " ", inp);
      }),
      el("button", { onclick: () => { this.datasets.splice(i, 1); this.renderDatasets(); this.changed(); } }, "remove"))));
  },
  deepspeed() {
    if (!$("ds-on").checked) return null;
    const z = { stage: +$("ds-stage").value };
    if ($("ds-offopt").value !== "none") z.offload_optimizer = { device: $("ds-offopt").value };
    if ($("ds-offparam").value !== "none") z.offload_param = { device: $("ds-offparam").value };
    const d = { train_micro_batch_size_per_gpu: +$("ds-micro").value, gradient_accumulation_steps: +$("ds-accum").value, zero_optimization: z };
    if ($("ds-bf16").checked) d.bf16 = { enabled: true };
    return d;
  },
  config() {
    const c = { ...this.values };
    const ds = this.deepspeed();
    if (ds) c.deepspeed_config = ds;
    return c;
  },
  arithmetic() {
    const world = Math.max(1, +$("b-ranks").value || 1);
    const ds = this.deepspeed();
    const defBatch = +((this.keys.find((k) => k.name === "train_batch_size") || {}).default) || 1;
    const micro = ds ? ds.train_micro_batch_size_per_gpu : (this.values.train_batch_size ?? defBatch);
    const accum = ds ? ds.gradient_accumulation_steps : (this.values.gradient_accumulation_steps ?? 1);
    $("ds-arith").textContent = `effective batch = ${micro} per rank × ${accum} accumulation × ${world} rank${world > 1 ? "s" : ""} = ${micro * accum * world} samples per optimizer step`;
  },
  changed() {
    $("ds-fields").hidden = !$("ds-on").checked; // the DeepSpeed values only when it is used
    this.arithmetic();
    const cfg = this.config();
    const text = JSON.stringify(cfg, null, 2);
    $("b-json").textContent = text;
    $("dl-config").href = URL.createObjectURL(new Blob([text], { type: "application/json" }));
    const bt = JSON.stringify(this.datasets, null, 2);
    $("b-backend-json").textContent = bt;
    $("dl-backend").href = URL.createObjectURL(new Blob([bt], { type: "application/json" }));
    clearTimeout(this.checkTimer);
    this.checkTimer = setTimeout(() => this.check(), 300);
  },
  showProblems(chk) {
    this.problems = chk.problems;
    const box = $("b-problems");
    const errs = chk.problems.filter((p) => !p.warning), warns = chk.problems.filter((p) => p.warning);
    const line = (p) => el("li", {}, (p.where ? p.where + ": " : "") + p.message);
    box.replaceChildren(chk.ok ? el("p", { class: "okmsg" }, `config checks out for ${chk.world} rank${chk.world > 1 ? "s" : ""}`)
      : el("p", { class: "err", id: "b-problem" }, `${errs.length} problem${errs.length > 1 ? "s" : ""}: ` + errs.map((p) => p.message).join("; ")),
      ...(errs.length > 1 ? [el("ul", { class: "err" }, ...errs.map(line))] : []),
      ...(warns.length ? [el("p", { class: "help" }, `${warns.length} warning${warns.length > 1 ? "s" : ""} (no effect here):`),
        el("ul", { class: "help" }, ...warns.map(line))] : []));
    for (const e of document.querySelectorAll(".key.problem")) {
      e.classList.remove("problem");
      e.querySelector(".err")?.remove();
    }
    for (const p of chk.problems) {
      const row = !p.warning && p.key && $("key-" + p.key);
      if (row) { row.classList.add("problem"); row.append(el("div", { class: "err" }, p.message)); }
    }
    // a dataset's problem marks its field (instance_data_dir, ...) in the dataset entries
    for (const e of document.querySelectorAll("#b-datasets [data-ds]")) {
      const dsp = chk.problems.find((p) => !p.warning && p.where && p.where.startsWith("multidatabackend.json") &&
        (p.key === e.dataset.ds || p.message.includes(`'${e.dataset.ds}'`)));
      e.classList.toggle("problem-field", !!dsp);
      e.title = dsp ? dsp.message : "";
    }
    if (chk.resolved) {
      const r = chk.resolved;
      const world = chk.world;
      $("ds-arith").textContent += ` · resolved: train_batch_size ${r.train_batch_size} × gradient_accumulation_steps ${r.gradient_accumulation_steps} × ${world} = ${r.train_batch_size * r.gradient_accumulation_steps * world}`;
    }
  },
  async check() {
    const world = Math.max(1, +$("b-ranks").value || 1);
    try {
      // with the datasets: checked as `ctuner config check` reads multidatabackend.json
      const chk = await api("POST", "config/check?world=" + world, { config: this.config(), backend: this.datasets });
      this.showProblems(chk);
    } catch (e) { $("b-msg").textContent = e.message; }
  },
  fillLoad() {
    const sel = $("b-load"), cur = sel.value;
    sel.replaceChildren(el("option", { value: "" }, "—"), ...dash.runs.map((r) => el("option", { value: r.name }, r.name)));
    sel.value = cur;
  },
  // The saved config.json (and multidatabackend.json) of a run into the form.
  async load(name) {
    if (!name) return;
    try {
      const run = await api("GET", "runs/" + encodeURIComponent(name));
      if (!run.config) { $("b-msg").textContent = `run '${name}' has no saved config.json`; return; }
      this.values = {};
      for (const [k0, v] of Object.entries(run.config)) {
        const k = k0.replace(/^--/, "");
        if (k === "output_dir" || k === "data_backend_config") continue;
        if (k === "deepspeed_config" && v && typeof v === "object") {
          const z = v.zero_optimization || {};
          $("ds-on").checked = true;
          $("ds-stage").value = String(z.stage ?? 0);
          $("ds-offopt").value = (z.offload_optimizer && z.offload_optimizer.device) || "none";
          $("ds-offparam").value = (z.offload_param && z.offload_param.device) || "none";
          $("ds-bf16").checked = !!(v.bf16 && v.bf16.enabled);
          $("ds-micro").value = v.train_micro_batch_size_per_gpu ?? 1;
          $("ds-accum").value = v.gradient_accumulation_steps ?? 1;
          continue;
        }
        this.values[k] = v;
      }
      const r = await fetch(`/api/runs/${encodeURIComponent(name)}/files/multidatabackend.json`, { credentials: "same-origin" });
      if (r.ok) this.datasets = await r.json();
      $("b-name").value = name;
      if (run.ranks) $("b-ranks").value = run.ranks;
      this.renderDatasets();
      this.renderKeys();
      this.changed();
      $("b-msg").textContent = `loaded run '${name}'`;
    } catch (e) { $("b-msg").textContent = "error: " + e.message; }
  },
  async save(andLaunch, queue) {
    const name = $("b-name").value.trim(), ranks = Math.max(1, +$("b-ranks").value || 1);
    $("b-msg").textContent = "saving…";
    try {
      const d = await api("POST", `runs/${encodeURIComponent(name)}/config?world=${ranks}`,
        { config: this.config(), backend: this.datasets });
      if (d.error) throw new Error(d.error);
      this.showProblems(d.check);
      if (!d.check.ok) { $("b-msg").textContent = "saved, but the config has a problem (not launched)"; return; }
      $("b-msg").textContent = `saved ${d.saved.join(", ")} in run '${name}'`;
      if (andLaunch) {
        await api("POST", "runs", queue ? { name, ranks, resume: false, queue: true } : { name, ranks, resume: false });
        launch.select(name, ranks);
        location.hash = "#launch";
      }
      loadRuns();
    } catch (e) { $("b-msg").textContent = "error: " + e.message; }
  },
};

// ---------------------------------------------------------------- launch
const launch = {
  offset: 0, run: null, timer: null,
  fillRuns() {
    const sel = $("l-run");
    const cur = this.run || sel.value;
    sel.replaceChildren(...dash.runs.map((r) => el("option", { value: r.name }, `${r.name} (${r.status})`)));
    if (cur) sel.value = cur;
    this.run = sel.value || null;
  },
  select(name, ranks) {
    this.run = name;
    if (ranks) $("l-ranks").value = ranks;
    this.offset = 0;
    $("l-log").textContent = "";
    loadRuns();
  },
  async refresh() { // one at a time: two readers of the log would show it twice
    if (this.busy) return;
    this.busy = true;
    try {
      await this.refreshQueue().catch((e) => { $("l-msg").textContent = e.message; });
      if (this.run) await this.refreshOnce();
    } finally { this.busy = false; }
  },
  async refreshOnce() {
    const name = this.run;
    try {
      const run = await api("GET", "runs/" + encodeURIComponent(name));
      $("l-status").textContent = run.status + (run.exit_code !== null ? ` (exit ${run.exit_code})` : "");
      $("l-status").className = "badge " + run.status;
      $("l-why").textContent = run.exit_reason && run.status !== "finished"
        ? [run.exit_reason, ...(run.fatal || [])].join("\n") : "";
      $("l-why").hidden = !$("l-why").textContent;
      $("l-stop").disabled = run.status !== "running" || !run.pid;
      $("l-start").disabled = $("l-resume").disabled = run.status === "running" || !run.config;
      if (!run.has_log) return;
      for (;;) {
        const d = await api("GET", `runs/${encodeURIComponent(name)}/log?offset=${this.offset}`);
        if (name !== this.run) return;
        if (d.offset < this.offset) $("l-log").textContent = "";
        const pre = $("l-log"), atEnd = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
        pre.textContent += d.text;
        if (atEnd) pre.scrollTop = pre.scrollHeight;
        this.offset = d.offset;
        if (d.offset >= d.size) break;
      }
    } catch (e) { $("l-msg").textContent = e.message; }
  },
  async queueRun() {
    try {
      const d = await api("POST", "runs", { name: this.run, ranks: Math.max(1, +$("l-ranks").value || 1),
        resume: $("l-q-resume").checked, queue: true });
      $("l-msg").textContent = `queued '${d.name}' (place ${d.position})`;
    } catch (e) { $("l-msg").textContent = e.message; }
    this.refreshQueue();
  },
  // The queue (with a remove button per run), refused queued starts, the history.
  async refreshQueue() {
    const d = await api("GET", "queue");
    const ago = (t) => t ? new Date(t * 1000).toLocaleTimeString() : "–";
    $("queue").tBodies[0].replaceChildren(...(d.queue.length ? d.queue.map((q) => el("tr", { "data-run": q.name },
      el("td", {}, String(q.position)), el("td", {}, q.name), el("td", {}, String(q.ranks)),
      el("td", {}, q.resume === null ? "config's" : q.resume ? "latest" : "fresh"),
      el("td", {}, el("button", { class: "small", onclick: async () => {
        try { await api("POST", "queue/remove", { name: q.name }); } catch (e) { $("l-msg").textContent = e.message; }
        this.refreshQueue();
      } }, "remove"))))
      : [el("tr", {}, el("td", { colspan: 5, class: "muted" }, "empty"))]));
    $("queue-refused").replaceChildren(...d.refused.map((x) => el("li", { class: "error" }, `${x.name}: not started: ${x.error}`)));
    $("history").tBodies[0].replaceChildren(...(d.history.length ? d.history.map((h) => el("tr", { "data-run": h.name },
      el("td", {}, h.name), el("td", { class: h.exit_code && !h.stopped ? "error" : "" }, h.stopped ? `stopped (${h.exit_code})` : String(h.exit_code)),
      el("td", {}, fmtNum(h.final_loss)), el("td", {}, h.seconds === null ? "–" : fmtTime(h.seconds)), el("td", {}, ago(h.ended))))
      : [el("tr", {}, el("td", { colspan: 5, class: "muted" }, "none yet"))]));
  },
  async start(resume) {
    try {
      await api("POST", "runs", { name: this.run, ranks: Math.max(1, +$("l-ranks").value || 1), resume });
      $("l-msg").textContent = resume ? "resumed" : "started";
    } catch (e) { $("l-msg").textContent = e.message; }
    this.refresh();
  },
};
$("l-run").addEventListener("change", () => launch.select($("l-run").value));
$("l-start").addEventListener("click", () => launch.start(false));
$("l-queue").addEventListener("click", () => launch.queueRun());
$("l-resume").addEventListener("click", () => launch.start(true));
$("l-stop").addEventListener("click", async () => {
  try { await api("POST", `runs/${encodeURIComponent(launch.run)}/stop`); $("l-msg").textContent = "stopping (SIGTERM)"; }
  catch (e) { $("l-msg").textContent = e.message; }
  launch.refresh();
});

// ---------------------------------------------------------------- polling
// The run list, and the picked run's state, every 2 s (metrics and log come
// by its stream); every second, polling, while the stream is down.
async function tick() {
  await loadRuns();
  if (!$("view-dashboard").hidden && dash.cur) {
    refreshRun();
    if (!dash.es && !(Date.now() >= dash.retryAt && openStream())) await pollOnce();
  }
  if (!$("view-launch").hidden) await launch.refresh();
  setTimeout(tick, dash.es ? 2000 : 1000);
}
show();
tick();
