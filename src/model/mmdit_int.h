/* Private MMDiT structures: parameter views, the activation arena layout. */
#ifndef CT_MMDIT_INT_H
#define CT_MMDIT_INT_H

#include "ctuner/backend.h"
#include "ctuner/lora.h"
#include "ctuner/mmdit.h"

typedef struct lin {
  float *w, *b;   /* (out, in), (out) */
  float *gw, *gb; /* gradients or NULL */
  int in, out;
  ct_lora *lora; /* adapters on this weight (site), or NULL */
  int site;
  ct_wview wv; /* the weight as stored: float32 (= w) or bf16 / int8 (w NULL) */
} lin;

typedef struct dstream_p {
  lin mod, qkv, proj, mlp0, mlp2;
  float *qs, *ks, *gqs, *gks; /* query/key RMSNorm scales (hd) */
} dstream_p;

typedef struct sblock_p {
  lin l1, l2, mod;
  float *qs, *ks, *gqs, *gks;
} sblock_p;

/* Saved activations of one double-block stream; Ns = B * Ls rows. */
typedef struct dstream_a {
  float *mod;                /* (B, 6d) */
  const float *xin;          /* (Ns, d) input (previous block's output) */
  float *xhat1, *rstd1, *h1; /* (Ns, d), (Ns), (Ns, d) */
  float *qkv;                /* (Ns, 3d) */
  float *rq, *rk;            /* (Ns * H) RMSNorm rstd */
  float *os;                 /* (Ns, d) this stream's rows of the attention output */
  float *pr, *x1;            /* (Ns, d) */
  float *xhat2, *rstd2, *h2; /* (Ns, d), (Ns), (Ns, d) */
  float *u, *gu;             /* (Ns, mlp) pre/post GELU */
  float *m, *x2;             /* (Ns, d) */
} dstream_a;

typedef struct dblock_a {
  dstream_a s[2];   /* 0 = img, 1 = txt */
  float *q, *k, *v; /* (B, H, Lt, hd) */
  float *o;         /* (B, Lt, d) */
  float *lse;       /* (B, H, Lt) */
} dblock_a;

typedef struct sblock_a {
  float *mod;                 /* (B, 3d) */
  const float *xin;           /* (N, d) */
  float *xhat, *rstd, *h;     /* (N, d), (N), (N, d) */
  float *qkv, *u;             /* (N, 3d), (N, mlp) */
  float *rq, *rk;             /* (N * H) */
  float *q, *k, *v, *o, *lse; /* (B,H,Lt,hd) x3, (B,Lt,d), (B,H,Lt) */
  float *cat;                 /* (N, d + mlp): [attn, gelu(u)] */
  float *l2, *xout;           /* (N, d) */
} sblock_a;

typedef struct acts {
  int B, H, W, T, Li, Lt;
  int Lr;                     /* Kontext: reference tokens per item, the last Lr of Li */
  const float *in_txt, *in_y; /* the caller's inputs, borrowed until backward */
  float *img_p;               /* (B*Li, P) */
  float *temb, *t_h, *t_hs;   /* (B, 256), (B, d), (B, d) */
  float *y_h, *y_hs;          /* (B, d) */
  float *g_emb, *g_h, *g_hs;  /* guidance (B, 256), (B, d) x2 */
  float *vec, *svec, *tmpv;   /* (B, d) */
  float *img0, *txt0;         /* (B*Li, d), (B*T, d) */
  float *pe;                  /* (Lt, hd/2, 2) */
  int *pos;                   /* (Lt, 3) */
  dblock_a *db;
  sblock_a *sb;
  dblock_a db_rc;                        /* gradient checkpointing: the recomputed block */
  sblock_a sb_rc;                        /* (shared by every checkpointed block) */
  int db_rc_of, sb_rc_of;                /* the block whose activations they hold, or -1 */
  float *xj0;                            /* (N, d) joint input of the single blocks */
  float *xf, *xhatf, *rstdf, *hf, *modf; /* final layer: (Ni,d) x3, (Ni), (B, 2d) */
  float *outp;                           /* (Ni, P) */
  /* backward scratch */
  float *dimg, *dtxt, *dj;                                 /* (Ni, d), (Nt, d), (N, d) */
  float *dh, *dqkv, *dq, *dk, *dv, *dO, *du, *dcat, *dtmp; /* see mmdit.c */
  float *dmod;                      /* (2, B, 6d): per-stream modulation gradients */
  float *dsvec, *dvec, *dbv, *dbv2; /* (B, d) */
  float *doutp;                     /* (Ni, P) */
} acts;

struct ct_mmdit {
  ct_mmdit_config cfg;
  const ct_backend_ops *be; /* computes every op; owns w, g (when own_*) and the arena */
  ct_param *params;
  size_t nparams, numel;
  float *w, *g;
  int own_w, own_g;
  /* views */
  lin img_in, txt_in, time_in0, time_in1, vec_in0, vec_in1, g_in0, g_in1, final_lin, final_mod;
  dstream_p (*db)[2];
  sblock_p *sb;
  /* segments (ct_mmdit_segment) and where each one's views point now */
  int nseg;
  size_t *seg_off; /* nseg + 1 */
  float **segw, **segg;
  ct_mmdit_hooks hooks;
  int have_hooks;
  /* activations */
  acts a;
  int have_acts;  /* a forward has filled the arena */
  int ckpt_every; /* gradient checkpointing: every Nth block (0: off) */
  ct_lora *lora;  /* attached adapters (ct_mmdit_set_lora) or NULL */
  int frozen;     /* no weight gradients (ct_mmdit_set_frozen) */
  ct_wview *qv;   /* ct_mmdit_quantize: every parameter's storage (nparams), else NULL */
  void *qbuf;     /* ... all of it in one buffer (category params) */
  size_t qbytes;
  float *arena;
  size_t arena_floats;
  dblock_a *db_a;
  sblock_a *sb_a;
  int *pos;
};

void ct_mmdit_init_params(ct_mmdit *m, uint64_t seed);

#endif
