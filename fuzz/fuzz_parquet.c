/* fuzz_parquet.c: libFuzzer target for the Parquet reader (src/data/parquet.c
 * and the Thrift compact parser in parquet_thrift.c).
 *
 * Each input is opened from an exact-size heap copy (so ASan sees over-reads)
 * with ct_parquet_open_mem, then every supported column is scanned (plus a
 * scan of each column alone, to reach per-column paths). A scan stops after
 * 20,000 rows so that footers claiming billions of rows do not time out.
 * Every failure must carry a message; values handed to the callback are read
 * in full (strings byte by byte) so that bad pointers show up.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ctuner/parquet.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int row_fn(void *ctx, int64_t row, const ct_pq_value *v) {
  int n = *(int *)ctx;
  volatile unsigned sum = 0;
  for (int k = 0; k < n; k++) {
    if (v[k].kind == CT_PQ_BYTES)
      for (size_t i = 0; i < v[k].len; i++) sum += (unsigned char)v[k].s[i];
    else if (v[k].kind > CT_PQ_BYTES)
      abort();
  }
  return row >= 20000;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  uint8_t *copy = malloc(size ? size : 1);
  if (!copy) return 0;
  memcpy(copy, data, size);
  ct_parquet *pq = NULL;
  ct_err err = {0};
  if (ct_parquet_open_mem(copy, size, &pq, &err) != CT_OK) {
    if (err.msg[0] == '\0' || pq != NULL) abort();
    free(copy);
    return 0;
  }
  int nc = ct_parquet_num_columns(pq), n = 0;
  int *cols = malloc(sizeof(int) * (size_t)(nc + 1));
  for (int i = 0; i < nc; i++) {
    ct_pq_column_info ci;
    if (ct_parquet_column_info(pq, i, &ci) != CT_OK || !ci.name || !ci.physical) abort();
    if (ct_parquet_column_index(pq, ci.name) < 0) abort();
    if (ci.supported) cols[n++] = i;
  }
  memset(&err, 0, sizeof err);
  if (ct_parquet_scan(pq, cols, n, row_fn, &n, &err) != CT_OK && err.msg[0] == '\0') abort();
  for (int k = 0; k < n && k < 8; k++) {
    int one = 1;
    memset(&err, 0, sizeof err);
    if (ct_parquet_scan(pq, &cols[k], 1, row_fn, &one, &err) != CT_OK && err.msg[0] == '\0')
      abort();
  }
  free(cols);
  ct_parquet_free(pq);
  free(copy);
  return 0;
}
