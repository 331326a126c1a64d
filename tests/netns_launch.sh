#!/usr/bin/env bash
# `ctuner launch` across two "machines" on this one: network namespaces with
# their own addresses on a veth pair (as tests/netns_dist.sh), an Accelerate
# config with num_machines 2 and main_process_port P, launched once in the
# first namespace with a hostfile (Open MPI reaches the second one through an
# rsh agent that enters it, in place of ssh). The job must train, and every TCP
# port its processes listen on in either namespace must lie in P .. P+3 (the
# range main_process_port gives Open MPI for 1 rank per machine). Needs root;
# exits 77 (ctest: skipped) where namespaces cannot be created.
# Usage: tests/netns_launch.sh path/to/ctuner
. "$(dirname "$0")/lib/netns.sh"
netns_setup ctl "$@"
net=$(( ($$ % 200) + 20 ))
ip netns add "$B"
ip link add "la$$" type veth peer name "lb$$"
ip link set "la$$" netns "$A"
ip link set "lb$$" netns "$B"
ip -n "$A" addr add "10.78.$net.1/24" dev "la$$"
ip -n "$B" addr add "10.78.$net.2/24" dev "lb$$"
for ns in "$A" "$B"; do ip -n "$ns" link set lo up; done
ip -n "$A" link set "la$$" up
ip -n "$B" link set "lb$$" up
cat > "$tmp/agent.sh" <<AGENT
#!/bin/sh
while [ "\${1#-}" != "\$1" ]; do shift; done
host=\$1; shift
case \$host in
  10.78.$net.1) ns=$A ;;
  10.78.$net.2) ns=$B ;;
  *) echo "agent: unknown host \$host" >&2; exit 1 ;;
esac
exec ip netns exec \$ns sh -c "\$*"
AGENT
chmod +x "$tmp/agent.sh"
printf '10.78.%s.1 slots=1\n10.78.%s.2 slots=1\n' "$net" "$net" > "$tmp/hosts"
P=$(( 41000 + ($$ % 1000) * 4 ))
cat > "$tmp/accel.yaml" <<YAML
compute_environment: LOCAL_MACHINE
distributed_type: DEEPSPEED
deepspeed_config:
  zero_stage: 1
machine_rank: 0
main_process_ip: 10.78.$net.1
main_process_port: $P
num_machines: 2
num_processes: 2
same_network: true
YAML
"$CT" dataset synth --out "$tmp/data" --count 8 --seed 3 >/dev/null || { echo "FAIL - synth"; exit 1; }
cat > "$tmp/backend.json" <<JSON
[{"id": "d", "type": "local", "instance_data_dir": "$tmp/data", "caption_strategy": "textfile"}]
JSON
# Open MPI reads these from the environment of the launch (and passes them on).
export OMPI_MCA_plm_rsh_agent="$tmp/agent.sh" OMPI_MCA_btl_tcp_if_include="10.78.$net.0/24" \
  OMPI_MCA_oob_tcp_if_include="10.78.$net.0/24" OMP_NUM_THREADS=1
# (paced, 50 ms before each of its 20 steps: the port sampler below must catch the
# job's processes listening, however fast the machine)
CTUNER_FAULT_STEP_DELAY_MS=50 ip netns exec "$A" "$CT" launch --accelerate-config "$tmp/accel.yaml" --hostfile "$tmp/hosts" -- train \
  --preset=tiny --resolution=8 --aspect_bucket_alignment=8 --data_backend_config="$tmp/backend.json" \
  --train_batch_size=2 --max_train_steps=20 --disable_validation=true --output_dir="$tmp/run" \
  >"$tmp/run.out" 2>"$tmp/run.err" &
job=$!
: > "$tmp/ports"
while kill -0 $job 2>/dev/null; do # the TCP ports the job's processes listen on, in both namespaces
  for ns in "$A" "$B"; do
    ip netns exec "$ns" ss -tlnpH 2>/dev/null | grep -E '"(ctuner|orted|mpirun|prterun|prted)"' |
      awk -v ns="$ns" '{n = split($4, a, ":"); print ns, a[n], $4, $NF}' >> "$tmp/ports"
  done
  sleep 0.1
done
wait $job
rc=$?
if [ $rc = 0 ] && [ -f "$tmp/run/checkpoint-20/.guard" ] && grep -q "2 rank(s)" "$tmp/run.err"; then
  ok "ctuner launch trains on 2 namespaces x 1 rank"
else
  bad "launch across namespaces: exit $rc: $(tail -5 "$tmp/run.err")"
fi
sort -u "$tmp/ports" > "$tmp/ports.u"
seen=$(awk '$3 !~ /^(127\.|\[::1\])/ {print $2}' "$tmp/ports.u" | sort -un | tr '\n' ' ')
outside=$(awk -v lo=$P -v hi=$((P + 3)) '$3 !~ /^(127\.|\[::1\])/ && ($2 < lo || $2 > hi)' "$tmp/ports.u")
if [ -n "$seen" ] && [ -z "$outside" ] && grep -q "^$B " "$tmp/ports.u"; then
  ok "every port listening beyond loopback in $P-$((P + 3)) (seen: $seen)"
else
  bad "ports outside $P-$((P + 3)) or none seen: $(cat "$tmp/ports.u")"
fi
exit $fail
