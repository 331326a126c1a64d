#!/usr/bin/env bash
# End-to-end test of `ctuner serve` (docs/webui.md) with curl against a
# temporary root: every API endpoint, a run started, stopped (SIGTERM) and
# resumed through the API, metrics read while being written (partial last
# line), the token rules (missing, wrong, Bearer, cookie, a generated one),
# the loopback Host check, path traversal (.., %2F, absolute, symlinks in and
# out of the root, hidden files) and oversized bodies.
# Usage: tests/cli_serve.sh path/to/ctuner
. "$(dirname "$0")/lib/common.sh"
export OMP_NUM_THREADS=1
command -v curl >/dev/null || { echo "FAIL - curl not found: run scripts/deps.sh"; exit 1; }
root="$tmp/root"
mkdir -p "$root"
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; kill_serve_runs "$root"; sleep 0.3; [ -n "${CT_SERVE_KEEP_LOGS:-}" ] && cat "$tmp"/*.out >&2; rm -rf "$tmp"' EXIT

# Every wait below polls for its event with a deadline of minutes: the ASan
# pass on a loaded 2-core machine is 10x slower, and a deadline only matters
# when the thing waited for never comes.
# start_serve OUTFILE ARGS...: starts ctuner serve, sets $port (waits for its line,
# or for the server to exit: a port taken)
start_serve() {
  local out=$1; shift
  "$CT" serve "$@" > "$out" 2>&1 &
  pids+=($!)
  for _ in $(seq 600); do grep -qs '^serving' "$out" && break; kill -0 "${pids[-1]}" 2>/dev/null || break; sleep 0.1; done
  # one that exited (a port taken) is reaped and forgotten: its pid may be reused
  # (pid_max is 32768 on the shared machine) before the exit trap's kill
  kill -0 "${pids[-1]}" 2>/dev/null || { wait "${pids[-1]}" 2>/dev/null; unset 'pids[-1]'; }
  port=$(sed -nE 's/^serving .*:([0-9]+)\/.*/\1/p' "$out")
}
# The runs it starts are paced (CTUNER_FAULT_STEP_DELAY_MS, 50 ms before every step):
# r1 must be seen running at step 8 and stopped before its 120th step; unpaced, a
# fast machine ran all 120 tiny steps in about a second, between two polls.
CTUNER_FAULT_STEP_DELAY_MS=50 start_serve "$tmp/serve.out" --root "$root" --port 0
[ -n "$port" ] && ok "serve started on port $port" || { bad "serve did not start: $(cat "$tmp/serve.out")"; exit 1; }
U="http://127.0.0.1:$port"
# code URL [curl args]: the HTTP status; the body in $tmp/body
code() { local u=$1; shift; curl -s -o "$tmp/body" -w '%{http_code}' "$@" "$u"; }
post() { local u=$1; shift; code "$u" -X POST -H 'Content-Type: application/json' "$@"; }
jq_() { /usr/bin/python3 -c "import json,sys; d=json.load(open('$tmp/body')); print(($1))"; }

# ---- the page and the loopback rules ----
[ "$(code "$U/")" = 200 ] && grep -qi '<html' "$tmp/body" && ok "GET / serves the page" || bad "GET /: $(head -c 200 "$tmp/body")"
[ "$(code "$U/api/runs" -H "Host: evil.example:$port")" = 403 ] && ok "a foreign Host header is refused (DNS rebinding)" || bad "foreign Host: $(cat "$tmp/body")"
[ "$(code "$U/api/runs" -H "Host: localhost:$port")" = 200 ] && ok "Host localhost:PORT is accepted" || bad "localhost Host refused"
[ "$(code "$U/api/runs")" = 200 ] && [ "$(jq_ 'len(d["runs"])')" = 0 ] && ok "GET /api/runs: empty root" || bad "empty runs: $(cat "$tmp/body")"
[ "$(code "$U/api/config/check" -X POST -d '{}')" = 415 ] && ok "a POST that is not application/json is refused" || bad "form POST accepted"
[ "$(code "$U/api/nothing")" = 404 ] && ok "unknown endpoint: 404" || bad "unknown endpoint"
[ "$(code "$U/api/keys" -X DELETE)" = 404 ] && ok "wrong method: 404" || bad "wrong method"

# ---- keys and config check ----
[ "$(code "$U/api/keys")" = 200 ] && [ "$(jq_ 'len(d["keys"]) > 100 and any(k["name"]=="learning_rate" and k["type"] and k["help"] for k in d["keys"])')" = True ] &&
  ok "GET /api/keys: the key registry ($(jq_ 'len(d["keys"])') keys)" || bad "keys: $(head -c 300 "$tmp/body")"
[ "$(jq_ '[k["choices"] for k in d["keys"] if k["name"] in ("mixed_precision_x", "timestep_sampling", "model_type", "learning_rate")]')" = "[['full', 'lora', 'vae'], None, ['logit_normal', 'uniform']]" ] &&
  ok "GET /api/keys: allowed values of a fixed-list key (for its drop-down), null otherwise" || bad "choices: $(jq_ '[(k["name"], k["choices"]) for k in d["keys"]][:12]')"
[ "$(post "$U/api/config/check" -d '{"learning_rat": 1e-4}')" = 200 ] &&
  [ "$(jq_ 'd["ok"], d["problems"][0]["key"]')" = "(False, 'learning_rat')" ] && ok "config check: unknown key named" || bad "check unknown: $(cat "$tmp/body")"
post "$U/api/config/check" -d '{"optimizer": "adamq"}' >/dev/null
[ "$(jq_ 'd["problems"][0]["key"]')" = optimizer ] && ok "config check: bad value names its key" || bad "check bad value: $(cat "$tmp/body")"
post "$U/api/config/check" -d '{"learning_rat": 1e-4,
 "optimizer": "adamq", "push_to_hub": true}' >/dev/null
