/* The trainer's shared state and the seams between its files (private to
 * src/train). loop.c runs the steps; a parallel strategy (dp_*.c, behind
 * ct_dp_ops) reduces gradients and steps the optimizer; update.c steps this
 * rank's optimizer range, in memory or through the NVMe swap file;
 * task_mmdit.c is the flow-matching objective; validation.c samples the
 * validation grids; run_ckpt.c saves and resumes; setup.c builds what the
 * config asks for. docs/architecture.md draws the flow. */
#ifndef CT_TRAINER_INT_H
#define CT_TRAINER_INT_H

#include <stdio.h>

#include "ctuner/backend.h"
#include "ctuner/codec.h"
#include "ctuner/data.h"
#include "ctuner/diffusion.h"
#include "ctuner/health.h"
#include "ctuner/optim.h"
#include "train/model.h"
#include "train/offload.h"
#include "train/onebit.h"
#include "train/remote.h"
#include "train/zero.h"
#include "train_int.h"

/* Validation prompts: validation_prompt ("validation") + user_prompt_library. */
typedef struct vprompts {
  int n;
  char *short_[64];
  char *text[64];
} vprompts;

typedef struct trainer {
  const ct_config *cfg;
  ct_comm *comm;
  int rank,
      world; /* data parallel: rank r takes samples [r*B, (r+1)*B) of each global micro-batch */
  int zero;  /* ZeRO stage >= 1: this rank's optimizer covers [lo, hi) of the flat buffer */
  int stage; /* zero_stage */
  size_t shard, lo, hi;
  int bf16;         /* mixed_precision bf16 */
  int own;          /* the trainer holds the float32 weights of [lo, hi) in wsh (stage 3 or bf16) */
  zero_ctx z;       /* stages 2-3 and bf16 (zero.h) */
  float *wsh;       /* float32 (master) weights of [lo, hi) when own */
  void *fsh;        /* model_type lora at stage 3: this rank's bytes of the frozen base (zero.c) */
  ct_offload *foff; /* ... with offload_param nvme: those bytes in a swap file instead (fsh NULL) */
  ct_offload
      *off;      /* offload nvme: the optimizer state and/or (stage 3) the weights in a swap file */
  int opt_off;   /* the optimizer's state arrays are the file's first ones */
  int widx;      /* offload_param: the weights are the file's array widx (wsh is NULL); else -1 */
  ct_onebit *ob; /* optimizer onebitadam (its moments are tr.opt's Adam state) */
  char swap_dir[4200];
  ct_geometry g;
  ct_model *model;        /* the model interface (model.h) */
  ct_mmdit *m;            /* model->impl: the MMDiT task's own view */
  struct ct_lora *lora;   /* model_type lora: the adapters on m (owned by model) */
  struct ct_textcond *tc; /* text conditioning (textcond.h): built-in or FLUX.1's CLIP + T5 */
  struct ct_flux_pipe
      *fp; /* pretrained_model_name_or_path: the pipeline (flux_pipe.h), else NULL */
  ct_dataset *ds;
  ct_text_cb text_cb;
  ct_text_encoder_fn text_fn;
  double data_wait;          /* seconds waited for batches */
  ct_health *h;              /* monitor, circuit breaker, webhooks (ct_train_run only) */
  ct_remote *remote;         /* output_dir s3://...: checkpoints mirrored there (rank 0) */
  char remote_pending[1024]; /* a checkpoint whose upload failed, retried at the end */
  ct_codec codec;            /* pixel or VAE: the data's latents, validation's decoding */
  ct_optim *opt;
  ct_sched sched;
  float *ema; /* every parameter; when own: [lo, hi) only */
  vprompts vp;
  int vkeys_warned; /* warn_validation_keys ran (validation.c) */
  int vw, vh;
  long total;
  FILE *metrics;
  /* batch buffers (host) */
  float *eps, *xt, *v, *dv, *t, *txt, *y, *guid;
  /* their twins in the compute backend's memory when it is not host memory
   * (else NULL: the model reads the host buffers) */
  float *d_xt, *d_v, *d_dv, *d_t, *d_txt, *d_y, *d_guid;
  /* model_flavour kontext (docs/kontext.md): the batches' reference latents
   * go into ct_mmdit_forward_ref; d_ref is their twin on the compute backend */
  int kontext, kontext_warned;
  float *d_ref;
  /* compute_backend (reside.c): where the model, gradients, optimizer state,
   * EMA and master weights live once ct_trainer_reside moved them; the model
   * computes on its compute sibling (bf16) of the same memory */
  const ct_backend_ops *be;
  int ema_moved, wsh_moved;       /* ema, wsh are be's memory (else host: ct_alloc) */
  const struct ct_dp_ops *dp;     /* the parallel strategy (dp.c picks it) */
  const struct ct_task_ops *task; /* the model family and objective */
  void *tk;                       /* the task's own state (task_vae.c) */
  long opt_steps0;                /* optimizer steps applied before this run (a resume) */
  struct ct_tb *tb;               /* report_to tensorboard: the event file (rank 0; tboard.c) */
  double wait_logged;             /* data_wait at the last metrics line */
} trainer;

