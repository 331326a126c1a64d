/* s3.c: the S3 backend (in progress). */
#include "storage/storage_int.h"
ct_status ct_storage_open_s3(const ct_s3_config *c, ct_storage **out, ct_err *err) {
  (void)c;
  *out = NULL;
  return ct_errf(err, CT_ERR_UNSUPPORTED, "s3: not built yet");
}
ct_status ct_sigv4_authorization(const char *method, const char *canonical_uri, const char *canonical_query,
                                 const char *const *headers, int nh, const char *payload_hash,
                                 const char *amz_date, const char *region, const char *service,
                                 const char *access_key, const char *secret_key, char *out, size_t out_n,
                                 ct_err *err) {
  return ct_errf(err, CT_ERR_UNSUPPORTED, "not yet");
}