[ "$(jq_ '[(p["key"], p["where"], p["warning"]) for p in d["problems"]]')" = "[('learning_rat', 'config:1:18', False), ('push_to_hub', 'config:2:39', True), ('optimizer', 'config:2:15', False)]" ] &&
  ok "config check: every problem at once, with its place; a no-effect key is a warning" || bad "check all: $(head -c 900 "$tmp/body")"
post "$U/api/config/check" -d '{"learning_rate": 2e-4, "train_batch_size": 3}' >/dev/null
[ "$(jq_ 'd["ok"], d["resolved"]["learning_rate"], d["resolved"]["train_batch_size"]')" = "(True, 0.0002, 3)" ] &&
  ok "config check: a good config, resolved" || bad "check good: $(head -c 300 "$tmp/body")"
post "$U/api/config/check?world=2" -d '{"deepspeed_config": {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 3, "zero_optimization": {"stage": 2}}}' >/dev/null
[ "$(jq_ 'd["ok"], d["world"], d["resolved"]["train_batch_size"], d["resolved"]["gradient_accumulation_steps"]')" = "(True, 2, 2, 3)" ] &&
  ok "config check: a DeepSpeed config folded for 2 ranks" || bad "check deepspeed: $(head -c 400 "$tmp/body")"
[ "$(post "$U/api/config/check" -d '{"a": ')" = 200 ] && [ "$(jq_ 'd["ok"]')" = False ] && ok "config check: broken JSON is a problem" || bad "broken JSON: $(cat "$tmp/body")"

# ---- oversized bodies ----
head -c 2000000 /dev/zero | tr '\0' ' ' > "$tmp/big"
[ "$(post "$U/api/config/check" --data-binary @"$tmp/big")" = 413 ] && ok "a 2 MB body (Content-Length) is refused: 413" || bad "big body: $(head -c 200 "$tmp/body")"
[ "$(post "$U/api/config/check" -H 'Transfer-Encoding: chunked' --data-binary @"$tmp/big")" = 413 ] && ok "a 2 MB chunked body is refused: 413" || bad "big chunked body"
[ "$(code "$U/api/runs")" = 200 ] && ok "the server still answers after them" || bad "server gone after big bodies"

# ---- a run: save its config, start, watch, stop, resume ----
"$CT" dataset synth --out "$tmp/data" --count 16 --seed 3 >/dev/null || { bad "dataset synth"; exit 1; }
cat > "$tmp/run.json" <<JSON
{"config": {"--preset": "tiny", "--resolution": 8, "--aspect_bucket_alignment": 8, "--train_batch_size": 4,
  "--learning_rate": 1e-3, "--seed": 7, "max_train_steps": 120, "checkpoint_step_interval": 4,
  "validation_step_interval": 8, "validation_prompt": "a red circle", "validation_num_inference_steps": 2,
  "output_dir": "/somewhere/else"},
 "backend": [{"id": "shapes", "type": "local", "instance_data_dir": "$tmp/data", "caption_strategy": "textfile", "crop": false}]}
JSON
[ "$(post "$U/api/runs/r1/config" --data-binary @"$tmp/run.json")" = 200 ] && [ "$(jq_ 'd["check"]["ok"]')" = True ] &&
  grep -q "\"output_dir\": \"$root/r1\"" "$root/r1/config.json" && grep -q "$root/r1/multidatabackend.json" "$root/r1/config.json" &&
  ok "POST /api/runs/r1/config writes config.json (output_dir in the run) and multidatabackend.json" || bad "save: $(cat "$tmp/body")"
[ "$(post "$U/api/runs" -d '{"name": "r1", "ranks": 0}')" = 400 ] && ok "ranks 0 refused" || bad "ranks 0"
[ "$(post "$U/api/runs" -d '{"name": "../r1"}')" = 400 ] && ok "a run name with .. refused" || bad "start ../r1: $(cat "$tmp/body")"
[ "$(post "$U/api/runs" -d '{"name": "nope"}')" = 404 ] && ok "start without a saved config: 404" || bad "start nope"
[ "$(post "$U/api/runs" -d '{"name": "r1", "ranks": 1, "resume": false}')" = 202 ] && ok "POST /api/runs starts r1 (pid $(jq_ 'd["pid"]'))" || bad "start: $(cat "$tmp/body")"
[ "$(post "$U/api/runs" -d '{"name": "r1"}')" = 409 ] && ok "starting a running run: 409" || bad "double start: $(cat "$tmp/body")"
# wait for a checkpoint at step >= 8
for _ in $(seq 3000); do
  code "$U/api/runs/r1" >/dev/null
  [ "$(jq_ 'd["status"]=="running" and any(c["step"]>=8 and c["complete"] for c in d["checkpoints"])')" = True ] && break
  [ "$(jq_ 'd["status"]')" = running ] || break
  sleep 0.1
done
[ "$(jq_ 'd["status"], d["ranks"], d["has_log"]')" = "('running', 1, True)" ] && ok "GET /api/runs/r1: running, 1 rank, a log" || bad "run status: $(head -c 400 "$tmp/body")"
[ "$(jq_ 'd["config"]["max_train_steps"]')" = 120 ] && ok "GET /api/runs/r1 carries its config" || bad "run config"
[ "$(jq_ '[(p["name"], p["rank"], p["pid"] == d["pid"]) for p in d["processes"]]')" = "[('ctuner', -1, True)]" ] &&
  ok "GET /api/runs/r1 lists its process" || bad "processes: $(jq_ 'd["processes"]')"