/* When the trainer holds the weights (stage 3, bf16): the full float32
 * weights and EMA on rank 0 — gathered from the ranks' ranges, or the
 * trainer's own when it holds all — with the model pointing at them without
 * hooks, for validation and checkpoints; every rank takes part. Otherwise
 * nothing: the model has its full weights. */
typedef struct full_view {
  float *w, *e;
  void *base; /* rank 0: the whole frozen storage, gathered (frozen) */
  int base_owned;
  void *base_mine; /* offload_param: this rank's bytes of it read back from the file */
  int owned;       /* gathered copies, freed by release */
  float *mine;     /* offload_param: this rank's weights read back from the file */
} full_view;

/* ---- parallel strategies (docs/distributed.md) ----
 * One table per data-parallel mode. The loop calls them in this order each
 * optimizer step: begin_step (zero the gradient storage), the micro-batches,
 * reduce (every rank's gradient summed and this rank's part returned with the
 * global loss and gradient norm), then — unless the step is skipped — step
 * (update this rank's range and share the new weights). gather_full and
 * release_full give rank 0 the whole float32 model for validation and
 * checkpoints where the strategy holds only a shard. */
typedef struct ct_dp_ops {
  const char *name;
  /* after the weights, EMA and optimizer state are loaded (resumed) */
  ct_status (*start)(trainer *tr, ct_err *err);
  void (*begin_step)(trainer *tr);
  /* parts: in, this rank's loss parts; out, their sums over ranks. *g: this
   * rank's gradient range (hi - lo floats), *gn: the global gradient norm. */
  ct_status (*reduce)(trainer *tr, long opt_step, double *parts, int nparts, float **g, double *gn,
                      ct_err *err);
  /* the optimizer on this rank's range with gradient g, then every rank gets the weights it needs
   */
  ct_status (*step)(trainer *tr, float *g, float lr, long opt_step, const float *ema_dcy,
                    ct_err *err);
  void (*report)(const trainer *tr); /* rank 0, end of run: what it moved */
} ct_dp_ops;
extern const ct_dp_ops ct_dp_plain, ct_dp_zero1, ct_dp_zero, ct_dp_onebit;
/* The strategy of a config: 1-bit optimizers, ZeRO-2/3 or bf16 storage, ZeRO-1, plain. */
const ct_dp_ops *ct_dp_pick(const ct_config *cfg);
/* begin_step of the strategies that keep the whole float32 gradient */
void ct_dp_clear_grads(trainer *tr);

/* The full float32 weights (and EMA) on rank 0 when the trainer holds only a
 * range (stage 3, bf16): every rank takes part. Nothing otherwise. frozen:
 * also a sharded frozen storage (LoRA's base at stage 3), for validation. */
ct_status ct_dp_gather_full(trainer *tr, full_view *fv, int frozen, ct_err *err);
void ct_dp_release_full(trainer *tr, full_view *fv);

/* ---- update.c: this rank's optimizer update ---- */
/* offload_optimizer/offload_param nvme: the state (and weights) into the swap file */
ct_status ct_update_start_offload(trainer *tr, ct_err *err);
/* w: this rank's (master) weights; ema_dcy non-NULL: the EMA is due with that
 * decay and, when the weights live in the swap file, updated here (*ema_done). */
