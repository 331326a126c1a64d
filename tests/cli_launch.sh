#!/usr/bin/env bash
# `ctuner launch`: Accelerate configs turned into mpirun commands (--dry-run
# output checked for a 2-machine config), config errors named, and a real
# 1-machine, 2-process launch that trains.
# Usage: tests/cli_launch.sh path/to/ctuner
. "$(dirname "$0")/lib/common.sh"
export ASAN_OPTIONS=${ASAN_OPTIONS:-}:detect_leaks=0
unset SLURM_JOB_ID SLURM_JOB_NUM_NODES # the Slurm cases below set their own

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

# YAML as people write it (read by libyaml): flow style, anchors and a merge
# key, quoted keys, comments after values, unquoted NO (YAML 1.1's false, meant
# as "NO"), a block of deepspeed_config given by an alias. The old line scanner
# read none of this right.
cat > "$tmp/styles.yaml" <<'YAML'
# Accelerate config, hand-written
"distributed_type": DEEPSPEED   # quoted key
deepspeed_config:
  <<: &stage {zero_stage: 2, gradient_accumulation_steps: 4}
  gradient_clipping: 1.5
mixed_precision: "bf16" # comment
num_processes: 2
num_machines: 1
gpu_ids: all
dynamo_config: {dynamo_backend: NO}
tpu_env: []
YAML
out=$("$CT" launch --accelerate-config "$tmp/styles.yaml" --dry-run -- train 2>"$tmp/styles.err")
echo "$out" | grep -q -- "-np 2 .* train --zero_stage=2 --gradient_accumulation_steps=4 --mixed_precision=bf16 --max_grad_norm=1.5$" &&
  ! grep -q "warning" "$tmp/styles.err" && ok "flow maps, anchor + merge key, quoted keys, comments: $out" ||
  bad "YAML styles: $out $(cat "$tmp/styles.err")"
printf 'distributed_type: NO\nnum_processes: 1\nmixed_precision: no\n' > "$tmp/bare.yaml"
out=$("$CT" launch --accelerate-config "$tmp/bare.yaml" --dry-run -- train 2>&1)
echo "$out" | grep -q "distributed_type NO" && echo "$out" | grep -q -- "--mixed_precision=no" &&
  ok "unquoted NO / no (YAML 1.1 booleans) read as written" || bad "unquoted NO: $out"
# quoted numbers and 1e-2 (a string to YAML 1.1): Accelerate passes them on as text that its
# readers turn into numbers; so does ctuner launch, written the shortest way
printf "distributed_type: DEEPSPEED\nnum_processes: '2'\ndeepspeed_config:\n  zero_stage: '3'\n  gradient_clipping: 1e-2\n" > "$tmp/q.yaml"
out=$("$CT" launch --accelerate-config "$tmp/q.yaml" --dry-run -- train 2>&1)
echo "$out" | grep -q -- "-np 2 .* train --zero_stage=3 --max_grad_norm=0.01$" && ok "quoted numbers and 1e-2 read as numbers" ||
  bad "quoted numbers: $out"
printf 'distributed_type: MULTI_CPU\nnum_processes: 2\nd: &a [1]\n' > "$tmp/unk.yaml"
printf 'distributed_type: MULTI_CPU\nnum_processes: [2, 3\n' > "$tmp/syn.yaml"
out=$("$CT" launch --accelerate-config "$tmp/syn.yaml" --dry-run -- train 2>&1)
[ $? = 2 ] && echo "$out" | grep -q "syn.yaml: line 3, column 1: did not find expected ',' or ']'" &&
  ok "YAML syntax error names file and line: $out" || bad "syntax: $out"
out=$("$CT" launch --accelerate-config "$tmp/unk.yaml" --dry-run -- train 2>&1)
[ $? = 2 ] && echo "$out" | grep -q "unknown keys: d; Accelerate refuses them too" && ok "unknown key refused by name" ||
  bad "unknown key: $out"
