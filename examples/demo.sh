#!/bin/sh
# The showcase: a few of the seed programs, what kiln decides and why.
# usage: examples/demo.sh PATH/TO/kiln
set -e
kiln=${1:-build/kiln}
cd "$(dirname "$0")/.."
export KILN_CACHE_DIR="${KILN_CACHE_DIR:-$PWD/build/cache}"
show() { echo; echo "\$ $*"; "$@"; }
echo "kiln demo: programs from examples/ (the comment at the top of each says what it shows)"
show cat examples/softmax.kiln
show "$kiln" explain examples/softmax.kiln
show "$kiln" run examples/softmax.kiln --check
show "$kiln" explain examples/extern.kiln
show "$kiln" bench examples/layernorm.kiln --repeat 5
