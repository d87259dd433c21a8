#!/bin/sh
# bench/epilogue.sh [KILN] -- what extern epilogues cost and save.
#
# For matmul + bias + relu (512, 1024, 2048 square) and conv2d + batch_norm
# + relu at ResNet-18's layer shapes (batch 1 and 8, BN parameters runtime
# inputs, so nothing folds and the BN affine and relu are the epilogue),
# `kiln bench` times three programs and the script prints their fused times
# (the median of --repeat runs after a warm-up) and GFLOP/s:
#
#   bare       the library call alone (y = x @ w, y = conv2d(x, w))
#   epilogue   the program with its pointwise tail run on each output block
#              inside the library call (the default)
#   separate   the same program with --no-extern-epilogue: the library call,
#              then a kernel of its own for the tail (Inductor's schedule)
#
# and the epilogue's overhead over the bare call (target: under 5%) and the
# separate pass's. GFLOP/s counts the matmul or convolution only.
#
# kiln bench also runs the reference interpreter and the unfused kernels;
# at the large shapes that takes most of the time (minutes in all).
#
# Environment: THREADS (default: kiln's, every core), REPEAT (default 10;
# 5 for the largest shapes), ROUNDS (default 3: the three programs are timed
# in turn that many times and each keeps its best median, so a burst of
# other load on a shared machine does not land on one of them only), ONLY
# (a substring of the workload names).
# OpenBLAS picks its kernels from the CPU model; on a CPU it does not know
# (a VM) it may fall back to slow generic ones (OPENBLAS_VERBOSE=2 prints
# "Core: Prescott"); set OPENBLAS_CORETYPE (e.g. SkylakeX, Haswell) then.
kiln=${1:-build/kiln}
[ -x "$kiln" ] || { echo "usage: bench/epilogue.sh [PATH/TO/kiln] (build it: make)" >&2; exit 2; }
REPEAT=${REPEAT:-10}
ROUNDS=${ROUNDS:-3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
threads=${THREADS:+--threads $THREADS}

# ms NAME PROG REPEAT [FLAGS]: the fused median of `kiln bench`, in ms
ms() {
    # shellcheck disable=SC2086
    if ! "$kiln" bench "$2" --repeat "$3" --report "$tmp/$1.json" $threads $4 >"$tmp/$1.out" 2>&1; then
        echo "kiln bench $2 failed:" >&2
        cat "$tmp/$1.out" >&2
        exit 1
    fi
    sed -n 's/.*"fused_ms": \([0-9.]*\).*/\1/p' "$tmp/$1.json"
}

printf '%-34s %9s %8s  %9s %8s %7s  %9s %8s %7s\n' "workload" "bare ms" "GFLOP/s" \
    "epi ms" "GFLOP/s" "over" "sep ms" "GFLOP/s" "over"

# min A B: the smaller (A empty: B)
min() { awk -v a="$1" -v b="$2" 'BEGIN { print (a == "" || b + 0 < a + 0) ? b : a }'; }

# row NAME GFLOP REPEAT BARE_PROG FULL_PROG
row() {
    case "$1" in *"$ONLY"*) ;; *) return ;; esac
    b= e= s= i=0
    while [ "$i" -lt "$ROUNDS" ]; do
        b=$(min "$b" "$(ms bare "$4" "$3")")
        e=$(min "$e" "$(ms epi "$5" "$3")")
        s=$(min "$s" "$(ms sep "$5" "$3" --no-extern-epilogue)")
        i=$((i + 1))
    done
    awk -v n="$1" -v g="$2" -v b="$b" -v e="$e" -v s="$s" 'BEGIN {
        printf "%-34s %9.3f %8.1f  %9.3f %8.1f %+6.1f%%  %9.3f %8.1f %+6.1f%%\n", n,
            b, g / b * 1e3, e, g / e * 1e3, (e / b - 1) * 100, s, g / s * 1e3, (s / b - 1) * 100 }'
}

# ---- matmul + bias + relu ---------------------------------------------------
for n in 512 1024 2048; do
    r=$REPEAT
    [ "$n" -ge 2048 ] && [ "$r" -gt 5 ] && r=5
    cat >"$tmp/mm_bare_$n.kiln" <<EOF
input x: f32[$n, $n]
weight w: f32[$n, $n] = randn(1)
y = x @ w
output y
EOF
    cat >"$tmp/mm_$n.kiln" <<EOF
input x: f32[$n, $n]
weight w: f32[$n, $n] = randn(1)
input b: f32[$n]
y = relu(x @ w + b)
output y
EOF
    row "matmul+bias+relu $n" "$(awk -v n=$n 'BEGIN { print 2 * n * n * n / 1e9 }')" "$r" \
        "$tmp/mm_bare_$n.kiln" "$tmp/mm_$n.kiln"
done

# ---- conv + BN + relu at ResNet-18 shapes ------------------------------------
# name cin cout hw k stride pad: conv1, then the first conv of each stage
# that keeps its size (the 3x3 convs that make up most of the network)
set -- "conv1_7x7s2" 3 64 224 7 2 3 \
       "layer1_3x3" 64 64 56 3 1 1 \
       "layer2_3x3" 128 128 28 3 1 1 \
       "layer3_3x3" 256 256 14 3 1 1 \
       "layer4_3x3" 512 512 7 3 1 1
while [ $# -ge 7 ]; do
    name=$1 ci=$2 co=$3 hw=$4 k=$5 st=$6 pad=$7
    shift 7
    for bs in 1 8; do
        r=$REPEAT
        [ "$bs" -ge 8 ] && [ "$r" -gt 5 ] && r=5
        oh=$(( (hw + 2 * pad - k) / st + 1 ))
        cat >"$tmp/cv_bare.kiln" <<EOF
input x: f32[$bs, $ci, $hw, $hw]
weight w: f32[$co, $ci, $k, $k] = randn(1)
y = conv2d(x, w, stride=$st, padding=$pad)
output y
EOF
        # var = |v| + 0.5 keeps the variance positive with generated inputs
        cat >"$tmp/cv.kiln" <<EOF
input x: f32[$bs, $ci, $hw, $hw]
weight w: f32[$co, $ci, $k, $k] = randn(1)
input mean: f32[$co]
input v: f32[$co]
input gamma: f32[$co]
input beta: f32[$co]
y = relu(batch_norm(conv2d(x, w, stride=$st, padding=$pad), mean, abs(v) + 0.5, gamma, beta))
output y
EOF
        gf=$(awk -v b=$bs -v co=$co -v ci=$ci -v o=$oh -v k=$k 'BEGIN { print 2 * b * co * o * o * ci * k * k / 1e9 }')
        row "conv-bn-relu $name b$bs" "$gf" "$r" "$tmp/cv_bare.kiln" "$tmp/cv.kiln"
    done
done
