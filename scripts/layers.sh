#!/bin/sh
# layers.sh [BUILD] -- keep src/'s stages layered: a file may include, and
# call, only its own folder and the folders below it. Bottom to top:
#
#   base graph ref front loop externs sched codegen runtime cli
#
# (docs/design.md says what each holds.) Every #include "dir/x.h" in
# src/*/ is checked against that order; with BUILD, so are the objects:
# a symbol an object in one folder uses must be defined in that folder or
# one below; and libkiln.a holds none of the test hooks src/testing.h
# declares (they are built into libkiln_testing.a only). Prints each
# crossing upward and exits 1 if there is one.
LAYERS="base graph ref front loop externs sched codegen runtime cli"
cd "$(dirname "$0")/.." || exit 2
rank() { i=0; for l in $LAYERS; do [ "$l" = "$1" ] && { echo $i; return; }; i=$((i + 1)); done; echo -1; }
bad=0
for d in src/*/; do
    d=${d#src/}; d=${d%/}
    r=$(rank "$d")
    [ "$r" -ge 0 ] || { echo "layers: src/$d is not a known stage (add it to LAYERS)"; bad=1; continue; }
    for f in src/"$d"/*.c src/"$d"/*.h; do
        [ -f "$f" ] || continue
        for inc in $(sed -n 's/^#include "\([a-z_]*\)\/[^"]*".*/\1/p' "$f" | sort -u); do
            ri=$(rank "$inc")
            if [ "$ri" -lt 0 ] || [ "$ri" -gt "$r" ]; then
                echo "layers: $f includes $inc/ (above $d/)"; bad=1
            fi
        done
    done
done
if [ -n "$1" ]; then
    # Which folder defines each global symbol, then who uses it.
    defs=$(mktemp); trap 'rm -f "$defs"' EXIT
    for o in "$1"/obj/*/*.o; do
        dir=$(basename "$(dirname "$o")")
        nm -g --defined-only "$o" | awk -v d="$dir" -v f="$o" 'NF == 3 { print $3, d, f }'
    done | sort -k1,1 >"$defs"
    for o in "$1"/obj/*/*.o; do
        dir=$(basename "$(dirname "$o")")
        r=$(rank "$dir")
        for s in $(nm -u "$o" | awk '{ print $2 }'); do
            line=$(grep -m1 "^$s " "$defs") || continue
            sd=$(echo "$line" | cut -d' ' -f2)
            [ "$(rank "$sd")" -le "$r" ] && continue
            echo "layers: $o ($dir/) uses $s from $(echo "$line" | cut -d' ' -f3) ($sd/)"; bad=1
        done
    done
    for h in $(sed -n 's/^[a-z].* \**\([a-z_0-9]*\)(.*/\1/p' src/testing.h); do
        if nm -g --defined-only "$1/libkiln.a" 2>/dev/null | grep -q " T $h\$"; then
            echo "layers: libkiln.a defines the test hook $h (src/testing.h): only the test build may"
            bad=1
        fi
    done
fi
[ $bad -eq 0 ] && echo "layers: every include and call in src/ points down (${LAYERS})"
exit $bad