[ "$(post "$U/api/runs/r1/stop")" = 202 ] && ok "POST /api/runs/r1/stop" || bad "stop: $(cat "$tmp/body")"
for _ in $(seq 1200); do code "$U/api/runs/r1" >/dev/null; [ "$(jq_ 'd["status"]')" = stopped ] && break; sleep 0.1; done
[ "$(jq_ 'd["status"], d["exit_code"]')" = "('stopped', 5)" ] && ok "stopped by SIGTERM, gracefully (exit code 5 recorded)" || bad "after stop: $(head -c 300 "$tmp/body")"
stopped_at=$(jq_ 'd["step"]')
ckpt=$(jq_ 'max(c["step"] for c in d["checkpoints"] if c["complete"])')
[ "$ckpt" = "$stopped_at" ] && ok "the stop wrote the checkpoint of its last step ($ckpt)" || bad "stopped at $stopped_at, newest checkpoint $ckpt"
[ "$(post "$U/api/runs/r1/stop")" = 409 ] && ok "stopping a stopped run: 409" || bad "stop again"
[ "$(code "$U/api/runs/r1/log")" = 200 ] && [ "$(jq_ '"ctuner serve: starting" in d["text"] and "step" in d["text"]')" = True ] &&
  ok "GET /api/runs/r1/log: the run's output" || bad "log: $(head -c 300 "$tmp/body")"
off=$(jq_ 'd["offset"]')
[ "$(code "$U/api/runs/r1/log?offset=$off")" = 200 ] && [ "$(jq_ 'd["text"]')" = "" ] && ok "log from its end offset is empty" || bad "log offset"
# resume from the latest checkpoint and let it finish
[ "$(post "$U/api/runs" -d '{"name": "r1", "ranks": 1, "resume": true}')" = 202 ] && ok "resume r1" || bad "resume: $(cat "$tmp/body")"
for _ in $(seq 6000); do code "$U/api/runs/r1" >/dev/null; [ "$(jq_ 'd["status"]')" = running ] || break; sleep 0.1; done
[ "$(jq_ 'd["status"], d["exit_code"], d["step"]')" = "('finished', 0, 120)" ] && ok "resumed run finished at step 120 (stopped at $stopped_at, checkpoint $ckpt)" ||
  bad "after resume: $(head -c 300 "$tmp/body"); log: $(tail -5 "$root/r1/train.log")"
grep -q "\"from_step\": $ckpt" "$root/r1/train.log" && ok "the resume started from checkpoint-$ckpt" || bad "resume step: $(grep from_step "$root/r1/train.log")"
code "$U/api/runs/r1/metrics" >/dev/null
[ "$(jq_ '[p["step"] for p in d["points"]] == list(range(1, 121)) and d["last_step"] == 120')" = True ] &&
  ok "GET metrics: steps 1..120 once each" || bad "metrics: $(head -c 300 "$tmp/body")"
code "$U/api/runs/r1/metrics?since=115" >/dev/null
[ "$(jq_ '[p["step"] for p in d["points"]]')" = "[116, 117, 118, 119, 120]" ] && ok "metrics?since=115" || bad "since: $(head -c 300 "$tmp/body")"
[ "$(code "$U/api/runs/r1/metrics?since=x")" = 400 ] && ok "metrics?since=x: 400" || bad "since=x"
code "$U/api/runs" >/dev/null
[ "$(jq_ '[(r["name"], r["status"], r["step"]) for r in d["runs"]]')" = "[('r1', 'finished', 120)]" ] && ok "GET /api/runs lists r1 finished" || bad "runs: $(cat "$tmp/body")"
code "$U/api/runs/r1/validation" >/dev/null
[ "$(jq_ 'sorted(set(i["step"] for i in d["images"])) == list(range(8, 121, 8)) and any(i["prompt"] == "a red circle" for i in d["images"]) and any(i["grid"] for i in d["images"])')" = True ] &&
  ok "GET validation: grids and images at steps 8, 16, ..., 120 with their prompt" || bad "validation: $(head -c 400 "$tmp/body")"
img=$(jq_ 'd["images"][0]["file"]')
[ "$(code "$U/api/runs/r1/files/$img")" = 200 ] && head -c 8 "$tmp/body" | grep -q PNG && ok "a validation image is served" || bad "image $img"
[ "$(code "$U/api/runs/r1/files/checkpoint-120/training_state.json")" = 200 ] && grep -q '"global_step": 120' "$tmp/body" && ok "a checkpoint file is served (download)" || bad "ckpt file"

# ---- server-sent events ----
# (a stream never ends by itself: each is read until what the test waits for has
# come, or for 120 s, instead of for a fixed 3 s that a loaded machine can miss)
# sse_start URL FILE: reads URL's stream into FILE in the background ($sse_pid)
sse_start() { curl -sN --max-time 120 "$1" > "$2" 2>/dev/null & sse_pid=$!; }
# sse_until CMD...: polls CMD until it succeeds or the stream ends; then ends the stream
sse_until() {
  for _ in $(seq 1200); do "$@" && break; kill -0 $sse_pid 2>/dev/null || break; sleep 0.1; done
  kill $sse_pid 2>/dev/null; wait $sse_pid 2>/dev/null
}
cat > "$tmp/sse_check.py" <<'PY'
import json, sys
ev = {}
for block in open(sys.argv[1]).read().split("\n\n"):
    lines = dict(l.split(": ", 1) for l in block.split("\n") if ": " in l and not l.startswith(":"))
    if "event" in lines: ev.setdefault(lines["event"], []).append(json.loads(lines["data"]))
ok = [p["step"] for p in ev["metrics"][0]["points"]] == [116, 117, 118, 119, 120]
ok &= ev["status"][0]["status"] == "finished" and "ctuner serve: starting" in ev["log"][0]["text"]
sys.exit(0 if ok else 1)
PY
sse_check() { /usr/bin/python3 "$tmp/sse_check.py" "$tmp/sse" 2>/dev/null; }
sse_start "$U/api/runs/r1/stream?since=115" "$tmp/sse"
sse_until sse_check
sse_check && ok "GET stream: metrics after 115, the log and the status as server-sent events" || bad "stream: $(head -c 400 "$tmp/sse")"

