#!/bin/sh
# vectorize_check.sh ROOT WORKDIR [TIER...] -- prove src/codegen/vecmath.h
# vectorizes at every target tier.
#
# Each TIER is NAME|FLAGS|RUN (test_vecmath.c passes the tiers of
# src/base/target.c: v2, v3 and v4 with their -march flags, RUN 1 where this CPU
# runs the tier); without any, one tier "native|-march=native|1". For each
# tier it compiles loops `for (i..n) y[i] = f(x[i])`, one per function and
# a few fused bodies, with the JIT's flags (cc -O3 FLAGS -fopenmp
# -fno-math-errno -fPIC -std=c11) plus -fopt-info-vec-optimized, and
# requires (1) GCC's "loop vectorized" report on each loop's line and (2) no
# undefined symbol in the object: no call to libm or anything else survives.
# A libm expf loop serves as the negative control. Then builds
# tests/test_vecmath.c as a standalone program with the same flags
# (vectorized loops, a real FMA where the tier has one) and runs its ulp
# sweep (KILN_VECMATH_STRIDE, default 1021 here) where RUN is 1; a tier this
# CPU cannot run is compiled and checked, and the output says it did not run.
# Exit 0: all good; 1: a check failed; 77: no C compiler or not GCC (skip).
ROOT=${1:?usage: vectorize_check.sh ROOT WORKDIR [NAME|FLAGS|RUN...]}
WORK=${2:?usage: vectorize_check.sh ROOT WORKDIR [NAME|FLAGS|RUN...]}
shift 2
[ $# -gt 0 ] || set -- "native|-march=native|1"
CC=${CC:-cc}
command -v "$CC" >/dev/null 2>&1 || { echo "vectorize_check: no '$CC'"; exit 77; }
# -fopt-info is GCC's; another compiler cannot report, so skip.
"$CC" --version 2>/dev/null | grep -q 'Free Software Foundation' ||
    { echo "vectorize_check: '$CC' is not GCC, skipped"; exit 77; }
mkdir -p "$WORK" || exit 1
BASE="-std=c11 -O3 -fopenmp -fno-math-errno -fPIC -I$ROOT/src"
fail=0
ALL_WORK=$WORK

for spec in "$@"; do
    tier=${spec%%|*} rest=${spec#*|}
    FLAGS="$BASE ${rest%|*}" run=${rest##*|}
    WORK="$ALL_WORK/$tier"
    mkdir -p "$WORK" || exit 1
    echo "vectorize_check: tier $tier: ${rest%|*}"
    TAB=$(printf '\t')

    # add NAME EXPR: a loop `y[i] = EXPR` to check (EXPR uses x[i], z[i]).
    add() { printf '%s\t%s\n' "$1" "$2" >>"$WORK/$list.txt"; }

    # build LIST: one C file, one loop function per line (line 2 + k holds the
    # k-th), compiled once; sets $obj and $log.
    build() {
        src="$WORK/$1.c" obj="$WORK/$1.o" log="$WORK/$1.log"
        { echo '#include "codegen/vecmath.h"'; echo 'float expf(float);'
          while IFS="$TAB" read -r name expr; do
              echo "void loop_$name(const float *restrict x, const float *restrict z," \
                   "float *restrict y, int n) { (void)z; for (int i = 0; i < n; i++) y[i] = $expr; }"
          done <"$WORK/$1.txt"; } >"$src"
        # -fno-ipa-icf: identical loops (kiln_sigmoid, kiln_sigmoidf) must not
        # be folded into one, or only one of them is reported.
        "$CC" $FLAGS -fno-ipa-icf -fopt-info-vec-optimized -c "$src" -o "$obj" >"$log" 2>&1
    }

    # vectorized LIST LINE: did GCC report the loop on that line vectorized?
    vectorized() { grep -q "$1.c:$2:[0-9]*: optimized: loop vectorized" "$WORK/$1.log"; }

    list=loops
    : >"$WORK/$list.txt"
    for f in kiln_expf kiln_logf kiln_sinf kiln_cosf kiln_tanhf kiln_erff \
             kiln_sigmoidf kiln_sigmoid kiln_relu kiln_floorf kiln_ceilf; do
        add "$f" "$f(x[i])"
    done
    add kiln_max "kiln_max(x[i], z[i])"
    add kiln_min "kiln_min(x[i], z[i])"
    add kiln_wheref "kiln_wheref(kiln_gt(x[i], z[i]), kiln_expf(x[i]), kiln_sinf(z[i]))"
    add kiln_not "kiln_not(x[i]) * kiln_le(x[i], z[i]) + kiln_ne(x[i], z[i]) * kiln_eq(x[i], z[i])"
    # Fused bodies as the code generator writes them: the seed chain, gelu,
    # silu, a softmax body, clamp.
    add chain "kiln_sinf(kiln_relu(x[i] + 1.0f) * 2.0f)"
    add gelu "kiln_gelu(x[i] + z[i])"
    add silu "x[i] * kiln_sigmoid(x[i])"
    add softmax "kiln_expf(x[i] - z[i]) / z[i]"
    clamp="kiln_tanhf(kiln_max(kiln_min(x[i], 6.0f), -6.0f))"
    add clamp "$clamp + kiln_logf(kiln_lt(x[i], z[i]) + 1.0f)"
    # libm forms that ops.def keeps: inline instructions under the JIT's flags.
    add sqrtf "__builtin_sqrtf(x[i])"
    add rsqrt "1.0f / __builtin_sqrtf(x[i])"
    add fabsf "__builtin_fabsf(x[i])"

    if ! build loops; then
        echo "vectorize_check: compile failed"; cat "$log"; exit 1
    fi
    k=2
    while IFS="$TAB" read -r name expr; do
        k=$((k + 1))
        if vectorized loops $k; then
            width=$(grep "loops.c:$k:" "$log" | grep -o "using [0-9]* byte vectors" | head -1)
            echo "vectorize_check: $tier: $name: loop vectorized ($width)"
        else
            echo "vectorize_check: $tier: $name: loop NOT vectorized: y[i] = $expr"; fail=1
        fi
    done <"$WORK/loops.txt"
    undef=$(nm -u "$obj" | tr -s ' \n' ' ')
    if [ -n "$(echo $undef)" ]; then
        echo "vectorize_check: calls out of line: $undef"; fail=1
    else
        echo "vectorize_check: no calls out of line (nm -u is empty)"
    fi

    # A negative control: a libm expf loop must fail both tests, or they prove
    # nothing.
    list=control
    : >"$WORK/$list.txt"
    add libm_expf "expf(x[i])"
    if build control && ! vectorized control 3 && nm -u "$obj" | grep -q expf; then
        echo "vectorize_check: control: libm expf loop not vectorized and calls expf, as expected"
    else
        echo "vectorize_check: control FAILED: the libm expf loop passed"; fail=1
    fi

    # The ulp sweep, built vectorized with FMA.
    prog="$WORK/vecmath_native"
    if [ "$run" != 1 ]; then
        if "$CC" $FLAGS -Wall -Wextra -D_GNU_SOURCE -DVECMATH_STANDALONE -I"$ROOT/include" \
                -I"$ROOT/tests" "$ROOT/tests/test_vecmath.c" -lm -o "$prog" >"$prog.log" 2>&1; then
            echo "vecmath-$tier: compiled ($FLAGS), not run: this CPU cannot run $tier"
        else
            echo "vectorize_check: $tier: building the sweep failed"; cat "$prog.log"; fail=1
        fi
    elif "$CC" $FLAGS -Wall -Wextra -D_GNU_SOURCE -DVECMATH_STANDALONE -I"$ROOT/include" \
            -I"$ROOT/tests" "$ROOT/tests/test_vecmath.c" -lm -o "$prog" >"$prog.log" 2>&1; then
        KILN_VECMATH_STRIDE=${KILN_VECMATH_STRIDE:-1021} "$prog" | sed -e "s/^vecmath:/vecmath-$tier:/" -e "s/^vecmath-native:/vecmath-$tier:/" \
            >"$prog.out"
        rc=$?
        cat "$prog.out"
        grep -q 'FAIL' "$prog.out" && fail=1
        [ $rc -eq 0 ] || fail=1
    else
        echo "vectorize_check: building the native sweep failed"; cat "$prog.log"; fail=1
    fi

done
exit $fail
