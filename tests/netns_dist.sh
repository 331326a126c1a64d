#!/usr/bin/env bash
# Two "machines" on this one: network namespaces with their own addresses
# (10.77.x.1 and 10.77.x.2 on a veth pair) and host names, one rank in each,
# launched by mpirun over TCP with an rsh agent that enters the other
# namespace (docs/distributed.md, "Several machines"). The losses and weights
# must equal a 2-rank run in one namespace bit for bit (rank-order reductions).
# Needs root (ip netns); exits 77 (ctest: skipped) where namespaces cannot be
# created. Usage: tests/netns_dist.sh path/to/ctuner
. "$(dirname "$0")/lib/netns.sh"
netns_setup ctn "$@"
BIN=$(dirname "$CT")
net=$(( ($$ % 200) + 20 )) # 10.77.<net>.0/24, distinct per run
ip netns add "$B"
ip link add "va$$" type veth peer name "vb$$"
ip link set "va$$" netns "$A"
ip link set "vb$$" netns "$B"
ip -n "$A" addr add "10.77.$net.1/24" dev "va$$"
ip -n "$B" addr add "10.77.$net.2/24" dev "vb$$"
for ns in "$A" "$B"; do ip -n "$ns" link set lo up; done
ip -n "$A" link set "va$$" up
ip -n "$B" link set "vb$$" up

# Open MPI starts its daemon on the other "host" through this agent (in place of ssh).
cat > "$tmp/agent.sh" <<EOF
#!/bin/sh
while [ "\${1#-}" != "\$1" ]; do shift; done
host=\$1; shift
case \$host in
  10.77.$net.1) ns=$A; hn=ct-node-a ;;
  10.77.$net.2) ns=$B; hn=ct-node-b ;;
  *) echo "agent: unknown host \$host" >&2; exit 1 ;;
esac
exec ip netns exec \$ns unshare --uts sh -c "hostname \$hn; \$*"
EOF
chmod +x "$tmp/agent.sh"
printf '10.77.%s.1 slots=1\n10.77.%s.2 slots=1\n' "$net" "$net" > "$tmp/hostfile"
in_a() { ip netns exec "$A" unshare --uts sh -c 'hostname ct-node-a; exec "$@"' sh "$@"; }
MPI2=(mpirun --allow-run-as-root --hostfile "$tmp/hostfile" --mca plm_rsh_agent "$tmp/agent.sh"
  --mca btl tcp,self --mca btl_tcp_if_include "10.77.$net.0/24" --mca oob_tcp_if_include "10.77.$net.0/24"
  -np 2 -x OMP_NUM_THREADS=1 -x ASAN_OPTIONS)

# Where does each rank run? (host names differ, so the ranks are on two "nodes")
if out=$(in_a "${MPI2[@]}" hostname 2>&1) && [ "$(echo "$out" | sort | tr '\n' ' ')" = "ct-node-a ct-node-b " ]; then
  ok "mpirun places one rank in each namespace"
else
  bad "placement: $out"
fi
if out=$(in_a "${MPI2[@]}" "$BIN/ct_tests" comm 2>&1); then
  ok "communicator collectives across the veth pair"
else
  bad "collectives across namespaces: $out"
fi

"$CT" dataset synth --out "$tmp/data" --count 16 --seed 9 >/dev/null || { echo "FAIL - synth"; exit 1; }
cat > "$tmp/backend.json" <<JSON
[{"id": "shapes", "type": "local", "instance_data_dir": "$tmp/data", "caption_strategy": "textfile", "crop": false}]
JSON
for mode in "--zero_stage=1" "--zero_stage=3 --mixed_precision=bf16"; do
  # shellcheck disable=SC2206
  args=(train --preset=tiny --resolution=8 --aspect_bucket_alignment=8 --data_backend_config="$tmp/backend.json" --train_batch_size=2
    --learning_rate=1e-3 --disable_validation=true --seed=4 --max_train_steps=12 $mode)
  rm -rf "$tmp/two-nodes" "$tmp/one-node"
  if ! in_a "${MPI2[@]}" "$CT" "${args[@]}" --output_dir="$tmp/two-nodes" >/dev/null 2>"$tmp/a.err"; then
    bad "training across 2 namespaces ($mode): $(tail -5 "$tmp/a.err")"
  elif ! mpirun --oversubscribe --allow-run-as-root -np 2 -x OMP_NUM_THREADS=1 "$CT" "${args[@]}" \
      --output_dir="$tmp/one-node" >/dev/null 2>"$tmp/b.err"; then
    bad "training on one node ($mode): $(tail -5 "$tmp/b.err")"
  else
    # the timing fields differ from run to run; everything else must not
    untimed() { sed -E 's/"(seconds|data_wait_s|samples_per_s)": [0-9.e+-]*,? ?//g' "$1"; }
    if cmp -s <(untimed "$tmp/two-nodes/metrics.jsonl") <(untimed "$tmp/one-node/metrics.jsonl") &&
      cmp -s "$tmp/two-nodes/checkpoint-12/model.safetensors" "$tmp/one-node/checkpoint-12/model.safetensors"; then
      ok "2 nodes x 1 rank == 1 node x 2 ranks ($mode): identical losses and weights over 12 steps"
    else
      bad "cross-namespace run differs ($mode): $(diff <(cut -c1-60 "$tmp/two-nodes/metrics.jsonl") <(cut -c1-60 "$tmp/one-node/metrics.jsonl") | head -4)"
    fi
  fi
done
exit $fail