# ---- export a checkpoint (ctuner checkpoint export) and download it ----
[ "$(post "$U/api/runs/r1/export" -d '{"checkpoint": "checkpoint-120", "dtype": "bf16"}')" = 200 ] &&
  [ "$(jq_ 'd["file"]')" = exports/checkpoint-120-bf16.safetensors ] && ok "POST export: checkpoint-120 as bf16" || bad "export: $(cat "$tmp/body")"
[ "$(code "$U/api/runs/r1/files/exports/checkpoint-120-bf16.safetensors")" = 200 ] &&
  /usr/bin/python3 -c "
import json, struct, sys
b = open('$tmp/body', 'rb').read(); n = struct.unpack('<Q', b[:8])[0]; h = json.loads(b[8:8 + n])
sys.exit(0 if all(v['dtype'] == 'BF16' for k, v in h.items() if k != '__metadata__') and len(h) > 10 else 1)" &&
  ok "the exported file downloads: safetensors, every tensor BF16" || bad "exported file"
[ "$(post "$U/api/runs/r1/export" -d '{"checkpoint": "../r1", "dtype": "bf16"}')" = 400 ] && ok "export of ../r1 refused" || bad "export ..: $(cat "$tmp/body")"
[ "$(post "$U/api/runs/r1/export" -d '{"checkpoint": "checkpoint-7"}')" = 404 ] && ok "export of a missing checkpoint: 404" || bad "export missing: $(cat "$tmp/body")"
[ "$(post "$U/api/runs/r1/export" -d '{"checkpoint": "checkpoint-120", "dtype": "fp8"}')" = 400 ] && ok "export dtype fp8 refused" || bad "export fp8"

# ---- a run directory being written while read ----
mkdir -p "$root/live"
/usr/bin/python3 - "$root/live/metrics.jsonl" "$U/api/runs/live/metrics" <<'PY' && ok "metrics read while written: every answer parses, steps 1..300 once, in order" || bad "live metrics"
import json, sys, threading, time, urllib.request
path, url = sys.argv[1], sys.argv[2]
def writer():
    with open(path, "w") as f:
        for s in range(1, 301):
            line = json.dumps({"step": s, "loss": 1.0 / s, "lr": 1e-3, "grad_norm": 0.5}) + "\n"
            k = len(line) // 2
            f.write(line[:k]); f.flush(); time.sleep(0.0005)  # a partial line on disk
            f.write(line[k:]); f.flush()
t = threading.Thread(target=writer); t.start()
seen, since, polls, deadline = [], -1, 0, time.time() + 300
while True:
    alive = t.is_alive()
    d = json.load(urllib.request.urlopen(f"{url}?since={since}"))
    polls += 1
    steps = [p["step"] for p in d["points"]]
    seen += steps
    since = d["last_step"]
    if not alive and since == 300: break
    if time.time() > deadline: break
t.join()
print(f"  {polls} polls", file=sys.stderr)
sys.exit(0 if seen == list(range(1, 301)) else 1)
PY
code "$U/api/runs/live" >/dev/null
[ "$(jq_ 'd["status"], d["step"], d["pid"], d["has_log"]')" = "('running', 300, 0, False)" ] &&
  ok "a run started elsewhere counts as running while its metrics.jsonl changes" || bad "external run: $(head -c 300 "$tmp/body")"
touch -d '2 minutes ago' "$root/live/metrics.jsonl"
code "$U/api/runs/live" >/dev/null
[ "$(jq_ 'd["status"]')" = stopped ] && ok "... and as stopped after 60 s without a change" || bad "external run idle: $(head -c 300 "$tmp/body")"
sse_start "$U/api/runs/live/stream?since=300" "$tmp/sse2"
# the stream's first look sends the status: then it is streaming
for _ in $(seq 1200); do grep -q '^event: status' "$tmp/sse2" && break; sleep 0.1; done
echo '{"step": 301, "loss": 0.5}' >> "$root/live/metrics.jsonl"
new_line() { grep -q '^data: {"points": \[{"step": 301, "loss": 0.5}\], "last_step": 301' "$tmp/sse2"; }
sse_until new_line
new_line && ok "a line written while streaming arrives as an event" ||
  bad "live stream: $(cat "$tmp/sse2")"
sed -i '$d' "$root/live/metrics.jsonl"
printf '{"step": 301, "loss": 0.1' >> "$root/live/metrics.jsonl"
code "$U/api/runs/live/metrics?since=300" >/dev/null
[ "$(jq_ 'd["points"], d["last_step"]')" = "([], 300)" ] && ok "a partial last line is not answered" || bad "partial line: $(cat "$tmp/body")"
printf '}\n' >> "$root/live/metrics.jsonl"
code "$U/api/runs/live/metrics?since=300" >/dev/null
[ "$(jq_ '[p["step"] for p in d["points"]]')" = "[301]" ] && ok "... and is once complete" || bad "completed line: $(cat "$tmp/body")"

# ---- a long run: answers in pages of 20,000 lines, the tail read for a recent since ----
mkdir -p "$root/long"
/usr/bin/python3 -c "
import json
with open('$root/long/metrics.jsonl', 'w') as f:
    for s in range(1, 100001): f.write(json.dumps({'step': s, 'loss': 1.0 / s, 'lr': 1e-4, 'grad_norm': 0.5}) + '\n')"
code "$U/api/runs/long/metrics" >/dev/null
[ "$(jq_ 'len(d["points"]), d["points"][-1]["step"], d["last_step"], d["more"]')" = "(20000, 20000, 20000, True)" ] &&
  ok "metrics of a 100,000-step run: the first 20,000 and more: true" || bad "long metrics: $(head -c 200 "$tmp/body")"
