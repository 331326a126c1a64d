#!/usr/bin/env bash
# `ctuner launch`: Accelerate configs turned into mpirun commands (--dry-run
# output checked for a 2-machine config), config errors named, and a real
# 1-machine, 2-process launch that trains.
# Usage: tests/cli_launch.sh path/to/ctuner
. "$(dirname "$0")/lib/common.sh"
export ASAN_OPTIONS=${ASAN_OPTIONS:-}:detect_leaks=0

# As `accelerate config` writes it, for 2 machines x 2 processes with DeepSpeed.
cat > "$tmp/two.yaml" <<'YAML'
compute_environment: LOCAL_MACHINE
debug: false
deepspeed_config:
  gradient_accumulation_steps: 2
  offload_optimizer_device: none   # no offload
  offload_param_device: none
  zero3_init_flag: false
  zero_stage: 1
distributed_type: DEEPSPEED
downcast_bf16: 'no'
machine_rank: 0
main_process_ip: 10.0.0.1
main_process_port: 29500
main_training_function: main
mixed_precision: 'no'
num_machines: 2
num_processes: 4
rdzv_backend: static
same_network: true
tpu_env: []
use_cpu: true
YAML
printf '10.0.0.1 slots=2\n10.0.0.2 slots=2\n' > "$tmp/hosts"
if out=$("$CT" launch --accelerate-config "$tmp/two.yaml" --hostfile "$tmp/hosts" --dry-run -- train \
    --config x.json --seed=3 2>"$tmp/err"); then
  want=("mpirun" "-np 4" "--map-by ppr:2:node" "--hostfile $tmp/hosts" "--mca btl tcp,self,vader"
    " train --zero_stage=1 --gradient_accumulation_steps=2 --mixed_precision=no --offload_optimizer=none --offload_param=none --config x.json --seed=3")
  miss=""
  for w in "${want[@]}"; do echo "$out" | grep -q -- "$w" || miss="$miss [$w]"; done
  [ -z "$miss" ] && ok "2-machine Accelerate config -> $out" || bad "dry-run lacks$miss: $out"
  grep -q "2 machine(s) x 2 process(es) = 4 ranks" "$tmp/err" && ok "launch summary on stderr" ||
    bad "summary: $(cat "$tmp/err")"
else
  bad "dry-run failed: $(cat "$tmp/err")"
fi

expect_err() { # name, pattern, yaml-edit (sed), extra args...
  local name=$1 pat=$2 edit=$3; shift 3
  sed "$edit" "$tmp/two.yaml" > "$tmp/e.yaml"
  if out=$("$CT" launch --accelerate-config "$tmp/e.yaml" "$@" --dry-run -- train 2>&1); then
    bad "$name: exit 0 ($out)"
  else
    echo "$out" | grep -q -- "$pat" && ok "$name" || bad "$name: '$out' lacks '$pat'"
  fi
}
expect_err "unequal ranks per machine" "num_processes 3 is not a multiple of num_machines 2" \
  's/num_processes: 4/num_processes: 3/' --hostfile "$tmp/hosts"
expect_err "hostfile required" "num_machines 2 needs --hostfile" 's/x/x/'
expect_err "not the main machine" "run ctuner launch once, on machine_rank 0" 's/machine_rank: 0/machine_rank: 1/' \
  --hostfile "$tmp/hosts"
expect_err "bad integer names file and line" "e.yaml:16: num_machines: expected an integer" \
  's/num_machines: 2/num_machines: two/' --hostfile "$tmp/hosts"
expect_err "FSDP refused" "distributed_type FSDP is not supported" 's/DEEPSPEED/FSDP/' --hostfile "$tmp/hosts"
expect_err "fp16 refused" "mixed_precision fp16: use no or bf16" "s/mixed_precision: 'no'/mixed_precision: fp16/" \
  --hostfile "$tmp/hosts"
sed "s/mixed_precision: 'no'/mixed_precision: bf16/" "$tmp/two.yaml" > "$tmp/bf.yaml"
out=$("$CT" launch --accelerate-config "$tmp/bf.yaml" --hostfile "$tmp/hosts" --dry-run -- train 2>/dev/null)
echo "$out" | grep -q -- "--mixed_precision=bf16" && ok "mixed_precision bf16 passed on" || bad "bf16: $out"
expect_err "unknown offload device" "offload_param_device disk: use none, cpu or nvme" 's/offload_param_device: none/offload_param_device: disk/' \
  --hostfile "$tmp/hosts"
sed 's/offload_optimizer_device: none.*/offload_optimizer_device: nvme\n  offload_optimizer_nvme_path: \/mnt\/nvme/' "$tmp/two.yaml" > "$tmp/nv.yaml"
out=$("$CT" launch --accelerate-config "$tmp/nv.yaml" --hostfile "$tmp/hosts" --dry-run -- train 2>/dev/null)
echo "$out" | grep -q -- "--offload_optimizer=nvme --offload_param=none --offload_param_path=/mnt/nvme" &&
  ok "optimizer offload to nvme passed on with its path" || bad "nvme offload: $out"

