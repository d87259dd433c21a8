#!/bin/sh
# Run every test suite against each build directory given, then print one
# summary line "N passed, N failed". Suites print "PASS: name" or
# "FAIL: name" lines; a suite that crashes counts as a failure.
[ $# -ge 1 ] || { echo "usage: tests/run.sh BUILD_DIR..." >&2; exit 2; }
log=$(mktemp)
trap 'rm -f "$log"' EXIT
for b in "$@"; do
    echo "== tests in $b"
    for suite in "$b/test_kiln" "sh tests/cli.sh $b/kiln" "sh tests/errors.sh $b/kiln"; do
        out=$(mktemp)
        $suite >"$out" 2>&1
        rc=$?
        grep -E '^(PASS|FAIL): ' "$out" | sed "s|^|[$b] |" >>"$log"
        grep -E '^(FAIL: |  )' "$out"
        if [ $rc -ne 0 ] && ! grep -q '^FAIL: ' "$out"; then
            echo "FAIL: suite '$suite' exited with status $rc"; tail -20 "$out"
            echo "[$b] FAIL: $suite" >>"$log"
        fi
        rm -f "$out"
    done
done
# The stages' layering (scripts/layers.sh), once, on the first build's objects.
if out=$(sh scripts/layers.sh "$1" 2>&1); then
    echo "[layers] PASS: layers_point_down" >>"$log"
else
    echo "$out"; echo "FAIL: layers_point_down"; echo "[layers] FAIL: layers_point_down" >>"$log"
fi
# make install and a program built against it with pkg-config, shared and
# static (tests/install.sh), once, with the first build.
out=$(sh tests/install.sh "$1" 2>&1)
grep -E '^(PASS|FAIL): ' <<EOF_OUT | sed "s|^|[install] |" >>"$log"
$out
EOF_OUT
echo "$out" | grep -E '^(FAIL: |  )'
p=$(grep -c '] PASS: ' "$log")
f=$(grep -c '] FAIL: ' "$log")
echo "$p passed, $f failed"
[ "$f" -eq 0 ]
