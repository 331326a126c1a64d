/* The public entry points of training (train.h): ct_train_run picks the run
 * for the config's model_type (a task on the one loop, loop.c: task_mmdit.c
 * or task_vae.c) behind an output_dir that may be a bucket (remote.c), and
 * ct_cache_run builds the data caches without training. */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ctuner/log.h"
#include "trainer_int.h"

/* The task of a config's model_type: a task table per model family. */
/* output_dir s3://bucket/prefix: the run works in the local directory and
 * mirrors its checkpoints (src/train/remote.c). */
static ct_status with_output(const ct_config *cfg, int lead, ct_config *local_cfg,
                             ct_remote **remote, char **local, ct_err *err) {
  *local_cfg = *cfg;
  *remote = NULL;
  *local = NULL;
  if (!ct_remote_wanted(cfg)) return CT_OK;
  ct_status st = ct_remote_open(cfg, lead, remote, local, err);
  if (st) return st;
  local_cfg->output_dir = *local;
  if (lead)
    CT_INFO("output_dir %s: working in %s; checkpoints are mirrored to the bucket", cfg->output_dir,
            *local);
  return CT_OK;
}

ct_status ct_train_run(const ct_config *cfg, ct_comm *comm, ct_step_cb cb, void *user,
                       ct_train_summary *sum, ct_err *err) {
  ct_config c2;
  ct_remote *r;
  char *local;
  memset(sum, 0, sizeof *sum);
  ct_comm_set_timeout(comm, cfg->distributed_timeout); /* the collective watchdog */
  ct_status st = ct_train_family_check(cfg, err);      /* a known family not trainable yet */
  if (st) return st;
  st = with_output(cfg, ct_comm_rank(comm) == 0, &c2, &r, &local, err);
  if (!st) st = ct_trainer_run(&c2, r, comm, cb, user, sum, err);
  ct_remote_free(r);
  free(local);
  return st;
}

ct_status ct_cache_run(const ct_config *cfg_in, ct_comm *comm, ct_data_stats *stats, ct_err *err) {
  ct_config c2;
  ct_remote *r;
  char *local;
  ct_comm_set_timeout(comm, cfg_in->distributed_timeout); /* the collective watchdog */
  ct_status st0 = ct_train_family_check(cfg_in, err);
  if (st0) return st0;
  st0 = with_output(cfg_in, 0, &c2, &r, &local, err);
  ct_remote_free(r);
  if (st0) return st0;
  const ct_config *cfg = &c2;
  trainer tr = {.widx = -1, .task = &ct_task_mmdit};
  tr.cfg = cfg;
  tr.comm = comm;
  tr.rank = ct_comm_rank(comm);
  tr.world = ct_comm_size(comm);
  ct_status st = ct_trainer_open_data(&tr, err);
  if (!st) ct_dataset_stats(tr.ds, stats);
  ct_trainer_free(&tr);
  free(local);
  return st;
}