# keys that change nothing here warn once, naming the key and why
printf 'distributed_type: MULTI_CPU\nnum_processes: 2\ndebug: true\nrdzv_backend: c10d\nenable_cpu_affinity: true\ndynamo_config:\n  dynamo_backend: INDUCTOR\n' > "$tmp/noeff.yaml"
"$CT" launch --accelerate-config "$tmp/noeff.yaml" --dry-run -- train >/dev/null 2>"$tmp/noeff.err"
for k in "debug true" "rdzv_backend c10d" "enable_cpu_affinity true" "dynamo_config.dynamo_backend INDUCTOR"; do
  [ "$(grep -c "warning: $k has no effect here" "$tmp/noeff.err")" = 1 ] && ok "warns once: $k" || bad "no warning for $k: $(cat "$tmp/noeff.err")"
done
# deepspeed_config with another distributed_type: ignored with a note, as Accelerate
sed 's/distributed_type: DEEPSPEED/distributed_type: MULTI_GPU/' "$tmp/two.yaml" > "$tmp/mg.yaml"
out=$("$CT" launch --accelerate-config "$tmp/mg.yaml" --hostfile "$tmp/hosts" --dry-run -- train 2>"$tmp/mg.err")
! echo "$out" | grep -q -- "--zero_stage" && grep -q "distributed_type MULTI_GPU: deepspeed_config is ignored" "$tmp/mg.err" &&
  ok "deepspeed_config ignored for MULTI_GPU, with a note" || bad "MULTI_GPU + deepspeed_config: $out $(cat "$tmp/mg.err")"

# Several machines. main_process_port confines Open MPI's ports: 2 ranks per
# machine -> daemons 29500-29502, ranks 29503-29505.
out=$("$CT" launch --accelerate-config "$tmp/two.yaml" --hostfile "$tmp/hosts" --dry-run -- train 2>/dev/null)
echo "$out" | grep -q -- "--mca oob_tcp_dynamic_ipv4_ports 29500-29502 --mca oob_tcp_dynamic_ipv6_ports 29500-29502 --mca btl_tcp_port_min_v4 29503 --mca btl_tcp_port_range_v4 3 --mca btl_tcp_port_min_v6 29503 --mca btl_tcp_port_range_v6 3 " &&
  ok "main_process_port sets Open MPI's port range" || bad "ports: $out"
out=$("$CT" launch --accelerate-config "$tmp/null.yaml" --hostfile "$tmp/hosts" --dry-run -- train 2>/dev/null)
! echo "$out" | grep -q "port" && ok "no main_process_port: Open MPI picks its ports" || bad "null port: $out"
sed 's/main_process_port: 29500/main_process_port: 65533/' "$tmp/two.yaml" > "$tmp/hi.yaml"
expect_err "port range past 65535" "main_process_port 65533: Open MPI's ports 65533-65538 pass 65535" 's/main_process_port: 29500/main_process_port: 65533/' --hostfile "$tmp/hosts"
# machine_rank 1: what to run on machine 0, the hostfile, SSH and the ports
sed 's/machine_rank: 0/machine_rank: 1/' "$tmp/two.yaml" > "$tmp/r1.yaml"
out=$("$CT" launch --accelerate-config "$tmp/r1.yaml" --dry-run -- train --seed=3 2>&1)
rc=$?
miss=""
for w in "run ctuner launch once, on machine_rank 0 (10.0.0.1)" "--hostfile hosts -- train --seed=3" \
  "10.0.0.1 slots=2" "SSH from machine 0 without a password" "29500-29505 (from main_process_port)"; do
  echo "$out" | grep -qF -- "$w" || miss="$miss [$w]"
done
[ $rc = 2 ] && [ -z "$miss" ] && ok "machine_rank 1 explains what to run on machine 0" || bad "machine_rank 1 (exit $rc) lacks$miss: $out"
# the hostfile must list num_machines machines; rank 0 runs on its first
printf '10.0.0.1 slots=2\n' > "$tmp/h1"
expect_err "hostfile shorter than num_machines" "lists 1 machine(s);" 's/x/x/' --hostfile "$tmp/h1"
printf '# machines\nnode-a slots=2\nnode-b slots=2\n' > "$tmp/hn"
"$CT" launch --accelerate-config "$tmp/two.yaml" --hostfile "$tmp/hn" --dry-run -- train >/dev/null 2>"$tmp/hn.err"
grep -q "rank 0 runs on node-a, the hostfile's first machine, not on main_process_ip 10.0.0.1" "$tmp/hn.err" &&
  ok "hostfile's first machine differs from main_process_ip: warned" || bad "first host: $(cat "$tmp/hn.err")"
