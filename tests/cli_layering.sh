#!/usr/bin/env bash
# The build's include check (cmake/layering.cmake over cmake/modules.cmake):
# it passes on the real tree, and on a copy of the tree with one wrong-way
# include injected it fails naming file:line, the header, its owner and the
# fix — a public header of a module above (core -> train), another module's
# private header (cli -> synth/synth_int.h, optim -> ../kernels/gemm.h style),
# a header no module owns, and an allowance that no longer matches.
# Usage: tests/cli_layering.sh path/to/ctuner (the binary is not used).
. "$(dirname "$0")/lib/common.sh"
root=$(cd "$(dirname "$0")/.." && pwd)

check() { cmake -DCT_ROOT="$1" -P "$1/cmake/layering.cmake" >"$tmp/out" 2>&1; }
fresh() { rm -rf "$tmp/t" && mkdir "$tmp/t" && cp -r "$root/src" "$root/include" "$root/cmake" "$tmp/t/"; }
# expect_fail NAME PATTERN...: the check fails and its output holds every pattern.
expect_fail() {
  local name=$1; shift
  if check "$tmp/t"; then bad "$name: the check passed"; return; fi
  for p in "$@"; do
    grep -qF -- "$p" "$tmp/out" || { bad "$name: no '$p' in: $(cat "$tmp/out")"; return; }
  done
  ok "$name"
}

check "$root" && ok "the real tree passes" || bad "the real tree fails: $(cat "$tmp/out")"

# core/log.c including the trainer's header: line number, owner, the cycle it would make.
fresh
line=$(grep -n '^#include "ctuner/log.h"' "$tmp/t/src/core/log.c" | head -1 | cut -d: -f1)
sed -i "${line}a #include \"ctuner/train.h\"" "$tmp/t/src/core/log.c"
expect_fail "core including ctuner/train.h fails the check" \
  "src/core/log.c:$((line + 1)): includes \"ctuner/train.h\", the public header of module train, but core does not depend on train" \
  "fix: train already depends on core, so core -> train would be a cycle"

# a module using one that is not below it but not above it either: add the dependency, or move the code.
fresh
echo '#include "ctuner/optim.h"' >>"$tmp/t/src/image/png.c"
expect_fail "image including ctuner/optim.h names the missing dependency" \
  "src/image/png.c:$(wc -l <"$tmp/t/src/image/png.c"): includes \"ctuner/optim.h\", the public header of module optim" \
  "add it to the DEPS of ct_module(image) in cmake/modules.cmake"

# another module's private header, by module path and by relative path.
fresh
echo '#include "synth/synth_int.h"' >>"$tmp/t/src/cli/cmd_dataset.c"
expect_fail "cli including synth/synth_int.h fails the check" \
  "src/cli/cmd_dataset.c:" "includes \"synth/synth_int.h\", a private header of module synth" \
  "declare what cli needs in synth's public header"
fresh
echo '#include "../train/train_int.h"' >>"$tmp/t/src/data/cache.c"
expect_fail "data including ../train/train_int.h fails the check" \
  "includes \"../train/train_int.h\", a private header of module train"

# a public header nobody owns; a stale allowance.
fresh
printf '#ifndef X\n#define X\n#endif\n' >"$tmp/t/include/ctuner/orphan.h"
expect_fail "an unowned public header fails the check" "include/ctuner/orphan.h: no module owns it"
fresh
echo 'ct_layering_allow(src/core/log.c kernels/gemm.h "test")' >>"$tmp/t/cmake/modules.cmake"
expect_fail "an allowance matching nothing fails the check" \
  "the allowance \"src/core/log.c includes kernels/gemm.h\" matches nothing any more"

# a cycle in the declared graph.
fresh
sed -i 's/^ct_module(kernels DEPS core /ct_module(kernels DEPS core optim /' "$tmp/t/cmake/modules.cmake"
expect_fail "a dependency cycle fails the check" "dependency cycle: kernels -> optim -> kernels"

# the build runs it: CMakeLists.txt makes every module wait for ct_layering.
grep -q 'add_dependencies(${t} ct_layering)' "$root/CMakeLists.txt" \
  && grep -q 'add_custom_target(ct_layering ALL' "$root/CMakeLists.txt" \
  && ok "the build runs the check before compiling a module" || bad "CMakeLists.txt does not run cmake/layering.cmake"
exit $fail