code "$U/api/runs/long/metrics?since=99990" >/dev/null
[ "$(jq_ '[p["step"] for p in d["points"]] == list(range(99991, 100001)), d["more"]')" = "(True, False)" ] &&
  ok "metrics?since=99990 of it: the last 10" || bad "long since: $(head -c 200 "$tmp/body")"
code "$U/api/runs/long/metrics?since=50000" >/dev/null
[ "$(jq_ 'd["points"][0]["step"], len(d["points"])')" = "(50001, 20000)" ] && ok "metrics?since=50000 of it: from 50001" || bad "long mid: $(head -c 200 "$tmp/body")"

# ---- paths outside the root ----
echo TOPSECRET > "$tmp/secret.txt"
ln -s "$tmp/secret.txt" "$root/r1/link.txt"
ln -s "$tmp" "$root/outside"
ln -s "$root/r1/validation_images" "$root/r1/vlink"
touch "$root/r1/.hidden"
t_refused() { # name, expected codes regex, url suffix, [curl args]
  local n=$1 want=$2 u=$3; shift 3
  c=$(code "$U$u" "$@")
  [[ "$c" =~ ^($want)$ ]] && ! grep -q TOPSECRET "$tmp/body" && ok "refused: $n ($c)" || bad "$n: got $c: $(head -c 200 "$tmp/body")"
}
t_refused "../ in a file path" "400|403|404" "/api/runs/r1/files/../../secret.txt" --path-as-is
t_refused "%2F-encoded ../" "403" "/api/runs/r1/files/..%2F..%2Fsecret.txt"
t_refused "%2e%2e" "403" "/api/runs/r1/files/%2e%2e/%2e%2e/secret.txt" --path-as-is
t_refused "an absolute path" "403" "/api/runs/r1/files//etc/passwd" --path-as-is
t_refused "%2F-encoded absolute path" "403" "/api/runs/r1/files/%2Fetc%2Fpasswd"
t_refused "a run name of .." "400|404" "/api/runs/../files/secret.txt" --path-as-is
t_refused "a run name of %2e%2e" "400" "/api/runs/%2e%2e/files/secret.txt"
t_refused "a symlink to a file outside" "403" "/api/runs/r1/files/link.txt"
t_refused "a symlinked run directory" "404" "/api/runs/outside/files/secret.txt"
t_refused "a symlinked directory inside the run" "403|404" "/api/runs/r1/files/vlink/$(basename "$img")"
t_refused "a hidden file" "403" "/api/runs/r1/files/.hidden"
t_refused "a NUL byte" "400|403|404" "/api/runs/r1/files/config.json%00.png"
code "$U/api/runs" >/dev/null
[ "$(jq_ 'sorted(r["name"] for r in d["runs"])')" = "['live', 'long', 'r1']" ] && ok "the symlinked run is not listed" || bad "list with symlink: $(cat "$tmp/body")"
[ "$(post "$U/api/runs/outside/config" --data-binary @"$tmp/run.json")" = 403 ] && [ ! -e "$tmp/config.json" ] &&
  ok "saving a config through a symlinked run is refused, nothing written outside" || bad "write through symlink: $(cat "$tmp/body")"
[ "$(post "$U/api/runs/%2e%2e/config" --data-binary @"$tmp/run.json")" = 400 ] && [ ! -e "$tmp/config.json" ] && ok "saving into .. is refused" || bad "save .."

# ---- links a request or a run would follow, NULs in names (each failed before the fix) ----
cp -r "$root/r1/checkpoint-120" "$tmp/outside-ckpt"
ln -s "$tmp/outside-ckpt" "$root/r1/checkpoint-999"
[ "$(post "$U/api/runs/r1/export" -d '{"checkpoint": "checkpoint-999"}')" = 403 ] && [ ! -e "$root/r1/exports/checkpoint-999-f32.safetensors" ] &&
  ok "export of a checkpoint-N that is a link to outside the root: 403, nothing exported" || bad "export through a link: $(cat "$tmp/body")"
cp -r "$root/r1/checkpoint-120" "$root/r1/checkpoint-998"
rm "$root/r1/checkpoint-998/model.safetensors"; ln -s "$tmp/outside-ckpt/model.safetensors" "$root/r1/checkpoint-998/model.safetensors"
[ "$(post "$U/api/runs/r1/export" -d '{"checkpoint": "checkpoint-998"}')" = 403 ] && grep -q "checkpoint-998/model.safetensors" "$tmp/body" &&
  [ ! -e "$root/r1/exports/checkpoint-998-f32.safetensors" ] && ok "export of a checkpoint holding a linked file: 403, the link named" || bad "export of a checkpoint with a link: $(cat "$tmp/body")"
rm -rf "$root/r1/checkpoint-998"
code "$U/api/runs/r1" >/dev/null
[ "$(jq_ 'any(c["name"] == "checkpoint-999" for c in d["checkpoints"])')" = False ] && ok "a linked checkpoint is not listed" || bad "linked checkpoint listed"
cp "$root/r1/$img" "$tmp/outside.png"
ln -s "$tmp/outside.png" "$root/r1/validation_images/step_999_grid.png"
code "$U/api/runs/r1/validation" >/dev/null
[ "$(jq_ 'any(i["step"] == 999 for i in d["images"])')" = False ] && ok "the validation listing leaves out a linked image" || bad "linked image listed: $(head -c 300 "$tmp/body")"
printf '{"learning_rate": TOPSECRET\n' > "$tmp/secret.json"
mkdir -p "$root/cfglink"; ln -s "$tmp/secret.json" "$root/cfglink/config.json"
[ "$(post "$U/api/runs" -d '{"name": "cfglink"}')" = 403 ] && sleep 0.5 && [ ! -e "$root/cfglink/train.log" ] &&
  ok "a start whose config.json is a link to outside: 403, no trainer reads it" || bad "start through a linked config: $(cat "$tmp/body")"
