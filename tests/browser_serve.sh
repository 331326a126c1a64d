#!/usr/bin/env bash
# Browser test of the web UI (docs/webui.md): Debian's Chromium driven by
# Playwright (npm playwright-core, pinned, installed into build/npm-tools) —
# start `ctuner serve` on a temporary root, build a config in the form (keys
# by section, drop-downs for keys with a fixed set of values; a bad value shows
# its problem next to the field, then is fixed; datasets; the
# DeepSpeed/ZeRO section's effective-batch arithmetic), save and launch a
# 2-rank run through mpirun from the page, watch the loss chart gain points
# and a validation grid appear, stop it, resume it from the latest checkpoint
# and see it finish with every step logged once; every event of the log shown
# once (after a load and a reload), by the run's event stream; a failing run's
# exit reason and fatal log line on the dashboard; two runs queued from the
# launch view running one after the other, in the history.
#   tests/browser_serve.sh path/to/ctuner            the test
#   CT_SCREENSHOTS=docs/img tests/browser_serve.sh … also write webui-dashboard.png and webui-builder.png there
# Needs chromium (scripts/deps.sh) and node + npm; fails (does not skip)
# without them, like tests/parquet_interop.sh.
. "$(dirname "$0")/lib/common.sh"
# The page starts a 2-rank run through mpirun: Open MPI's own start-up
# allocations are not ours to chase under ASan (cli_serve checks the server's).
export ASAN_OPTIONS=${ASAN_OPTIONS:-}:detect_leaks=0
export OMP_NUM_THREADS=1
src="$(cd "$(dirname "$0")/.." && pwd)"
CHROME=${CT_CHROMIUM:-/usr/bin/chromium}
[ -x "$CHROME" ] || { bad "$CHROME not found: scripts/deps.sh installs Debian's chromium"; exit 1; }
command -v node >/dev/null && command -v npm >/dev/null || { bad "node and npm are needed (scripts/deps.sh)"; exit 1; }
tools="$src/build/npm-tools" pw="playwright-core@1.65.1"
have=$(node -e "try{console.log(require('$tools/node_modules/playwright-core/package.json').version)}catch(e){}" 2>/dev/null || true)
if [ "$have" != "${pw##*@}" ]; then
  mkdir -p "$tools"
  npm install --prefix "$tools" --no-audit --no-fund --silent --save-exact "$pw" >&2 ||
    { bad "npm could not install $pw into $tools (npm registry unreachable?)"; exit 1; }
fi

"$CT" dataset synth --out "$tmp/data" --count 16 --seed 3 >/dev/null || { bad "dataset synth"; exit 1; }
mkdir -p "$tmp/root"
CTUNER_FAULT_STEP_DELAY_MS=15 "$CT" serve --root "$tmp/root" --port 0 > "$tmp/serve.out" 2>&1 &
spid=$!
"$CT" serve --root "$tmp/root" --port 0 --token tok-browser-123 > "$tmp/serve_tok.out" 2>&1 &
tpid=$!
trap 'kill $spid $tpid 2>/dev/null; kill_serve_runs "$tmp/root"; sleep 1; rm -rf "$tmp"' EXIT
# (deadlines of a minute: the ASan pass on a loaded 2-core machine is 10x slower)
for _ in $(seq 600); do grep -q '^serving' "$tmp/serve.out" && break; kill -0 $spid 2>/dev/null || break; sleep 0.1; done
port=$(sed -nE 's/^serving .*:([0-9]+)\/.*/\1/p' "$tmp/serve.out")
for _ in $(seq 600); do grep -q '^serving' "$tmp/serve_tok.out" && break; kill -0 $tpid 2>/dev/null || break; sleep 0.1; done
tport=$(sed -nE 's/^serving .*:([0-9]+)\/.*/\1/p' "$tmp/serve_tok.out")
[ -n "$port" ] || { bad "serve did not start: $(cat "$tmp/serve.out")"; exit 1; }
shots=${CT_SCREENSHOTS:-}
[ -n "$shots" ] && shots=$(mkdir -p "$shots" && cd "$shots" && pwd)

