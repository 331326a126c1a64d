/* Checkpoints of a training run: the free-space and breaker gate every rank
 * agrees on before one, the save (one writer, or every rank its optimizer
 * fragments into rank 0's temporary directory), and the resume (rank 0
 * decides which checkpoint, pulled from the output bucket if newer). The
 * file formats are checkpoint.c's. */
#include <errno.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ctuner/alloc.h"
#include "ctuner/hash.h"
#include "ctuner/json.h"
#include "ctuner/log.h"
#include "ctuner/rng.h"
#include "ctuner/vae.h"
#include "trainer_int.h"

/* A checkpoint. One rank, or an unsharded optimizer: rank 0 writes it all.
 * Sharded: every rank writes its optimizer fragments into the temporary
 * directory rank 0 prepared, rank 0 the rest, and rank 0 commits (.guard)
 * only after every rank reported its file durable; the others learn the
 * outcome, so all ranks fail together. */
ct_status ct_run_save_checkpoint(trainer *tr, const ct_ckpt_io *io, const ct_train_state *s,
                                 ct_train_summary *sum, ct_err *err) {
  const ct_config *cfg = tr->cfg;
  const int lead = tr->rank == 0;
  if (!tr->zero || tr->world == 1)
    return lead ? ct_checkpoint_save(cfg->output_dir, io, s, cfg->checkpoints_total_limit,
                                     sum->last_checkpoint, sizeof sum->last_checkpoint, err)
                : CT_OK;
  char tmp[4096];
  double bad = 0;
  ct_status st =
      lead ? ct_checkpoint_prepare(cfg->output_dir, s->global_step, tmp, sizeof tmp, err) : CT_OK;
  bad = st ? 1 : 0;
  ct_status cs = ct_comm_broadcast(tr->comm, &bad, sizeof bad, 0, err); /* the directory exists */
  if (cs) return cs;
  if (bad)
    return st ? st : ct_errf(err, CT_ERR_IO, "rank 0 could not prepare the checkpoint directory");
  if (!lead && ct_pathf(tmp, sizeof tmp, "%s/checkpoint-%ld-tmp", cfg->output_dir, s->global_step))
    st = ct_errf(err, CT_ERR_RANGE, "output_dir path is too long: %s", cfg->output_dir);
  if (!st) st = ct_checkpoint_write_fragments(tmp, io, s, tr->rank, tr->world, err);
  if (!st && lead) st = ct_checkpoint_write_main(tmp, io, s, 1, err);
  double fails[2] = {st ? 1 : 0, st ? (double)tr->rank : 0};
  cs = ct_comm_allreduce_f64(tr->comm, fails, 2, err); /* every rank's files are durable (or not) */
  if (cs) return cs;
  if (st) return st;
  if (fails[0] > 0)
    return ct_errf(err, CT_ERR_IO,
                   "checkpoint %s: %g rank(s) failed to write their part (see their messages)", tmp,
                   fails[0]);
  if (lead)
    st = ct_checkpoint_commit(cfg->output_dir, tmp, s->global_step, cfg->checkpoints_total_limit,
                              sum->last_checkpoint, sizeof sum->last_checkpoint, err);
  bad = st ? 1 : 0;
  cs = ct_comm_broadcast(tr->comm, &bad, sizeof bad, 0, err);
  if (cs) return cs;
  if (!st && bad) st = ct_errf(err, CT_ERR_IO, "rank 0 could not complete checkpoint %s", tmp);
  return st;
}

/* Before a checkpoint every rank agrees on two things, in rounds of one
 * all-reduce: rank 0's verdict on the free space of output_dir (enough, wait,
 * stop) and whether the breaker opened anywhere since the step began. A
 * fault stops every rank without the checkpoint; so does too little space
 * (disk_low_action stop or a script that freed too little); wait polls. */
ct_status ct_run_checkpoint_gate(trainer *tr, long step, ct_train_summary *sum, ct_err *err) {
  if (!tr->h) return CT_OK;
  for (int round = 0;; round++) {
    ct_err de = {0};
    double f[2] = {
        tr->rank == 0 ? (double)ct_health_disk_verdict(tr->h, tr->cfg->output_dir, round, &de) : 0,
        (double)ct_health_is_open(tr->h)};
    if (tr->world > 1) {
      ct_status cs = ct_comm_allreduce_f64(tr->comm, f, 2, err);
      if (cs) return cs;
    }
    if (f[1] > 0) {
      sum->joint_stop = 1;
      return ct_health_is_open(tr->h)
                 ? ct_errf(err, CT_ERR_HEALTH,
                           "circuit breaker open before checkpoint %ld: %s; stopped without it",
                           step, ct_health_reason(tr->h))
                 : ct_errf(err, CT_ERR_HEALTH,
                           "circuit breaker open on %.0f other rank(s) before checkpoint %ld; "
                           "stopped without it",
                           f[1], step);
    }
    if (f[0] == 0) return CT_OK;
    if (f[0] >= 2) {
      sum->joint_stop = 1; /* every rank stops here together */
      if (tr->rank == 0) {
        if (err) *err = de;
        return CT_ERR_IO;
      }
      return ct_errf(err, CT_ERR_IO, "rank 0 found too little free space in %s for checkpoint %ld",
                     tr->cfg->output_dir, step);
    }
    usleep((useconds_t)(ct_health_poll_seconds(tr->h) * 1e6)); /* disk_low_action wait */
  }
}

