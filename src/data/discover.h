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

/* Every rank calls it together; every rank gets the same list. listed: a
 * preserved all_image_files_<id>.json (its paths under dir replace the
 * directory walk), or NULL. */
ct_status ct_discover(const ct_ds_config *c, const char *dir, const ct_keyset *listed, struct ct_comm *comm,
                      ct_disc *d, ct_err *err);
void ct_disc_free(ct_disc *d);
/* Caption lines of a text: trimmed, non-empty; returns the count. */
int ct_caption_lines(const char *text, char ***lines);

#endif
