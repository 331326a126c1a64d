# Shared by the adapter tests (cli_lora.sh, cli_dora.sh, cli_lycoris.sh):
# source after common.sh with $tmp/base.json written and MPIRUN set.
#   summary DIR [ONLY]     digest of the adapter files under DIR (those whose
#                          directory contains ONLY), the number of logged steps
#                          and the last two losses/grad norms of metrics.jsonl;
#                          nothing (and a message on stderr) when no adapter
#                          file matched or no step was logged
#   adapter_base [FLAGS]   three full steps of base.json's model, then
#                          base.json's pretrained_model_path points at them (the
#                          seeded init's zero final layer and gates pass no
#                          gradient to the adapters)
#   train NAME RANKS FLAGS training into $tmp/NAME on 1 or RANKS MPI ranks
#   same A B WHAT [ONLY]   ok when two runs' summaries are identical (and not empty)
#   err WHAT TEXT FLAGS    ok when training with FLAGS fails saying TEXT
#   near A B WHAT          ok when two 4-step runs agree within 1e-5 (ranks vs
#                          one rank: the batch split sums in another order); a
#                          NaN or Inf anywhere fails
summary() {
  /usr/bin/python3 - "$1" "${2:-}" <<'PY'
import hashlib, json, os, struct, sys
root, only, h, nfiles = sys.argv[1], sys.argv[2], hashlib.sha256(), 0
for d, _, fs in sorted(os.walk(root)):
    for f in sorted(fs):
        if f != "pytorch_lora_weights.safetensors": continue
        if only and only not in d: continue
        nfiles += 1
        b = open(os.path.join(d, f), "rb").read()
        n = struct.unpack("<Q", b[:8])[0]
        hd = json.loads(b[8:8 + n])
        h.update(os.path.relpath(os.path.join(d, f), root).encode())
        for k in sorted(x for x in hd if x != "__metadata__"):
            s, e = hd[k]["data_offsets"]
            h.update(k.encode()); h.update(b[8 + n + s:8 + n + e])
L = [x for x in map(json.loads, open(os.path.join(root, "metrics.jsonl"))) if "loss" in x]
if not nfiles or not L:  # an empty digest would equal another empty one
    sys.exit(f"summary {root}: {nfiles} adapter file(s) matching '{only}', {len(L)} logged step(s)")
print(h.hexdigest()[:16], len(L), " ".join(repr(x["loss"]) + "/" + repr(x["grad_norm"]) for x in L[-2:]))
PY
}

adapter_base() {
  OMP_NUM_THREADS=2 "$CT" train --config "$tmp/base.json" --model_type=full --max_train_steps=3 \
    --train_batch_size=2 --use_ema=false --disable_validation=true --output_dir="$tmp/full" "$@" \
    >/dev/null 2>"$tmp/full.err" ||
    { echo "FAIL - base: $(tail -3 "$tmp/full.err")"; exit 1; }
  /usr/bin/python3 - "$tmp/base.json" "$tmp/full/checkpoint-3/model.safetensors" <<'PY'
import json, sys
c = json.load(open(sys.argv[1])); c["--pretrained_model_path"] = sys.argv[2]
json.dump(c, open(sys.argv[1], "w"))
PY
}

train() { # name ranks flags...
  local name=$1 ranks=$2
  shift 2
  if [ "$ranks" = 1 ]; then
    OMP_NUM_THREADS=2 "$CT" train --config "$tmp/base.json" "$@" --output_dir="$tmp/$name" \
      >/dev/null 2>"$tmp/$name.err"
  else
    "${MPIRUN[@]}" -np "$ranks" -x OMP_NUM_THREADS=1 "$CT" train --config "$tmp/base.json" "$@" \
      --output_dir="$tmp/$name" >/dev/null 2>"$tmp/$name.err"
  fi || { bad "$name: training failed: $(tail -3 "$tmp/$name.err")"; return 1; }
}

same() { # a b what [only]
  local a b
  a=$(summary "$tmp/$1" "${4:-}") b=$(summary "$tmp/$2" "${4:-}")
  if [ -n "$a" ] && [ -n "$b" ] && [ "$(echo "$a" | cut -d' ' -f1,3-)" = "$(echo "$b" | cut -d' ' -f1,3-)" ]; then
    ok "$3: losses, grad norms and adapter files identical ($(echo "$a" | cut -d' ' -f1))"
  else
    bad "$3 differ"
    echo "  $1: $a" | cut -c1-300
    echo "  $2: $b" | cut -c1-300
  fi
}

near() { # a b what: losses, grad norms and final adapters within 1e-5
  /usr/bin/python3 - "$tmp/$1" "$tmp/$2" <<'PY' && ok "$3 (within 1e-5)" || bad "$3"
import json, struct, sys
def run(r):
    L = [(x["loss"], x["grad_norm"]) for x in map(json.loads, open(r + "/metrics.jsonl")) if "loss" in x]
    b = open(r + "/pytorch_lora_weights.safetensors", "rb").read()
    n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n]); h.pop("__metadata__")
    w = {k: struct.unpack("<%df" % ((v["data_offsets"][1] - v["data_offsets"][0]) // 4),
                          b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]]) for k, v in h.items()}
    return L, w
import math
(la, wa), (lb, wb) = run(sys.argv[1]), run(sys.argv[2])
if not (len(la) == len(lb) == 4 and set(wa) == set(wb) and wa and
        all(len(wa[k]) == len(wb[k]) for k in wa)):
    sys.exit(f"  steps {len(la)} vs {len(lb)}, tensors {sorted(set(wa) ^ set(wb))} differ or none")
vals = [v for p in la + lb for v in p] + [v for w in (wa, wb) for t in w.values() for v in t]
if not all(math.isfinite(v) for v in vals):  # max() below would drop a NaN
    sys.exit("  a NaN or Inf in the losses, grad norms or adapters")
e = max(abs(x - y) / abs(y) for p, q in zip(la, lb) for x, y in zip(p, q))
for k in wa:
    m = max(abs(v) for v in wb[k]) or 1
    e = max(e, max(abs(x - y) for x, y in zip(wa[k], wb[k])) / m)
print(f"  max relative difference {e:.2e}")
sys.exit(not e < 1e-5)
PY
}

err() { # what expected-text flags...
  local what=$1 want=$2
  shift 2
  if OMP_NUM_THREADS=1 "$CT" train --config "$tmp/base.json" --output_dir="$tmp/e" "$@" \
    >/dev/null 2>"$tmp/e.err"; then
    bad "$what: accepted"
  elif grep -q -- "$want" "$tmp/e.err"; then
    ok "$what: $(grep -m1 -o -- "$want.\{0,60\}" "$tmp/e.err")"
  else
    bad "$what: $(tail -2 "$tmp/e.err")"
  fi
}
