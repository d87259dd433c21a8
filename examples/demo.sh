#!/bin/sh
# The showcase: run a few of the seed programs and show what kiln does.
# usage: examples/demo.sh PATH/TO/kiln
set -e
kiln=${1:-build/kiln}
cd "$(dirname "$0")/.."
show() { echo; echo "\$ $*"; "$@"; }
echo "kiln demo: programs from examples/ (see the comment at the top of each)"
show cat examples/softmax.kiln
show "$kiln" run examples/softmax.kiln --seed 1
show "$kiln" run examples/layernorm.kiln
show "$kiln" run examples/extern.kiln
