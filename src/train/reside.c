/* The run's compute backend (compute_backend) and residency on it
 * (docs/training.md, "Compute backends and residency").
 *
 * Who owns which buffer where: the task builds the model on the CPU backend
 * (load, init, quantisation, LoRA init are host code), the optimizer, the EMA
 * and the bf16 master weights start as host buffers, and a resume reads the
 * checkpoint into them. ct_trainer_reside then moves each onto tr->be once,
 * before the strategy starts: from there the backend owns the parameters,
 * gradients, optimizer state, EMA, master weights and bf16 storage, and the
 * trainer reaches them only through the table (zero, sumsq, clamp_fwd,
 * scale_inplace, ema_update, the optimizer's updates, copy_in/copy_out). A
 * checkpoint copies the weights into a host buffer the model's writers read
 * (they also rearrange them: FLUX's diffusers layout), and the EMA and
 * optimizer state are read by the safetensors writer through copy_out, 8 MiB
 * at a time (ct_trainer_stage_out). On the CPU backend nothing moves and nothing is
 * copied. A backend without host memory refuses by name what would still
 * touch its memory from the host.
 * Not here: the batch's uploads (task_mmdit.c), validation's (sample.c,
 * validation.c), bf16 storage (zero.c).
 */
#include <stdlib.h>
#include <string.h>

#include "ctuner/log.h"
#include "ctuner/mmdit.h"
#include "trainer_int.h"

/* What a backend without host memory cannot run yet, by name; CT_OK if none. */
static ct_status refuse_host_paths(const trainer *tr, const ct_backend_ops *be, ct_err *err) {
  const ct_config *cfg = tr->cfg;
  const char *why = NULL;
  char buf[160];
  if (!strcmp(cfg->model_type, "vae"))
    why = "model_type vae (its trainer reads the model's buffers on the host)";
  else if (!strcmp(cfg->model_type, "lora") && !strcmp(cfg->lora_type, "lycoris"))
    why = "lora_type lycoris (LoHa/LoKr rebuilds and LoCon are host loops)";
  else if (!strcmp(cfg->model_type, "lora") && cfg->use_dora)
    why = "use_dora (DoRA's weight norms are host loops)";
  else if ((cfg->offload_optimizer && strcmp(cfg->offload_optimizer, "none")) ||
           (cfg->offload_param && strcmp(cfg->offload_param, "none")))
    why = "offload_optimizer / offload_param (the swap file is read and written on the host)";
  else if (cfg->zero_stage >= 1 || tr->world > 1) {
    snprintf(buf, sizeof buf,
             "zero_stage %ld with %d rank(s) (more than one rank, or ZeRO, communicates host "
             "buffers: one rank, zero_stage 0)",
             cfg->zero_stage, tr->world);
    why = buf;
  }
  if (!why) {
    const ct_optim_info *oi = ct_optim_lookup(cfg->optimizer, NULL);
    static const ct_optim_kind ok[] = {CT_OPTIM_ADAMW, CT_OPTIM_ADAM, CT_OPTIM_LION, CT_OPTIM_SGD,
                                       CT_OPTIM_ADAGRAD};
    int fine = 0;
    for (size_t i = 0; oi && !(oi->flags & CT_OPTIM_ONEBIT) && i < sizeof ok / sizeof ok[0]; i++)
      fine |= oi->kind == ok[i];
    if (oi && !fine) {
      snprintf(buf, sizeof buf,
               "optimizer %s (its per-tensor rules or compressed communication read the host's "
               "buffers; use adamw, adamw_bf16, adam, lion, sgd or adagrad)",
               cfg->optimizer);
      why = buf;
    }
  }
  if (!why) return CT_OK;
  return ct_errf(err, CT_ERR_UNSUPPORTED,
                 "compute_backend %s keeps the model in memory the host cannot touch, and %s does "
                 "not run there yet; use compute_backend cpu for it",
                 be->name, why);
}

