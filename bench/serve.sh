#!/bin/sh
# serve.sh [SECONDS] [ROUNDS] -- bench/serve's comparisons, side by side:
# one caller against two callers (one thread each) on bench/serve_mlp.kiln
# (MODEL=bench/serve_cnn.kiln for the convolutional one),
# alternated ROUNDS times (default 3) for SECONDS each (default 10), the best
# throughput of each kept, and the ratio printed. Set SOAK=SECONDS for a
# long run of two callers that prints resident memory every 10 s.
# Builds build/bench/serve first. Prints the CPU (lscpu, GCC -march=native)
# so the numbers say what they were measured on.
set -e
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
S=${1:-10}
R=${2:-3}
make --no-print-directory build/bench/serve >/dev/null
B=build/bench/serve
P=${MODEL:-bench/serve_mlp.kiln}
echo "cpu: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores," \
    "$(gcc -march=native -Q --help=target | sed -n 's/^[[:space:]]*-march=[[:space:]]*//p')"
best1=0
best2=0
i=0
while [ $i -lt "$R" ]; do
    for c in 1 2; do
        line=$($B $P --callers $c --threads 1 --seconds "$S" --every "$S" | tail -1)
        echo "$line"
        t=$(echo "$line" | sed 's/.*"runs_per_s": \([0-9.]*\).*/\1/')
        if [ $c = 1 ]; then best1=$(echo "$t $best1" | awk '{print ($1 > $2) ? $1 : $2}')
        else best2=$(echo "$t $best2" | awk '{print ($1 > $2) ? $1 : $2}'); fi
    done
    i=$((i + 1))
done
echo "best runs/s: 1 caller $best1, 2 callers $best2, ratio" \
    "$(echo "$best2 $best1" | awk '{printf "%.2f", $1 / $2}')"
if [ -n "$SOAK" ]; then
    $B $P --callers 2 --threads 1 --seconds "$SOAK" --every 10
fi