# deepspeed_config_file is passed on as --deepspeed_config (with only the keys
# `accelerate config` writes beside a file)
cat > "$tmp/dsf.yaml" <<'YAML'
compute_environment: LOCAL_MACHINE
deepspeed_config:
  deepspeed_config_file: /etc/ds.json
  deepspeed_multinode_launcher: standard
  zero3_init_flag: false
distributed_type: DEEPSPEED
machine_rank: 0
main_process_ip: 10.0.0.1
main_process_port: 29500
num_machines: 2
num_processes: 4
YAML
out=$("$CT" launch --accelerate-config "$tmp/dsf.yaml" --hostfile "$tmp/hosts" --dry-run -- train 2>/dev/null)
echo "$out" | grep -q -- "--deepspeed_config=/etc/ds.json" && ok "deepspeed_config_file passed on" ||
  bad "deepspeed_config_file: $out"
# ... but not beside inline DeepSpeed keys: Accelerate refuses both at once
sed 's/  zero_stage: 1/  zero_stage: 1\n  deepspeed_config_file: \/etc\/ds.json/' "$tmp/two.yaml" > "$tmp/dsboth.yaml"
out=$("$CT" launch --accelerate-config "$tmp/dsboth.yaml" --hostfile "$tmp/hosts" --dry-run -- train 2>&1)
rc=$?
[ $rc = 2 ] && echo "$out" | grep -q "inline DeepSpeed keys gradient_accumulation_steps, offload_optimizer_device, offload_param_device, zero_stage: Accelerate refuses" &&
  ok "deepspeed_config_file beside inline keys refused, as Accelerate" || bad "file + inline keys: exit $rc: $out"
# distributed_type NO: a leftover deepspeed_config_file is ignored, as Accelerate does
sed 's/distributed_type: DEEPSPEED/distributed_type: NO/' "$tmp/dsf.yaml" > "$tmp/dsno.yaml"
out=$("$CT" launch --accelerate-config "$tmp/dsno.yaml" --hostfile "$tmp/hosts" --dry-run -- train 2>"$tmp/dsno.err")
! echo "$out" | grep -q -- "--deepspeed_config" && grep -q "deepspeed_config_file /etc/ds.json is ignored" "$tmp/dsno.err" &&
  ok "distributed_type NO ignores deepspeed_config_file with a note" || bad "NO + file: $out $(cat "$tmp/dsno.err")"
# gradient_clipping becomes max_grad_norm; no mixed_precision: the training config's own stays
sed -e 's/  zero_stage: 1/  zero_stage: 1\n  gradient_clipping: 0.01/' -e "/mixed_precision/d" "$tmp/two.yaml" > "$tmp/clip.yaml"
out=$("$CT" launch --accelerate-config "$tmp/clip.yaml" --hostfile "$tmp/hosts" --dry-run -- train 2>/dev/null)
echo "$out" | grep -q -- "--max_grad_norm=0.01" && ! echo "$out" | grep -q -- "--mixed_precision" &&
  ok "gradient_clipping -> --max_grad_norm; no mixed_precision passed when the YAML has none" || bad "clip/mp: $out"
# main_process_port: null (what accelerate config writes for one machine)
sed 's/main_process_port: 29500/main_process_port: null/' "$tmp/two.yaml" > "$tmp/null.yaml"
"$CT" launch --accelerate-config "$tmp/null.yaml" --hostfile "$tmp/hosts" --dry-run -- train >/dev/null 2>"$tmp/null.err" &&
  ok "main_process_port: null accepted" || bad "port null: $(cat "$tmp/null.err")"

# A real launch on this machine: 1 machine x 2 processes, stage 1.
"$CT" dataset synth --out "$tmp/data" --count 8 --seed 2 >/dev/null
cat > "$tmp/backend.json" <<JSON
[{"id": "d", "type": "local", "instance_data_dir": "$tmp/data", "caption_strategy": "textfile"}]
JSON
printf 'distributed_type: MULTI_CPU\nnum_machines: 1\nnum_processes: 2\ndeepspeed_config:\n  zero_stage: 1\n' \
  > "$tmp/one.yaml"
if OMP_NUM_THREADS=1 "$CT" launch --accelerate-config "$tmp/one.yaml" -- train --preset=tiny --resolution=8 --aspect_bucket_alignment=8 \
    --data_backend_config="$tmp/backend.json" --train_batch_size=2 --max_train_steps=3 --disable_validation=true \
    --output_dir="$tmp/run" >"$tmp/run.out" 2>"$tmp/run.err" && [ -f "$tmp/run/checkpoint-3/.guard" ] &&
  grep -q "effective batch 4 = train_batch_size 2 x 2 rank(s)" "$tmp/run.err"; then
  ok "launch trains on 2 processes (effective batch 4)"
else
  bad "real launch: $(tail -5 "$tmp/run.err")"
fi
exit $fail
