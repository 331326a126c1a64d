/* An Accelerate config file (YAML) as `ctuner launch` uses it: accel_yaml.c
 * reads and checks it, cmd_launch.c turns it into an mpirun or srun command.
 * (docs/distributed.md, "Launching from an Accelerate config".) */
#ifndef CT_CLI_ACCEL_H
#define CT_CLI_ACCEL_H

typedef struct ct_accel {
  /* processes and machines */
  char distributed_type[64];
  long num_machines, num_processes, machine_rank;
  char main_process_ip[256];
  long main_process_port; /* -1: not given (null) */
  int same_network;       /* -1 not given, 0, 1 */
  char hostfile[1024]; /* from mpirun_config.mpirun_hostfile or deepspeed_config.deepspeed_hostfile
                        */
  const char *hostfile_key; /* which of the two, for messages; NULL if none */
  /* what training runs with; "" / -1 when the file does not say (the training config's own) */
  char mixed_precision[32];
  long zero_stage, grad_accum;
  char offload_opt[32], offload_param[32];
  char nvme_path[1024];
  char ds_file[1024];  /* deepspeed_config.deepspeed_config_file */
  char grad_clip[64];  /* deepspeed_config.gradient_clipping, as written */
  char ds_inline[256]; /* inline DeepSpeed keys given (Accelerate refuses them beside a file) */
} ct_accel;

/* Reads and checks path. Keys that change nothing here warn once each on
 * stderr, saying why; keys ctuner cannot honour are refused by name. Returns
 * 0, or -1 with the message printed. */
int ct_accel_load(const char *path, ct_accel *c);

#endif