cat > "$tmp/drive.cjs" <<'JS'
const { chromium } = require(process.env.PW);
const [url, data, chrome, profile, shots, tokurl] = process.argv.slice(2);
const log = (m) => console.log(m);
const t0 = Date.now();
(async () => {
  // paced by CTUNER_FAULT_STEP_DELAY_MS=15 (set for the server below): at least 15 s (1000 steps),
  // so Stop comes before the end on any machine (tiny steps alone took 1.5 ms on a
  // Zen 5, and 1,500 of them ended before the page had clicked Stop)
  const STEPS = +process.env.STEPS;
  // a fresh profile (--user-data-dir), as Playwright wants it given
  const browser = await chromium.launchPersistentContext(profile, { executablePath: chrome, headless: true,
    viewport: { width: 1400, height: 1000 }, args: [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync"] });
  const page = browser.pages()[0] || await browser.newPage();
  // (Playwright's 30 s for a click was exceeded by a starved Chromium in a stress run)
  browser.setDefaultTimeout(120000);
  const errors = [];
  page.on("pageerror", (e) => errors.push(String(e)));
  page.on("dialog", (d) => { errors.push("dialog: " + d.message()); d.dismiss(); });
  page.on("response", (r) => { if (r.status() >= 400 && r.request().method() !== "POST") errors.push(`${r.status()} for ${r.url()}`); });
  page.on("response", (r) => { if (r.request().method() === "POST") log(`  POST ${r.url().replace(url, "/")}: ${r.status()}`); });
  let blockStream = false; // while the test refuses /stream, the browser's own messages about it
  page.on("console", (m) => { if (m.type() === "error" && !(blockStream && /ERR_FAILED|stream/.test(m.text()))) errors.push(m.text()); });
  page.on("request", (r) => { if (!r.url().startsWith(url) && !r.url().startsWith("blob:") && !r.url().startsWith("data:")) errors.push("external request: " + r.url()); });
  await page.goto(url + "#builder");
  await page.waitForSelector("#key-learning_rate");
  log("ok - the builder lists the keys from /api/keys: " + await page.locator(".key").count());
  // the default dataset has no directory yet: an error before launch, marked on its field
  await page.waitForFunction(() => /instance_data_dir/.test(document.querySelector("#b-problems .err")?.textContent || "") &&
    document.querySelector('.dataset [data-ds="instance_data_dir"]').classList.contains("problem-field"), null, { timeout: 10000 });
  log("ok - the check runs the dataset checks: " + (await page.textContent("#b-problems .err")).slice(0, 120));
  const setKey = async (k, v) => {
    await page.fill("#b-filter", k);
    const inp = page.locator(`#key-${k} [data-key="${k}"]`);
    if (await inp.evaluate((e) => e.tagName) === "SELECT") await inp.selectOption(String(v)); else await inp.fill(String(v));
    await inp.dispatchEvent("change");
  };
  await page.fill("#b-name", "tiny2");
  await page.fill("#b-ranks", "2");
  await page.dispatchEvent("#b-ranks", "input");
  const ds = page.locator(".dataset").first();
  await ds.locator('[data-ds="id"]').fill("shapes");
  await ds.locator('[data-ds="id"]').dispatchEvent("change");
  await ds.locator('[data-ds="instance_data_dir"]').fill(data);
  await ds.locator('[data-ds="instance_data_dir"]').dispatchEvent("change");
  for (const [k, v] of [["preset", "tiny"], ["resolution", 8], ["aspect_bucket_alignment", 8], ["learning_rate", "0.001"],
    ["seed", 7], ["max_train_steps", STEPS], ["checkpoint_step_interval", 25], ["validation_step_interval", 50],
    ["validation_prompt", "a red circle"], ["validation_num_inference_steps", 2], ["optimizer", "adamw"],
    ["lr_scheduler", "constant"], ["learning_rate", "-1"]]) await setKey(k, v);
  // the bad learning rate: its problem appears next to the field
  await page.fill("#b-filter", "learning_rate");
  await page.waitForSelector("#key-learning_rate.problem .err", { timeout: 10000 });
  log("ok - a problem is shown next to its field: " + (await page.textContent("#key-learning_rate .err")).trim());
  await setKey("learning_rate", "0.001");
  await page.waitForSelector("#b-problems .okmsg", { timeout: 10000 });
  // the keys by section; a drop-down for every key with a fixed set of values
  await page.fill("#b-filter", "");
  const sections = await page.locator("#b-keys details.section").evaluateAll((ds) => ds.map((d) => d.dataset.section));
  const drops = await page.evaluate(() => ["optimizer", "lr_scheduler", "preset", "mixed_precision", "report_to"].map((k) => {
    const e = document.querySelector(`[data-key="${k}"]`);
    return e.tagName === "SELECT" ? [...e.options].map((o) => o.value).filter((v) => v).length : 0;
  }).concat([document.querySelectorAll("#dl-resume_from_checkpoint option").length]));
  const hasNone = await page.evaluate(() => [...document.querySelector('[data-key="report_to"]').options].some((o) => o.value === "none"));
  log((sections.join(",") === "model,data,optimizer,schedule,precision,distributed,LoRA,validation,logging" && drops.every((n) => n >= 2) && hasNone ? "ok" : "FAIL") +
    ` - keys in sections (${sections.join(", ")}); drop-downs: optimizer ${drops[0]}, lr_scheduler ${drops[1]}, preset ${drops[2]}, mixed_precision ${drops[3]}, report_to ${drops[4]} (none too), resume_from_checkpoint ${drops[5]} suggestions`);
  log((await page.isHidden("#ds-stage") ? "ok" : "FAIL") + " - the DeepSpeed values are hidden until it is used");
  // DeepSpeed: ZeRO-1, micro batch 2 per rank, accumulation 1, 2 ranks
  await page.check("#ds-on"); await page.dispatchEvent("#ds-on", "input");
  await page.selectOption("#ds-stage", "1"); await page.dispatchEvent("#ds-stage", "input");
  await page.fill("#ds-micro", "2"); await page.dispatchEvent("#ds-micro", "input");
  await page.waitForFunction(() => document.querySelector("#b-problems .okmsg") &&
    /resolved: train_batch_size 2 × gradient_accumulation_steps 1 × 2 = 4/.test(document.querySelector("#ds-arith").textContent), null, { timeout: 10000 });
  log("ok - effective batch shown live: " + await page.textContent("#ds-arith"));
  await page.fill("#b-filter", "");
  await page.check("#b-only-set"); await page.dispatchEvent("#b-only-set", "change");
  if (shots) await page.screenshot({ path: shots + "/webui-builder.png", fullPage: false });
  // save and launch (2 ranks through mpirun)
  await page.click("#b-launch");
  await page.waitForFunction(() => location.hash === "#launch", null, { timeout: 15000 });
  await page.waitForFunction(() => /mpirun -np 2/.test(document.querySelector("#l-log").textContent), null, { timeout: 20000 });
  log("ok - launched from the page; its log streams: " + (await page.textContent("#l-log")).split("\n")[0].slice(0, 90));
  // the dashboard: the chart gains points, a validation grid appears
  await page.goto(url + "#dashboard");
  await page.click('#run-list li[data-run="tiny2"]');
  const points = async () => +((await page.textContent("#points-n")).split(" ")[0] || 0);
  await page.waitForFunction(() => parseInt(document.querySelector("#points-n").textContent) >= 3, null, { timeout: 60000 });
  const p1 = await points();
  await page.waitForFunction((n) => parseInt(document.querySelector("#points-n").textContent) > n + 5, p1, { timeout: 60000 });
  const p2 = await points();
  log(`ok - the loss chart gained points while training: ${p1} -> ${p2}`);
  await page.waitForFunction(() => /rank 0/.test(document.querySelector("#run-procs").textContent) &&
    /rank 1/.test(document.querySelector("#run-procs").textContent), null, { timeout: 20000 });
  await page.waitForFunction(() => /step \d+: checkpoint/.test(document.querySelector("#events").textContent), null, { timeout: 30000 });
  log("ok - events from the log: " + (await page.locator("#events li").first().textContent()).slice(0, 80));
  // every event once: the page read the log twice after a load (two polls from offset 0)
  // (a line can be in the log twice — each rank warns — so: never more often than in the log)
  const onceEach = async (when) => {
    const evs = await page.locator("#events li").allTextContents();
    const logLines = await page.evaluate(async () => {
      let off = 0, text = "";
      for (;;) {
        const d = await (await fetch(`/api/runs/tiny2/log?offset=${off}`)).json();
        text += d.text; off = d.offset;
        if (d.offset >= d.size) return text.split("\n");
      }
    });
    const count = (v, l) => v.filter((x) => x === l).length;
    const twice = [...new Set(evs)].filter((l) => count(evs, l) > count(logLines, l));
    log((twice.length ? "FAIL" : "ok") + ` - ${when}: every event once (${evs.length} events)` + (twice.length ? "; twice: " + twice.slice(0, 3).join(" | ") : ""));
  };
  await onceEach("after the page load");
  await page.reload();
  await page.waitForFunction(() => /step \d+: checkpoint/.test(document.querySelector("#events").textContent), null, { timeout: 30000 });
  await page.waitForTimeout(2500);
  await onceEach("after a reload");
  const sse = await page.evaluate(() => !!(dash.es && dash.es.readyState === EventSource.OPEN));
  log((sse ? "ok" : "FAIL") + " - live updates come by the run's event stream (/stream)");
  log("ok - per-rank status: " + (await page.locator("#run-procs tbody tr").evaluateAll((rows) => rows.map((r) => [...r.cells].map((c) => c.textContent).join(" ")))).join(" | "));
  await page.waitForSelector("#validation img.grid", { timeout: 60000 });
  const ok_img = await page.locator("#validation img.grid").first().evaluate((im) => im.complete && im.naturalWidth > 0);
  log((ok_img ? "ok" : "FAIL") + " - a validation grid appeared (" + await page.locator("#validation h3").first().textContent() + ")");
  // stop, then resume
  await page.click("#run-stop");
  await page.waitForFunction(() => document.querySelector("#run-status").textContent === "stopped", null, { timeout: 40000 });
  const stoppedAt = await points();
  log(`ok - stopped from the page at ${stoppedAt} points (${await page.textContent("#run-ranks")})`);
  await page.click("#run-resume");
  await page.waitForFunction(() => document.querySelector("#run-status").textContent === "running", null, { timeout: 20000 });
  log("ok - resumed from the page");
  // more points after the resume (60 more, or up to the end when the stop came late: the stop
  // is graceful, so the resume starts at the stop's own step)
  await page.waitForFunction((n) => parseInt(document.querySelector("#points-n").textContent) > Math.min(n[0] + 60, n[1] - 1), [stoppedAt, STEPS], { timeout: 120000 });
  await page.waitForFunction(() => document.querySelectorAll("#checkpoints tbody tr td a").length > 0, null, { timeout: 60000 });
  await page.check("#logscale"); await page.dispatchEvent("#logscale", "change");
  await page.waitForTimeout(1500);
  if (shots) await page.screenshot({ path: shots + "/webui-dashboard.png", fullPage: true });
  await page.uncheck("#logscale"); await page.dispatchEvent("#logscale", "change");
  await page.waitForFunction(() => document.querySelector("#run-status").textContent === "finished", null, { timeout: 240000 });
  const m = await page.evaluate(async () => (await (await fetch("/api/runs/tiny2/metrics")).json()).points.map((p) => p.step));
  const once = m.length === STEPS && m.every((s, i) => s === i + 1);
  log((once ? "ok" : "FAIL") + ` - finished after the resume; metrics steps 1..${STEPS} once each (${m.length} lines)`);
  await page.locator("#checkpoints button", { hasText: "export bf16" }).first().click();
  const exp = page.locator("#checkpoints a", { hasText: "-bf16.safetensors" }).first();
  await exp.waitFor({ timeout: 60000 });
  log("ok - a checkpoint exported from the page: " + await exp.textContent());
  const run = await page.evaluate(async () => (await fetch("/api/runs/tiny2")).json());
  log((run.ranks === 2 && run.exit_code === 0 ? "ok" : "FAIL") + ` - ${run.ranks} ranks, exit code ${run.exit_code}`);
  // the builder loads the run's saved config back into the form
  await page.goto(url + "#builder");
  await page.selectOption("#b-load", "tiny2");
  await page.waitForFunction(() => /loaded run 'tiny2'/.test(document.querySelector("#b-msg").textContent), null, { timeout: 10000 });
  await page.fill("#b-filter", "max_train_steps");
  const loaded = [await page.inputValue('[data-key="max_train_steps"]'), await page.inputValue("#ds-micro"),
    await page.inputValue('.dataset [data-ds="id"]'), await page.inputValue("#b-ranks")];
  log((loaded.join(",") === `${STEPS},2,shapes,2` ? "ok" : "FAIL") + " - the builder loads a run's config back: " + loaded.join(","));
  // the stream refused: the page polls instead, every point and event once, then takes the stream back
  blockStream = true;
  await page.route("**/stream?*", (r) => r.abort());
  await page.goto(url + "#dashboard");
  await page.reload();
  await page.waitForFunction((n) => dash.cur === "tiny2" && dash.points.length === n && !dash.es &&
    /step \d+: checkpoint/.test(document.querySelector("#events").textContent), STEPS, { timeout: 30000 });
  await onceEach("polling, the stream refused");
  await page.unroute("**/stream?*");
  blockStream = false;
  await page.waitForFunction(() => dash.es && dash.es.readyState === EventSource.OPEN, null, { timeout: 20000 });
  log(`ok - polling while the stream was refused (${STEPS} points), and back on the stream once it answers`);
  // a run that fails says why on the dashboard: its exit reason and the log's fatal line
  await page.evaluate(async (dir) => {
    const post = (p, b) => fetch(p, { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(b) });
    await post("/api/runs/broken/config", { config: { preset: "tiny", resolution: 8, max_train_steps: 5 },
      backend: [{ id: "data", type: "local", instance_data_dir: dir + "/missing", caption_strategy: "textfile" }] });
    await post("/api/runs", { name: "broken" });
  }, data);
  await page.goto(url + "#dashboard");
  await page.waitForSelector('#run-list li[data-run="broken"]', { timeout: 10000 });
  await page.click('#run-list li[data-run="broken"]');
  await page.waitForFunction(() => !document.querySelector("#run-why").hidden &&
    /not a directory/.test(document.querySelector("#run-fatal").textContent), null, { timeout: 30000 });
  if (shots) await page.screenshot({ path: shots + "/webui-failed.png", fullPage: false });
  log(`ok - a failed run says why: ${await page.textContent("#run-status")}: ${await page.textContent("#run-reason")} / ` +
    (await page.textContent("#run-fatal")).slice(0, 100));
  // the queue: two runs queued from the launch view start one after the other
  await page.evaluate(async (dir) => {
    for (const n of ["qa", "qb"]) await fetch(`/api/runs/${n}/config`, { method: "POST", headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ config: { preset: "tiny", resolution: 8, aspect_bucket_alignment: 8, max_train_steps: 30, learning_rate: 0.001 },
        backend: [{ id: "shapes", type: "local", instance_data_dir: dir, caption_strategy: "textfile", crop: false }] }) });
  }, data);
  await page.goto(url + "#launch");
  await page.waitForSelector('#l-run option[value="qb"]', { state: "attached", timeout: 10000 });
  for (const n of ["qa", "qb"]) {
    await page.selectOption("#l-run", n);
    await page.click("#l-queue");
    await page.waitForFunction((n) => document.querySelector("#l-msg").textContent.includes(`queued '${n}'`), n, { timeout: 10000 });
  }
  await page.waitForFunction(() => document.querySelectorAll('#history tr[data-run="qa"], #history tr[data-run="qb"]').length === 2, null, { timeout: 60000 });
  const hist = await page.locator("#history tbody tr").evaluateAll((rows) => rows.map((r) => [...r.cells].map((c) => c.textContent).join(" ")));
  const q = await page.evaluate(async () => (await (await fetch("/api/queue")).json()).history.filter((h) => h.name[0] === "q"));
  const inOrder = q.length === 2 && q[0].name === "qb" && q[1].name === "qa" && q[0].started >= q[1].ended && q.every((h) => h.exit_code === 0);
  log((inOrder ? "ok" : "FAIL") + " - two runs queued from the page ran one after the other; history: " + hist.slice(0, 3).join(" | "));
  if (shots) await page.screenshot({ path: shots + "/webui-queue.png", fullPage: false });
  // a server with a token, opened without it: the page says what to do
  const tokPage = await browser.newPage();
  await tokPage.goto(tokurl);
  await tokPage.waitForFunction(() => /this server needs its access token: open the URL it printed/.test(document.querySelector("#conn").textContent), null, { timeout: 10000 });
  log("ok - without its token the page says: " + await tokPage.textContent("#conn"));
  await tokPage.close();
  log((errors.length ? "FAIL" : "ok") + " - no page errors and no request outside the server" + (errors.length ? ": " + errors.join("; ") : ""));
  log(`  (${((Date.now() - t0) / 1000).toFixed(1)} s in the browser)`);
  await browser.close();
})().catch((e) => { console.log("FAIL - " + e.message.split("\n")[0]); process.exit(1); });
JS
# 1000 steps of 15 ms or more; 300 in the ASan pass (CT_TEST_REDUCED, docs/testing.md),
# whose unoptimised 2-rank steps take several times longer each: the stop still
# comes long before the end
steps=1000
[ -n "${CT_TEST_REDUCED:-}" ] && steps=300
out=$(STEPS=$steps PW="$tools/node_modules/playwright-core" node "$tmp/drive.cjs" "http://127.0.0.1:$port/" "$tmp/data" "$CHROME" "$tmp/profile" "$shots" "http://127.0.0.1:$tport/" 2>&1)
echo "$out"
echo "$out" | grep -q '^FAIL' && fail=1
[ "$(echo "$out" | grep -c '^ok')" -ge 10 ] || { echo "FAIL - the browser run ended early"; fail=1; }
[ $fail = 1 ] && { echo "--- train.log"; tail -20 "$tmp/root/tiny2/train.log" 2>/dev/null; }
exit $fail