# the config's own hostfile (deepspeed_hostfile) is used without --hostfile
sed "s|  zero_stage: 1|  zero_stage: 1\n  deepspeed_hostfile: $tmp/hosts|" "$tmp/two.yaml" > "$tmp/dsh.yaml"
out=$("$CT" launch --accelerate-config "$tmp/dsh.yaml" --dry-run -- train 2>&1)
echo "$out" | grep -q -- "--hostfile $tmp/hosts" && ok "deepspeed_hostfile used as the hostfile" || bad "deepspeed_hostfile: $out"
# inside a Slurm allocation mpirun takes Slurm's machines: no hostfile needed
out=$(SLURM_JOB_ID=7 "$CT" launch --accelerate-config "$tmp/two.yaml" --dry-run -- train 2>&1)
echo "$out" | grep -q "^mpirun .*-np 4 --map-by ppr:2:node --mca btl" && ok "in a Slurm allocation mpirun needs no hostfile" || bad "slurm mpirun: $out"
# Slurm with srun and PMIx (examples/slurm/ctuner.sbatch)
out=$("$CT" launch --accelerate-config "$tmp/two.yaml" --launcher srun --dry-run -- train --seed=3 2>/dev/null)
echo "$out" | grep -q "^srun --mpi=pmix --nodes=2 --ntasks=4 --ntasks-per-node=2 --export=ALL,OMPI_MCA_btl_tcp_port_min_v4=29503,OMPI_MCA_btl_tcp_port_range_v4=3,OMPI_MCA_btl_tcp_port_min_v6=29503,OMPI_MCA_btl_tcp_port_range_v6=3 .*ctuner train --zero_stage=1 .* --seed=3$" &&
  ok "srun command: $out" || bad "srun: $out"
# the batch script's config, as sbatch would run it (2 nodes), and a mismatched allocation
out=$(SLURM_JOB_ID=9 SLURM_JOB_NUM_NODES=2 "$CT" launch --accelerate-config examples/slurm/accelerate.yaml --launcher srun --dry-run -- train 2>&1)
echo "$out" | grep -q "^srun --mpi=pmix --nodes=2 --ntasks=4 --ntasks-per-node=2 .*train --zero_stage=1 --gradient_accumulation_steps=1 --mixed_precision=bf16$" &&
  grep -q "ctuner launch --accelerate-config \"\$here/accelerate.yaml\" --launcher srun" examples/slurm/ctuner.sbatch &&
  ok "examples/slurm: the sbatch script's launch" || bad "examples/slurm: $out"
out=$(SLURM_JOB_ID=9 SLURM_JOB_NUM_NODES=3 "$CT" launch --accelerate-config examples/slurm/accelerate.yaml --dry-run -- train 2>&1)
[ $? = 2 ] && echo "$out" | grep -q "the Slurm allocation has 3 node(s); .* says num_machines 2 (sbatch --nodes=2 --ntasks-per-node=2)" &&
  ok "allocation size checked against num_machines" || bad "slurm nodes: $out"
expect_err "srun with a hostfile refused" "--launcher srun takes the machines from Slurm" 's/x/x/' --launcher srun --hostfile "$tmp/hosts"
expect_err "unknown launcher" "--launcher pdsh: use mpirun or srun" 's/x/x/' --launcher pdsh

# A real launch on this machine: 1 machine x 2 processes, stage 1.
"$CT" dataset synth --out "$tmp/data" --count 8 --seed 2 >/dev/null
cat > "$tmp/backend.json" <<JSON
[{"id": "d", "type": "local", "instance_data_dir": "$tmp/data", "caption_strategy": "textfile"}]
JSON
printf 'distributed_type: DEEPSPEED\nnum_machines: 1\nnum_processes: 2\ndeepspeed_config:\n  zero_stage: 1\n' \
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