ct_status ct_trainer_pick_backend(trainer *tr, ct_err *err) {
  const ct_config *cfg = tr->cfg;
  const char *name =
      cfg->compute_backend && cfg->compute_backend[0] ? cfg->compute_backend : "auto";
  const ct_backend_ops *be = NULL;
  ct_status st = CT_OK;
  if (!strcmp(name, "auto")) {
    ct_err ignored = {0};
    if (ct_backend_get("cuda", &be, &ignored) != CT_OK) be = ct_backend_default();
  } else if ((st = ct_backend_get(name, &be, err))) {
    ct_err_prefix(err, "compute_backend: ");
    return st;
  }
  if (!be->host_memory && (st = refuse_host_paths(tr, be, err))) return st;
  const char *lacks = ct_backend_lacks(be, "zero sumsq clamp_fwd scale_inplace ema_update copy_2d");
  if (!lacks && !strcmp(cfg->mixed_precision, "bf16"))
    lacks = ct_backend_lacks(be, "bf16_widen bf16_narrow bf16_narrow_acc");
  if (lacks)
    return ct_errf(err, CT_ERR_UNSUPPORTED, "compute_backend %s has no %s, which the trainer needs",
                   be->name, lacks);
  tr->be = be;
  if (tr->rank == 0) {
    const ct_backend_ops *bf = NULL;
    ct_err ignored = {0};
    const int bf16 = !strcmp(cfg->mixed_precision, "bf16") &&
                     ct_backend_with_compute(be, CT_COMPUTE_BF16, &bf, &ignored) == CT_OK;
    CT_INFO("compute backend %s%s%s%s: %s", be->name, bf16 ? " (products on " : "",
            bf16 ? bf->name : "", bf16 ? ")" : "", be->description);
  }
  return CT_OK;
}

ct_status ct_trainer_check(trainer *tr, const char *where, ct_err *err) {
  const ct_backend_ops *be = ct_trainer_be(tr);
  if (!be->check) return CT_OK;
  ct_status st = be->check(err);
  if (st) ct_err_prefix(err, "compute backend %s, %s: ", be->name, where);
  return st;
}

ct_status ct_trainer_reside(trainer *tr, ct_err *err) {
  const ct_backend_ops *be = ct_trainer_be(tr), *cpu = ct_backend_default();
  if (be->alloc == cpu->alloc && be->free == cpu->free) return CT_OK; /* host memory already */
  ct_model *m = tr->model;
  if (!m->ops->set_backend)
    return ct_errf(err, CT_ERR_UNSUPPORTED, "the %s model cannot move to compute backend %s",
                   m->ops->family, be->name);
  /* the model keeps the products it computes in (bf16 under mixed_precision bf16) */
  const ct_backend_ops *mbe = be;
  ct_status st =
      tr->m ? ct_backend_with_compute(be, ct_mmdit_backend(tr->m)->compute, &mbe, err) : CT_OK;
  if (!st) st = m->ops->set_backend(m, mbe, err);
  if (!st && tr->opt) st = ct_optim_set_backend(tr->opt, be, err);
  const size_t nr = tr->hi - tr->lo, ne = tr->own ? nr : ct_model_numel(m);
  if (!st && tr->ema && ne) {
    st = ct_backend_move(cpu, be, CT_MEM_OPTIMIZER, ne * sizeof(float), (void **)&tr->ema, err);
    tr->ema_moved = !st;
  }
  if (!st && tr->wsh && nr) {
    st = ct_backend_move(cpu, be, tr->bf16 ? CT_MEM_OPTIMIZER : CT_MEM_PARAMS, nr * sizeof(float),
                         (void **)&tr->wsh, err);
    tr->wsh_moved = !st;
  }
  if (!st) st = ct_trainer_check(tr, "moving the model", err);
  return st;
}

/* n floats of backend memory copied into a new host buffer (NULL on failure). */
static float *host_copy(const ct_backend_ops *be, const float *src, size_t n) {
  float *h = malloc((n ? n : 1) * sizeof *h);
  if (h && n) be->copy_out(h, src, n * sizeof *h);
  return h;
}

ct_status ct_trainer_stage_out(trainer *tr, ct_ckpt_io *io, host_stage *hs, ct_err *err) {
  memset(hs, 0, sizeof *hs);
  const ct_backend_ops *be = ct_trainer_be(tr);
  if (be->host_memory) return CT_OK;
  hs->on = 1;
  ct_model *m = tr->model;
  const size_t nw = ct_model_numel(m);
  const float *w = ct_model_params(m);
  hs->w = w ? host_copy(be, w, nw) : NULL;
  if (w && !hs->w) return ct_errf(err, CT_ERR_NOMEM, "out of memory staging the weights");
  if (hs->w) hs->saved_w = m->ops->swap_params(m, hs->w);
  io->read = be->copy_out; /* the EMA and optimizer state: read chunk by chunk as written */
  return ct_trainer_check(tr, "copying the checkpoint out", err);
}

void ct_trainer_stage_release(trainer *tr, ct_ckpt_io *io, host_stage *hs) {
  if (!hs->on) return;
  if (hs->w) tr->model->ops->swap_params(tr->model, hs->saved_w);
  free(hs->w);
  io->read = NULL;
  memset(hs, 0, sizeof *hs);
}