ct_status ct_update_step(trainer *tr, float *w, const float *g, float lr, long opt_step,
                         const float *ema_dcy, ct_err *err);
/* The offloaded optimizer state read back for a checkpoint (NULL when in memory). */
ct_status ct_update_offload_states(trainer *tr, float ***out, ct_err *err);
void ct_update_free_states(trainer *tr, float **a);

/* ---- tasks: a model family and its objective (task_mmdit.c, task_vae.c) ----
 * The loop knows a task only through this table. Losses travel as up to
 * CT_TASK_PARTS partial sums (micro_batch adds to them, the strategy sums
 * them over ranks, loss() combines them), so each task keeps its own
 * normalisation and its metrics. */
#define CT_TASK_PARTS 4
typedef struct ct_task_ops {
  const char *name;
  /* Right after the config is validated, before anything is made: what the
   * task needs of it (geometry) and what it refuses. */
  ct_status (*configure)(trainer *tr, ct_err *err);
  /* After the common setup (config checked, threads, output_dir): the frozen
   * parts (text encoder, codec), the model's geometry, the dataset. */
  ct_status (*open)(trainer *tr, ct_err *err);
  /* tr->model (its range through ct_trainer_shard), pretrained weights,
   * validation inputs; refuses what the model cannot do. */
  ct_status (*new_model)(trainer *tr, ct_err *err);
  ct_status (*build_optim)(trainer *tr, ct_optim **out, ct_err *err);
  ct_status (*alloc)(trainer *tr, ct_err *err); /* batch buffers */
  int nparts;
  ct_status (*micro_batch)(trainer *tr, ct_train_state *s, int accum, long step, double *parts,
                           ct_err *err);
  double (*loss)(const trainer *tr, const double *parts);
  /* Extra metrics.jsonl fields of a step ("\"rec_loss\": 0.1, "), or "". */
  void (*metrics)(const trainer *tr, const double *parts, char *buf, size_t n);
  /* Rank 0 on the full model: *nimg images written (0: none); where names
   * them for the webhook, ev describes them for the progress callback. */
  ct_status (*validate)(trainer *tr, long step, int *nimg, char *where, size_t wn, char *ev,
                        size_t evn, ct_err *err);
  ct_status (*extra)(void *user, const char *dir,
                     ct_err *err); /* its files in a checkpoint, or NULL */
  /* After checkpoint `path` of step was committed (every rank), or NULL. */
  ct_status (*checkpoint_done)(trainer *tr, const char *path, int last, ct_err *err);
  void (*free)(trainer *tr);
} ct_task_ops;
extern const ct_task_ops ct_task_mmdit, ct_task_vae, ct_task_sdxl;
/* The family rows' memory-plan hooks (memplan.c; ct_train_plan_denoiser). */
ct_status ct_plan_flux(const ct_config *cfg, int batch, long res, int tokens, int ckpt,
                       ct_plan_denoiser *o, ct_err *err);
ct_status ct_plan_sdxl(const ct_config *cfg, int batch, long res, int tokens, int ckpt,
                       ct_plan_denoiser *o, ct_err *err);
/* The family registry's trainer rows (family.c): the task of model_family
 * (model_type vae: the VAE's), and the refusal of a family known but not
 * trainable yet (before anything is opened). names: the rows' families. */
const ct_task_ops *ct_task_pick(const ct_config *cfg);
ct_status ct_train_family_check(const ct_config *cfg, ct_err *err);
int ct_train_family_rows(const char **names, int max);
/* The family's denoiser opener (ctuner/diffusion.h), or CT_ERR_UNSUPPORTED naming why. */
ct_status ct_train_family_denoiser(const char *family, ct_denoiser_open_fn *open, ct_err *err);
/* The range [lo, hi) of the model this rank steps and, when the trainer
 * holds the weights (stage 3, bf16), their float32 copy initialised. */
ct_status ct_trainer_shard(trainer *tr, ct_err *err);
/* The optimizer over tr->model's tensor table, cut to [lo, hi): every tensor
 * of 2 or more dimensions a matrix (out, in x kh x kw) for the tensor-wise
 * optimizers, which are refused by name when a ZeRO boundary cuts a tensor
 * (the U-net's and the VAE's tasks). */
ct_status ct_trainer_optim_table(trainer *tr, ct_optim **out, ct_err *err);