code "$U/api/runs/cfglink/log" >/dev/null; ! grep -q TOPSECRET "$tmp/body" && ok "... and its log quotes nothing of it" || bad "the log quotes the linked config"
[ "$(post "$U/api/runs/rl/config" --data-binary @"$tmp/run.json")" = 200 ] || bad "save rl: $(cat "$tmp/body")"
ln -s "$tmp/outside-ckpt" "$root/rl/checkpoint-500"
[ "$(post "$U/api/runs" -d '{"name": "rl", "resume": true}')" = 403 ] && grep -q "checkpoint-500" "$tmp/body" && [ ! -e "$root/rl/train.log" ] &&
  ok "a resume that a linked checkpoint would feed: 403, the link named" || bad "resume through a link: $(cat "$tmp/body")"
rm "$root/rl/checkpoint-500"
mkdir -p "$tmp/direct"; ln -s "$tmp/outside-ckpt" "$tmp/direct/checkpoint-500"
"$CT" train --config "$root/rl/config.json" --output_dir "$tmp/direct" --max_train_steps=1 --validation_step_interval=0 \
  --resume_from_checkpoint=latest > "$tmp/direct.log" 2>&1
grep -q "ignoring $tmp/direct/checkpoint-500: not a directory" "$tmp/direct.log" && grep -q '"step": 1,' "$tmp/direct/metrics.jsonl" &&
  ok "ctuner train: resume's latest ignores a linked checkpoint" || bad "latest through a link: $(tail -5 "$tmp/direct.log")"
[ "$(post "$U/api/runs" -d '{"name": "r1\u0000/../../x"}')" = 400 ] && ok "a run name with a NUL inside (\\u0000) is refused, not cut short" || bad "NUL name: $(cat "$tmp/body")"
[ "$(post "$U/api/runs/r1/export" -d '{"checkpoint": "checkpoint-120\u0000/../../x"}')" = 400 ] && ok "a checkpoint name with a NUL inside is refused" || bad "NUL checkpoint: $(cat "$tmp/body")"
[ "$(post "$U/api/runs/r1/export" -d '{"checkpoint": "checkpoint-120", "dtype": "f32\u0000x"}')" = 400 ] &&
  [ "$(post "$U/api/runs/nul/config" -d '{"config": {"validation_prompt": "a\u0000b"}}')" = 400 ] && [ ! -e "$root/nul" ] &&
  ok "any other string with a NUL inside is refused (not saved cut short)" || bad "NUL string: $(cat "$tmp/body")"
/usr/bin/python3 - "$tmp/run.json" "$tmp/run_out.json" "$tmp/elsewhere" <<'PY'
import json, sys
d = json.load(open(sys.argv[1])); d["backend"][0]["cache_dir_vae"] = sys.argv[3] + "/vae"
json.dump(d, open(sys.argv[2], "w"))
PY
post "$U/api/runs/outw/config" --data-binary @"$tmp/run_out.json" >/dev/null
[ "$(post "$U/api/runs" -d '{"name": "outw"}')" = 403 ] && grep -q "cache_dir_vae" "$tmp/body" && [ ! -e "$tmp/elsewhere" ] &&
  ok "a start whose cache_dir_vae leaves the root: 403, by name" || bad "cache outside: $(cat "$tmp/body")"
/usr/bin/python3 - "$tmp/run.json" "$tmp/run_out.json" "$tmp/elsewhere" <<'PY'
import json, sys
d = json.load(open(sys.argv[1])); d["config"]["logging_dir"] = sys.argv[3]
json.dump(d, open(sys.argv[2], "w"))
PY
post "$U/api/runs/outw/config" --data-binary @"$tmp/run_out.json" >/dev/null
[ "$(post "$U/api/runs" -d '{"name": "outw"}')" = 403 ] && grep -q "logging_dir" "$tmp/body" && [ ! -e "$tmp/elsewhere" ] &&
  ok "a start whose logging_dir leaves the root: 403, by name" || bad "logging_dir outside: $(cat "$tmp/body")"

# ---- the builder's check: the datasets as `ctuner config check` sees them ----
chk() { post "$U/api/config/check" -d "{\"config\": {\"preset\": \"tiny\"}, \"backend\": [{\"id\": \"data\", \"type\": \"local\", $1 \"caption_strategy\": \"textfile\"}]}" >/dev/null; }
chk '"instance_data_dir": "",'
[ "$(jq_ 'd["ok"], any("instance_data_dir" in p["message"] for p in d["problems"])')" = "(False, True)" ] &&
  ok "check: an empty instance_data_dir is an error before launch" || bad "empty dir: $(cat "$tmp/body")"
chk ''
[ "$(jq_ 'd["ok"], any("instance_data_dir" in p["message"] for p in d["problems"])')" = "(False, True)" ] &&
  ok "check: a dataset without instance_data_dir is an error" || bad "no dir: $(cat "$tmp/body")"
chk "\"instance_data_dir\": \"$tmp/no-such-dir\","
[ "$(jq_ 'd["ok"], any("no-such-dir" in p["message"] for p in d["problems"])')" = "(False, True)" ] &&
  ok "check: a missing instance_data_dir directory is an error" || bad "missing dir: $(cat "$tmp/body")"
chk "\"instance_data_dir\": \"$tmp/data\","
[ "$(jq_ 'd["ok"]')" = True ] && ok "check: a dataset with its directory checks out" || bad "good dataset: $(cat "$tmp/body")"

