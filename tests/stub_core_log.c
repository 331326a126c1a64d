/* Stand-in for the core module's ct_log_set_level, which harness.c calls, so the
 * test binary links in a worktree without src/core. It is a weak symbol: when
 * the core library provides the real one, the linker prefers it. Delete this
 * file once src/core is on the same branch. */
#include "ctuner/log.h"

__attribute__((weak)) void ct_log_set_level(ct_log_level level) { (void)level; }
