/* discover.h: the item list of one dataset (discover.c). */
#ifndef CTUNER_DISCOVER_H
#define CTUNER_DISCOVER_H

#include "data/data_int.h"

enum { CT_DISC_OK = 0, CT_DISC_UNREADABLE, CT_DISC_NOT_FOUND, CT_DISC_NO_CAPTION };

typedef struct ct_disc_item {
  char *rel;     /* path relative to instance_data_dir */
  int w, h;      /* displayed size (EXIF orientation applied) */
  char *caption; /* the caption text (lines split later) */
  int why;       /* CT_DISC_* */
} ct_disc_item;

typedef struct ct_disc {
  ct_disc_item *it; /* sorted by rel */
  size_t n, cap;
  size_t total, outside_dir, duplicate, metadata_missing;
} ct_disc;

/* Every rank calls it together; every rank gets the same list. sto: the
 * dataset's storage; dir: the images' key prefix in it ("" = its root);
 * name: the images' directory as users see it (a path or s3://bucket/prefix),
 * for messages and the file lists. listed: a preserved
 * all_image_files_<id>.json (its paths under name replace the listing), or
 * NULL. */
ct_status ct_discover(const ct_ds_config *c, ct_storage *sto, const char *dir, const char *name,
                      const ct_keyset *listed, struct ct_comm *comm, ct_disc *d, ct_err *err);
void ct_disc_free(ct_disc *d);
/* Test hook: 1 runs local directories through the generic storage path (the
 * one S3 datasets take) instead of the local fast path. */
extern int ct_disc_force_generic;
/* Caption lines of a text: trimmed, non-empty; returns the count. */
int ct_caption_lines(const char *text, char ***lines);

#endif