# ---- a failed run says why; a run of `ctuner train` served later shows its real state ----
/usr/bin/python3 - "$tmp/run.json" "$tmp/run_bad.json" "$tmp/no-such-dir" <<'PY'
import json, sys
d = json.load(open(sys.argv[1])); d["backend"][0]["instance_data_dir"] = sys.argv[3]
json.dump(d, open(sys.argv[2], "w"))
PY
post "$U/api/runs/bad/config" --data-binary @"$tmp/run_bad.json" >/dev/null
[ "$(post "$U/api/runs" -d '{"name": "bad"}')" = 202 ] || bad "start bad: $(cat "$tmp/body")"
for _ in $(seq 3000); do code "$U/api/runs/bad" >/dev/null; [ "$(jq_ 'd["status"]')" = running ] || break; sleep 0.1; done
[ "$(jq_ 'd["status"], d["exit_code"], "exit 1" in d["exit_reason"]')" = "('failed', 1, True)" ] &&
  ok "a run that exits 1: failed, with its exit reason ($(jq_ 'd["exit_reason"]'))" || bad "failed run: $(head -c 600 "$tmp/body")"
[ "$(jq_ 'any("no-such-dir" in l and l.startswith("ctuner train: ") for l in d["fatal"])')" = True ] &&
  ok "... and the fatal line of its log: $(jq_ 'd["fatal"][-1]')" || bad "fatal lines: $(jq_ 'd["fatal"]')"
code "$U/api/runs/r1" >/dev/null
[ "$(jq_ 'd["exit_reason"], d["fatal"]')" = "('finished: exit 0', [])" ] && ok "a finished run: its exit reason, no fatal lines" || bad "finished why: $(jq_ 'd["exit_reason"], d["fatal"]')"
"$CT" train --config "$root/rl/config.json" --output_dir "$root/ext" --max_train_steps=8 --checkpoint_step_interval=4 \
  --validation_step_interval=0 > "$tmp/ext.log" 2>&1 || bad "ctuner train ext: $(tail -3 "$tmp/ext.log")"
cp -r "$root/ext" "$root/ext2"; rm -rf "$root/ext2/checkpoint-8"; head -5 "$root/ext/metrics.jsonl" > "$root/ext2/metrics.jsonl"
touch -d '2 minutes ago' "$root/ext2/metrics.jsonl"
code "$U/api/runs" >/dev/null
[ "$(jq_ '[(r["name"], r["status"], r["step"], r["max_train_steps"]) for r in d["runs"] if r["name"].startswith("ext")]')" = "[('ext', 'finished', 8, 8), ('ext2', 'stopped', 5, 8)]" ] &&
  ok "runs of ctuner train served later: finished 8/8, stopped 5/8 (max_train_steps from their checkpoints)" || bad "ctuner train runs: $(cat "$tmp/body")"

# ---- the queue: runs start one after another; a history with exit, final loss and time ----
/usr/bin/python3 - "$tmp/run.json" "$tmp/run_q.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1])); d["config"].update({"max_train_steps": 16, "validation_step_interval": 0})
json.dump(d, open(sys.argv[2], "w"))
PY
for q in q1 q2 q3; do post "$U/api/runs/$q/config" --data-binary @"$tmp/run_q.json" >/dev/null; done
[ "$(post "$U/api/runs" -d '{"name": "q1", "queue": true}')" = 202 ] && [ "$(post "$U/api/runs" -d '{"name": "q2", "queue": true, "resume": false}')" = 202 ] &&
  [ "$(jq_ 'd["position"]')" -ge 1 ] && [ "$(post "$U/api/runs" -d '{"name": "q3", "queue": true}')" = 202 ] && ok "three runs queued" || bad "queue: $(cat "$tmp/body")"
[ "$(post "$U/api/runs" -d '{"name": "q3", "queue": true}')" = 409 ] && ok "queueing a queued run: 409" || bad "queue twice: $(cat "$tmp/body")"
code "$U/api/runs/q3" >/dev/null; [ "$(jq_ 'd["status"]')" = queued ] && ok "a queued run's status: queued" || bad "queued status: $(head -c 200 "$tmp/body")"
[ "$(post "$U/api/queue/remove" -d '{"name": "q3"}')" = 200 ] && [ "$(post "$U/api/queue/remove" -d '{"name": "q3"}')" = 404 ] &&
  ok "a run removed from the queue (again: 404)" || bad "queue remove: $(cat "$tmp/body")"
for _ in $(seq 3000); do
  code "$U/api/queue" >/dev/null
  [ "$(jq_ 'len(d["queue"]) == 0 and sum(h["name"] in ("q1", "q2") for h in d["history"]) == 2')" = True ] && break; sleep 0.1
done
[ "$(jq_ '[(h["name"], h["exit_code"], type(h["final_loss"]).__name__, h["seconds"] >= 0) for h in d["history"] if h["name"] in ("q1", "q2")]')" = "[('q2', 0, 'float', True), ('q1', 0, 'float', True)]" ] &&
  [ "$(jq_ '[h for h in d["history"] if h["name"] == "q2"][0]["started"] >= [h for h in d["history"] if h["name"] == "q1"][0]["ended"]')" = True ] &&
  ok "q1 then q2, one after the other; the history has each one's exit, final loss and time" || bad "queue order: $(cat "$tmp/body")"
[ "$(jq_ 'any(h["name"] == "bad" and h["exit_code"] == 1 for h in d["history"]) and not any(h["name"] == "q3" for h in d["history"])')" = True ] &&
  ok "the history holds the failed run too, and not the removed one" || bad "history: $(cat "$tmp/body")"