/* ---- validation.c ---- */
ct_status ct_validation_init(trainer *tr, ct_err *err);
/* A task's validation sampler: the images out[0..n) of prompts[0..n) at
 * tr->vw x tr->vh, image i from validation_seed's noise of index i, with
 * the model's parameters as they are at the call (live or EMA). */
struct ct_image;
typedef ct_status (*ct_vsample_fn)(trainer *tr, const char *const *prompts, int n,
                                   struct ct_image *out, ct_err *err);
/* Every validation prompt through sample (live weights and/or EMA, as
 * ema_validation says): the PNGs, their prompt sidecars and the step's grid
 * in output_dir/validation_images; *nimages written. */
ct_status ct_validate_with(trainer *tr, long step, ct_vsample_fn sample, int *nimages, ct_err *err);
/* The MMDiT's (ct_validate_with with the flow-matching sampler). */
ct_status ct_validate(trainer *tr, long step, int *nimages, ct_err *err);
void ct_validation_free(trainer *tr);

/* ---- tboard.c: report_to tensorboard (rank 0) ---- */
/* The event file under logging_dir/tracker_project_name, its session_log
 * START at resumed_step + 1 and the config as text (resumed_step: the step
 * the run starts from, 0 if fresh). Other trackers: one warning. */
ct_status ct_tboard_open(trainer *tr, long resumed_step, ct_err *err);
/* A metrics.jsonl line (with its newline) written, and its numbers logged. */
void ct_trainer_log_metrics(trainer *tr, long step, const char *line);
/* The PNGs validation wrote for step. */
void ct_tboard_validation(trainer *tr, long step);
void ct_tboard_close(trainer *tr);

/* ---- run_ckpt.c: checkpoints of a run ---- */
ct_status ct_run_save_checkpoint(trainer *tr, const ct_ckpt_io *io, const ct_train_state *s,
                                 ct_train_summary *sum, ct_err *err);
ct_status ct_run_checkpoint_gate(trainer *tr, long step, ct_train_summary *sum, ct_err *err);
ct_status ct_run_resume(trainer *tr, ct_ckpt_io *io, ct_train_state *s, ct_err *err);

/* ---- loop.c ---- */
ct_status ct_trainer_run(const ct_config *cfg, ct_remote *remote, ct_comm *comm, ct_step_cb cb,
                         void *user, ct_train_summary *sum, ct_err *err);
void ct_trainer_free(trainer *tr);

/* ---- reside.c: the compute backend and residency (docs/training.md) ---- */
/* tr->be from compute_backend (auto: cuda when usable, else cpu), with the
 * refusals of a backend without host memory; logs it (rank 0). */
ct_status ct_trainer_pick_backend(trainer *tr, ct_err *err);
/* After the resume, before the strategy starts: the model, optimizer state,
 * EMA and master weights moved onto tr->be (nothing moves on the CPU). */
ct_status ct_trainer_reside(trainer *tr, ct_err *err);
/* The backend the trainer's own ops run on (tr->be; the CPU's before it is picked). */
static inline const ct_backend_ops *ct_trainer_be(const trainer *tr) {
  return tr->be ? tr->be : ct_backend_default();
}
/* tr->be's check (asynchronous device errors) as the status path; where names the point. */
ct_status ct_trainer_check(trainer *tr, const char *where, ct_err *err);
/* A checkpoint's host view when the memory is the device's: the weights the
 * model's writers read, copied out into a host buffer swapped in; the EMA and
 * optimizer state read through copy_out as they are written (io->read);
 * released (swapped back) after. */
typedef struct host_stage {
  int on;
  float *w, *saved_w;
} host_stage;
ct_status ct_trainer_stage_out(trainer *tr, ct_ckpt_io *io, host_stage *hs, ct_err *err);
void ct_trainer_stage_release(trainer *tr, ct_ckpt_io *io, host_stage *hs);

/* ---- setup.c ---- */
ct_status ct_trainer_open_data(trainer *tr, ct_err *err);
double ct_now_s(void);
/* Test hook: CTUNER_FAULT_NAN_AT_STEP=a,b,... poisons those steps' loss (tasks call it). */
int ct_fault_nan(long step);
void ct_fault_step_delay(void);

#endif
