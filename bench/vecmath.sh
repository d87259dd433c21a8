#!/bin/sh
# vecmath.sh [REV] [ROUNDS] -- bench/vecmath.c: ns per element of each
# vecmath.h function, REV's header (default HEAD) against the working
# tree's, side by side in one run, with the JIT's flags. VB_FLAGS replaces
# the target part (default -march=native): VB_FLAGS="-march=x86-64-v3
# -mtune=native" measures the v3 tier, "-march=x86-64-v2 -mtune=native" v2,
# "-march=x86-64-v4 -mprefer-vector-width=512 -mtune=native" v4.
set -e
ROOT=$(cd "$(dirname "$0")/.." && pwd)
REV=${1:-HEAD}
CC=${CC:-cc}
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
mkdir -p "$W/old/codegen"
# (before the stage folders, vecmath.h was src/vecmath.h)
git -C "$ROOT" show "$REV:src/codegen/vecmath.h" >"$W/old/codegen/vecmath.h" 2>/dev/null ||
    git -C "$ROOT" show "$REV:src/vecmath.h" >"$W/old/codegen/vecmath.h"
FLAGS="-std=c11 -O3 ${VB_FLAGS:--march=native} -fopenmp -fno-math-errno"
$CC $FLAGS -DVB_SIDE=old -I"$W/old" -c "$ROOT/bench/vecmath.c" -o "$W/old.o"
$CC $FLAGS -DVB_SIDE=new -I"$ROOT/src" -c "$ROOT/bench/vecmath.c" -o "$W/new.o"
$CC $FLAGS "$ROOT/bench/vecmath.c" "$W/old.o" "$W/new.o" -lm -o "$W/vb"
echo "bench/vecmath: old = $REV:src/codegen/vecmath.h, new = working tree; 1 thread, 4096 floats in cache;" \
    "${VB_FLAGS:--march=native}"
"$W/vb" "${2:-5}"