# ---- port 80: the page's own Host header has no port ----
if start_serve "$tmp/p80.out" --root "$root" --port 80 && [ "$port" = 80 ]; then
  [ "$(code "http://127.0.0.1/api/runs")" = 200 ] && [ "$(code "http://localhost/api/runs")" = 200 ] &&
    [ "$(code "http://127.0.0.1/api/runs" -H 'Host: 127.0.0.1:80')" = 200 ] &&
    ok "--port 80: Host 127.0.0.1 and localhost (no port, as browsers send it) are accepted" || bad "port 80 Host: $(cat "$tmp/body")"
  [ "$(code "http://127.0.0.1/api/runs" -H 'Host: evil.example')" = 403 ] && [ "$(code "http://127.0.0.1/api/runs" -H 'Host: localhost:81')" = 403 ] &&
    ok "--port 80: a foreign Host, or another port, is still refused" || bad "port 80 foreign Host"
  kill "${pids[-1]}"
  wait "${pids[-1]}" 2>/dev/null
  unset 'pids[-1]' # reaped: its pid may be reused before the exit trap's kill
else
  echo "# skip - port 80 is taken here: $(tail -1 "$tmp/p80.out")"
fi
[ "$(code "$U/api/runs" -H "Host: 127.0.0.1")" = 403 ] && ok "a port-less Host on another port is refused" || bad "port-less Host on $port"

# ---- hub ids: a run started here downloads nothing (that would write outside the root) ----
# Two servers without HF_HUB_OFFLINE in their own environment, a hub endpoint that
# does not answer: the default one's run must say HF_HUB_OFFLINE is set (the
# server set it), the --hub-downloads one's run must have tried to connect.
hub_run() { # hub_run OUTFILE ROOT [serve args]: starts a run naming an absent hub id, waits, sets $hlog
  local out=$1 r=$2; shift 2
  mkdir -p "$r"
  local saved=${HF_HUB_OFFLINE-}; unset HF_HUB_OFFLINE
  HF_HOME="$tmp/hf" HF_ENDPOINT="http://127.0.0.1:9" start_serve "$out" --root "$r" --port 0 "$@"
  export HF_HUB_OFFLINE=$saved
  local H="http://127.0.0.1:$port"
  cat > "$tmp/hub.json" <<JSON
{"config": {"pretrained_model_name_or_path": "ctuner-test/absent", "--resolution": 8, "--aspect_bucket_alignment": 8,
  "--train_batch_size": 4, "max_train_steps": 2},
 "backend": [{"id": "shapes", "type": "local", "instance_data_dir": "$tmp/data", "caption_strategy": "textfile", "crop": false}]}
JSON
  post "$H/api/runs/h1/config" --data-binary @"$tmp/hub.json" >/dev/null
  [ "$(post "$H/api/runs" -d '{"name": "h1", "ranks": 1}')" = 202 ] || { bad "hub run start ($*): $(cat "$tmp/body")"; return; }
  for _ in $(seq 3000); do code "$H/api/runs/h1" >/dev/null; [ "$(jq_ 'd["status"]')" = running ] || break; sleep 0.1; done
  hlog="$r/h1/train.log"
}
hub_run "$tmp/hub.out" "$tmp/hroot"
grep -q "HF_HUB_OFFLINE is set, so nothing was downloaded" "$hlog" && [ ! -e "$tmp/hf/hub/models--ctuner-test--absent" ] &&
  ok "a served run resolves hub ids offline: nothing downloaded outside the root" || bad "hub offline: $(tail -3 "$hlog")"
hub_run "$tmp/hubdl.out" "$tmp/hroot2" --hub-downloads
grep -q "cannot reach http://127.0.0.1:9" "$hlog" && ! grep -q "HF_HUB_OFFLINE is set" "$hlog" &&
  ok "--hub-downloads: a served run may download (it tried HF_ENDPOINT)" || bad "hub downloads: $(tail -3 "$hlog")"

# ---- tokens ----
start_serve "$tmp/tok.out" --root "$root" --port 0 --token tok-123456789
T="http://127.0.0.1:$port"
[ "$(code "$T/api/runs")" = 401 ] && ok "token: none given: 401" || bad "no token: $(code "$T/api/runs")"
[ "$(code "$T/api/runs" -H 'Authorization: Bearer wrong-token')" = 401 ] && ok "token: a wrong one: 401" || bad "wrong token"
[ "$(code "$T/api/runs" -H 'Authorization: Bearer tok-123456789')" = 200 ] && ok "token: Bearer" || bad "Bearer"
[ "$(code "$T/api/runs" -H 'Host: elsewhere:1' -H 'Authorization: Bearer tok-123456789')" = 200 ] && ok "token: any Host" || bad "Host with token"
[ "$(code "$T/?token=nope")" = 401 ] && ok "token: /?token=wrong: 401" || bad "?token wrong"
c=$(curl -s -D "$tmp/hdr" -o /dev/null -w '%{http_code}' "$T/?token=tok-123456789")
[ "$c" = 303 ] && grep -qi '^Set-Cookie: ctuner_token=tok-123456789; Path=/; HttpOnly; SameSite=Strict' "$tmp/hdr" && ok "token: /?token= sets the cookie and redirects" || bad "cookie: $c $(cat "$tmp/hdr")"
[ "$(code "$T/api/runs" -H 'Cookie: ctuner_token=tok-123456789')" = 200 ] && ok "token: cookie" || bad "cookie auth"
[ "$(code "$T/api/runs" -H 'Cookie: ctuner_token=tok-12345678')" = 401 ] && ok "token: a prefix of it: 401" || bad "prefix token"
"$CT" serve --root "$root" --host 0.0.0.0 --port 0 --token short >/dev/null 2>"$tmp/err" && bad "short token accepted" ||
  { grep -q "8 to 128" "$tmp/err" && ok "a short token is refused"; }
start_serve "$tmp/gen.out" --root "$root" --port 0 --host 0.0.0.0
gen=$(sed -nE 's/^token \(printed once\): ([0-9a-f]{32})$/\1/p' "$tmp/gen.out")
G="http://127.0.0.1:$port"
[ -n "$gen" ] && [ "$(code "$G/api/runs")" = 401 ] && [ "$(code "$G/api/runs" -H "Authorization: Bearer $gen")" = 200 ] &&
  ok "--host 0.0.0.0 without --token: a token is generated, printed once and required" || bad "generated token: $(cat "$tmp/gen.out")"
exit $fail