/* resume_from_checkpoint: latest (this output_dir, or a newer one in the
 * output bucket) or a path. Rank 0 decides, every rank loads the same step. */
static ct_status resume(trainer *tr, ct_ckpt_io *io, ct_train_state *s, char **loaded,
                        ct_err *err) {
  const ct_config *cfg = tr->cfg;
  ct_comm *comm = tr->comm;
  const int lead = tr->rank == 0;
  ct_status st = CT_OK;
  if (!strcmp(cfg->resume_from_checkpoint, "none")) return CT_OK;
  {
    char dir[4096] = "";
    long cs = 0;
    int have = 0;
    ct_status pulled = CT_OK; /* output_dir s3://: rank 0 fetches a newer remote checkpoint first */
    if (!strcmp(cfg->resume_from_checkpoint, "latest")) {
      long ps = 0;
      if (lead && tr->remote) pulled = ct_remote_pull_latest(tr->remote, cfg->output_dir, &ps, err);
      ct_err e2 = {0};
      have = !pulled && ct_checkpoint_latest(cfg->output_dir, dir, sizeof dir, &cs, &e2) == CT_OK;
    } else {
      snprintf(dir, sizeof dir, "%s", cfg->resume_from_checkpoint);
      have = 1;
    }
    if (tr->world > 1) { /* rank 0 decides, so no rank resumes from another step */
      char msg[4100];
      msg[0] = pulled ? 2 : (char)have;
      memcpy(msg + 1, dir, sizeof dir);
      st = ct_comm_broadcast(comm, msg, sizeof msg, 0, err);
      if (st) return st;
      if (msg[0] == 2 && !pulled)
        pulled = ct_errf(err, CT_ERR_IO,
                         "rank 0 could not download the newest checkpoint of the output bucket");
      have = msg[0] == 1;
      memcpy(dir, msg + 1, sizeof dir);
      dir[sizeof dir - 1] = 0;
    }
    if (pulled) {
      st = pulled;
      return st;
    }
    if (have) {
      char digest[17];
      char optname[sizeof s->optimizer];
      memcpy(digest, s->digest, sizeof digest);
      memcpy(optname, s->optimizer, sizeof optname);
      ct_health_stage(tr->h, "init_resume_checkpoint", "Resuming from checkpoint", "running", 0);
      st = ct_checkpoint_load(dir, io, s, err);
      if (st) {
        ct_err_prefix(err, "resume_from_checkpoint: ");
        return st;
      }
      ct_health_stage(tr->h, "init_resume_checkpoint", "Resuming from checkpoint", "completed",
                      100);
      if (strcmp(digest, s->digest))
        CT_WARN("resuming %s with a different configuration (digest %s, checkpoint %s)", dir,
                digest, s->digest);
      memcpy(s->digest, digest, sizeof digest);
      memcpy(s->optimizer, optname, sizeof optname); /* this run's optimizer, as the digest */
      CT_INFO("resumed from %s at step %ld (epoch %ld)", dir, s->global_step, s->epoch + 1);
      if (!(*loaded)) { /* a checkpoint from before the bucketed loader: epoch and sample ids only
                         */
        char buf[256];
        snprintf(buf, sizeof buf,
                 "{\"epoch\": %ld, \"step_in_epoch\": 0, \"samples_seen\": %ld, \"datasets\": {}}",
                 s->epoch, s->samples_seen);
        (*loaded) = strdup(buf);
      }
      if ((*loaded)) st = ct_dataset_state_restore(tr->ds, (*loaded), err);
      free((*loaded));
      (*loaded) = NULL;
      if (st) {
        ct_err_prefix(err, "%s: ", dir);
        return st;
      }
    }
    if (tr->world > 1) { /* every rank must have read the same state */
      long mine[2] = {s->global_step, s->samples_seen}, root[2] = {s->global_step, s->samples_seen};
      st = ct_comm_broadcast(comm, root, sizeof root, 0, err);
      if (!st && (root[0] != mine[0] || root[1] != mine[1]))
        st = ct_errf(
            err, CT_ERR_IO,
            "rank %d resumed at step %ld but rank 0 at step %ld: %s is not the same on every "
            "machine (output_dir must be a shared file system)",
            tr->rank, mine[0], root[0], have ? dir : cfg->output_dir);
      if (st) return st;
    }
  }
  return CT_OK;
}

ct_status ct_run_resume(trainer *tr, ct_ckpt_io *io, ct_train_state *s, ct_err *err) {
  char *loaded = NULL; /* the sampler's position, if the checkpoint has one */
  io->sampler_out = &loaded;
  ct_status st = resume(tr, io, s, &loaded, err);
  io->sampler_out = NULL;
  free(loaded);
  return st;
}
