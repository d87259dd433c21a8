#!/bin/sh
# busy.sh [SECONDS] [ROUNDS] -- a 2-thread program on a machine whose other
# cores are kept busy by another process, against 1 thread (kiln.h,
# Threads; src/runtime/team.c).
#
# For each model (MODELS, default examples/layernorm.kiln and
# bench/serve_mlp.kiln, bench/serve_cnn.kiln), idle and then with every core
# but one running a busy loop (a shell `while :; do :; done`, nproc - 1 of
# them), bench/serve runs one caller for SECONDS (default 3) three ways:
# 1 thread, 2 threads fixed (--fixed-threads: every run on 2) and 2 threads
# as kiln runs them by default (a run may use 1 where 1 measured faster).
# The three alternate, ROUNDS times (default 3); the best throughput of each
# is kept. Mean time per run is 1 / throughput, so the ratios printed,
# time(2 threads) / time(1 thread), are throughput(1) / throughput(2).
# Prints the CPU (lscpu, GCC -march=native) so the numbers say what they
# were measured on.
set -e
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
S=${1:-3}
R=${2:-3}
MODELS=${MODELS:-"examples/layernorm.kiln bench/serve_mlp.kiln bench/serve_cnn.kiln"}
make --no-print-directory build/bench/serve >/dev/null
B=build/bench/serve
cores=$(nproc)
echo "cpu: $(lscpu | sed -n 's/^Model name: *//p'), $cores cores," \
    "$(gcc -march=native -Q --help=target | sed -n 's/^[[:space:]]*-march=[[:space:]]*//p')"
loops=""
stop_loops() {
    for p in $loops; do kill "$p" 2>/dev/null || true; done
    loops=""
}
trap stop_loops EXIT INT TERM
rate() { # the best runs/s of $1 and a new JSON line $2
    echo "$2" | sed 's/.*"runs_per_s": \([0-9.]*\).*/\1/' | awk -v b="$1" '{print ($1 > b) ? $1 : b}'
}
for m in $MODELS; do
    for load in idle busy; do
        if [ $load = busy ]; then
            n=1
            while [ $n -lt "$cores" ]; do
                sh -c 'while :; do :; done' &
                loops="$loops $!"
                n=$((n + 1))
            done
            sleep 0.5
        fi
        one=0 fixed=0 adaptive=0 i=0
        while [ $i -lt "$R" ]; do
            one=$(rate $one "$($B "$m" --threads 1 --seconds "$S" --every "$S" | tail -1)")
            fixed=$(rate $fixed "$($B "$m" --threads 2 --fixed-threads --seconds "$S" --every "$S" | tail -1)")
            adaptive=$(rate $adaptive "$($B "$m" --threads 2 --seconds "$S" --every "$S" | tail -1)")
            i=$((i + 1))
        done
        stop_loops
        echo "$m $load: runs/s 1 thread $one, 2 fixed $fixed, 2 (default) $adaptive;" \
            "time vs 1 thread: 2 fixed $(echo "$one $fixed" | awk '{printf "%.2f", $1 / $2}')x," \
            "2 (default) $(echo "$one $adaptive" | awk '{printf "%.2f", $1 / $2}')x"
    done
done
