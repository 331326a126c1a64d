/* core_int.h: helpers shared between core .c files, not part of the public API. */
#ifndef CTUNER_CORE_INT_H
#define CTUNER_CORE_INT_H

#include <stddef.h>

/* 1 if s[0..n) is valid UTF-8 (no overlongs, surrogates or code points past U+10FFFF). */
int ct_utf8_valid(const char *s, size_t n);

#endif
