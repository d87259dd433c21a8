#!/bin/sh
# The error catalogue's tests: one per row of docs/errors.md, in its order
# and under its names. Each runs build/kiln on a bad input or in a broken
# environment and checks the exit status (and that no signal ended it), the
# message (file:line:col and the caret line where there is a source), and
# that nothing was left behind: no *.tmp* file anywhere in the scratch
# directory (outputs, cache), no partial output.
# usage: tests/errors.sh PATH/TO/kiln   -- prints PASS:/FAIL: lines
#   KEEP=1: keep the scratch directory (its path is mktemp's, under /tmp)
#   ERRORS_LOG=FILE: append each row's exit status and stderr to FILE (the
#   messages of docs/errors.md come from there)
kiln=$1
[ -x "$kiln" ] || { echo "FAIL: errors: no kiln binary at $kiln"; exit 1; }
t=$(mktemp -d)
[ -n "$KEEP" ] || trap 'chmod -R u+w "$t" 2>/dev/null; rm -rf "$t"' EXIT
export KILN_CACHE_DIR="$t/cache"
unset KILN_MEM_LIMIT CC
# Huge allocations must come back as NULL under ASan too (not abort).
export ASAN_OPTIONS="allocator_may_return_null=1${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
npy=tests/npy

pass() { echo "PASS: err_$1"; }
fail() { n=$1; shift; echo "FAIL: err_$n"; for l in "$@"; do echo "  $l"; done; }

# run_check NAME STATUS MESSAGE -- CMD...: CMD exits STATUS (< 128), its
# stderr holds MESSAGE (a fixed string; "" for none) and no *.tmp* file is
# left under the scratch directory. Sets ok=1 when all of that holds, so
# a caller can check more before pass/fail.
run_check() {
    name=$1 want=$2 msg=$3; shift 4
    "$@" >"$t/out" 2>"$t/err"
    rc=$?
    left=$(find "$t" -name '*.tmp*' 2>/dev/null | head -3)
    [ -z "${ERRORS_LOG:-}" ] || { printf '@@ %s %s\n' "$name" "$rc"; sed "s|$t/||g" "$t/err"; } >>"$ERRORS_LOG"
    ok=0
    if [ "$rc" -ge 128 ]; then
        fail "$name" "killed by signal $((rc - 128))" "$(head -5 "$t/err")"
    elif [ "$rc" -ne "$want" ]; then
        fail "$name" "exit $rc, want $want" "$(head -5 "$t/err")"
    elif [ -n "$msg" ] && ! grep -qF -- "$msg" "$t/err"; then
        fail "$name" "stderr lacks: $msg" "$(head -5 "$t/err")"
    elif [ -n "$left" ]; then
        fail "$name" "left behind: $left"
    else
        ok=1
    fi
}

check() { run_check "$@"; [ $ok = 1 ] && pass "$1"; }

# prog NAME 'TEXT' 'LINE:COL: error: MESSAGE' -- a bad program: exit 1, the
# message at FILE:LINE:COL, then the source line and a caret line.
prog() {
    printf "$2" >"$t/$1.kiln"
    run_check "$1" 1 "$t/$1.kiln:$3" "--" "$kiln" run "$t/$1.kiln"
    [ $ok = 1 ] || return
    if sed -n 3p "$t/err" | grep -q '^ *^$'; then pass "$1"
    else fail "$1" "no caret line under the source line" "$(head -3 "$t/err")"; fi
}

# A program and inputs that are fine, for the data and environment rows.
printf 'input x: f32[2, 3]\ny = relu(x)\nz = x * 2\noutput y, z\n' >"$t/p.kiln"
printf 'input x: f32[3]\ny = relu(x)\noutput y\n' >"$t/p3.kiln"
printf 'input x: bool[2, 2]\ny = logical_not(x)\noutput y\n' >"$t/pb.kiln"
printf 'input x: f32[2, 2]\ny = relu(x)\noutput y\n' >"$t/p22.kiln"

# mknpy FILE MAJOR HEADER [DATA]: a .npy file with the given header text
mknpy() {
    h=$3 len=${#3}
    { printf '\223NUMPY'; printf "\\$(printf %03o "$2")\\000"
      printf "\\$(printf %03o $((len % 256)))\\$(printf %03o $((len / 256)))"
      printf '%s' "$h"; printf "${4:-}"; } >"$1"
}

# ---- programs -------------------------------------------------------------
prog prog_bad_token 'input x: f32[4]\ny = relu(x) $ 2\noutput y\n' \
    "2:13: error: unexpected character '\$'"
prog prog_bad_byte 'input x: f32[4]\ny = relu(x) \303\251\noutput y\n' \
    "2:13: error: unexpected character '\\xc3'"
prog prog_bad_number 'input x: f32[4]\ny = x * 1.2.3\noutput y\n' \
    "2:9: error: invalid number '1.2.3'"
prog prog_unterminated_string 'weight w: f32[4] = file("w.npy)\noutput w\n' \
    "1:25: error: unterminated string"
prog prog_syntax 'input x: f32[4]\ny = x + * 2\noutput y\n' \
    "2:9: error: expected expression"
prog prog_unclosed_call 'input x: f32[4]\ny = relu(x\noutput y\n' \
    "3:1: error: expected ')' after arguments"
prog prog_unknown_function 'input x: f32[4]\ny = rleu(x)\noutput y\n' \
    "2:5: error: unknown function 'rleu'"
prog prog_too_many_args 'input x: f32[4]\ny = relu(x, x)\noutput y\n' \
    "2:13: error: relu takes 1 positional argument, got 2"
prog prog_missing_arg 'input x: f32[4]\ny = relu()\noutput y\n' \
    "2:5: error: relu is missing required argument 'input'"
prog prog_unknown_keyword 'input x: f32[4]\ny = sum(x, dimm=0)\noutput y\n' \
    "2:12: error: sum has no keyword 'dimm'"
prog prog_duplicate_keyword 'input x: f32[4]\ny = sum(x, dim=0, dim=0)\noutput y\n' \
    "2:19: error: duplicate keyword argument 'dim'"
prog prog_bad_argument_type 'input x: f32[4]\ny = softmax(x, dim=true)\noutput y\n' \
    "2:20: error: argument 'dim' of softmax must be an int, got a boolean"
prog prog_undefined_name 'input x: f32[4]\ny = relu(z)\noutput y\n' \
    "2:10: error: undefined name 'z'"
prog prog_used_before_definition 'input x: f32[4]\ny = relu(z)\nz = x\noutput y\n' \
    "2:10: error: undefined name 'z'"
prog prog_defined_twice 'input x: f32[4]\ny = relu(x)\ny = x\noutput y\n' \
    "3:1: error: 'y' is already defined (at line 2)"
prog prog_output_twice 'input x: f32[4]\noutput x, x\n' \
    "2:11: error: 'x' is already an output"
prog prog_unknown_dtype 'input x: f16[4]\noutput x\n' \
    "1:10: error: unknown dtype 'f16'"
prog prog_unsupported_dtype 'input x: i32[4]\noutput x\n' \
    "1:10: error: dtype 'i32' is not supported: programs compute in f32, f64 and bool"
prog prog_bad_shape 'input x: f32[a]\noutput x\n' \
    "1:14: error: expected a dim (0 or more)"
prog prog_rank_too_high 'input x: f32[1, 1, 1, 1, 1, 1, 1, 1, 1]\noutput x\n' \
    "1:38: error: too many dims: rank is at most 8"
prog prog_shape_overflow 'input x: f32[4294967296, 4294967296]\noutput x\n' \
    "1:13: error: shape [4294967296, 4294967296] has too many elements"
prog prog_integer_too_large 'input x: f32[99999999999999999999]\noutput x\n' \
    "1:14: error: integer literal '99999999999999999999' is too large"
prog prog_negative_dim 'input x: f32[-1, 4]\noutput x\n' \
    "1:14: error: dim must not be negative, got -1"
prog prog_empty '' \
    "1:1: error: empty program: no statements"
prog prog_only_comments '# nothing here\n\n' \
    "1:1: error: empty program: no statements"
prog prog_no_output 'input x: f32[4]\ny = relu(x)\n' \
    "2:12: error: program has no output statement"
prog prog_bad_initializer 'weight w: f32[4] = foo(3)\noutput w\n' \
    "1:20: error: unknown initializer 'foo'"
# nesting is bounded (the parser recurses): 300 open parentheses
deep=$(printf '%300s' '' | tr ' ' '(')
printf 'input x: f32[4]\ny = %sx\noutput y\n' "$deep" >"$t/prog_too_deep.kiln"
check prog_too_deep 1 "prog_too_deep.kiln:2:205: error: expression nested too deeply" -- \
    "$kiln" run "$t/prog_too_deep.kiln"
check prog_missing_file 1 "cannot read $t/nope.kiln: No such file or directory" -- \
    "$kiln" run "$t/nope.kiln"
mkdir "$t/adir"
check prog_is_directory 1 "cannot read $t/adir: Is a directory" -- "$kiln" run "$t/adir"

# ---- semantics ----------------------------------------------------------------
prog sem_broadcast 'input x: f32[3, 4]\ninput y: f32[5]\nz = x + y\noutput z\n' \
    "3:7: error: add: shapes [3, 4] and [5] cannot be broadcast"
prog sem_reduce_dim 'input x: f32[3, 4]\ny = sum(x, dim=2)\noutput y\n' \
    "2:5: error: sum: dim 2 is out of range for a tensor of rank 2"
prog sem_matmul_inner 'input a: f32[3, 4]\ninput b: f32[5, 6]\nc = a @ b\noutput c\n' \
    "3:7: error: matmul: shapes [3, 4] and [5, 6] do not match (4 != 5)"
prog sem_matmul_batch 'input a: f32[2, 3, 4]\ninput b: f32[3, 4, 5]\nc = a @ b\noutput c\n' \
    "3:7: error: matmul: batch dims of [2, 3, 4] and [3, 4, 5] cannot be broadcast"
prog sem_matmul_scalar 'input a: f32[]\ninput b: f32[5, 6]\nc = matmul(a, b)\noutput c\n' \
    "3:5: error: matmul: both operands need at least 1 dim"
prog sem_conv_rank 'input x: f32[3, 8, 8]\nweight w: f32[4, 3, 3, 3] = randn(1)\ny = conv2d(x, w)\noutput y\n' \
    "3:5: error: conv2d: input and weight must be 4-D (NCHW, OIHW), got ranks 3 and 4"
prog sem_conv_channels 'input x: f32[1, 3, 8, 8]\nweight w: f32[4, 2, 3, 3] = randn(1)\ny = conv2d(x, w)\noutput y\n' \
    "3:5: error: conv2d: weight expects 2 input channels per group, input has 3 channels in 1 groups"
prog sem_conv_kernel_too_large 'input x: f32[1, 3, 2, 2]\nweight w: f32[4, 3, 3, 3] = randn(1)\ny = conv2d(x, w)\noutput y\n' \
    "3:5: error: conv2d: kernel (extent 3) is larger than the padded input (2) in dim 2"
prog sem_conv_stride 'input x: f32[1, 1, 4, 4]\nweight w: f32[1, 1, 3, 3] = ones\ny = conv2d(x, w, stride=0)\noutput y\n' \
    "3:5: error: conv2d: stride and dilation must be >= 1 and padding >= 0"
prog sem_gather_axis 'input x: f32[3, 4]\ninput i: f32[2]\ny = gather(x, i, axis=2)\noutput y\n' \
    "3:5: error: gather: dim 2 is out of range for a tensor of rank 2"
prog sem_gather_indices_dtype 'input x: f32[3, 4]\ninput i: bool[2]\ny = gather(x, i)\noutput y\n' \
    "3:5: error: gather expects an f32 tensor, got bool"
prog sem_convt_output_padding 'input x: f32[1, 2, 4, 4]\nweight w: f32[2, 3, 3, 3] = ones\ny = conv_transpose2d(x, w, stride=2, output_padding=2)\noutput y\n' \
    "3:5: error: conv_transpose2d: output_padding 2 must be smaller than stride 2 or dilation 1 (dim 2)"
prog sem_convt_groups 'input x: f32[1, 3, 4, 4]\nweight w: f32[3, 2, 3, 3] = ones\ny = conv_transpose2d(x, w, groups=2)\noutput y\n' \
    "3:5: error: conv_transpose2d: groups=2 must divide input channels 3"
prog sem_convt_channels 'input x: f32[1, 3, 4, 4]\nweight w: f32[2, 3, 3, 3] = ones\ny = conv_transpose2d(x, w)\noutput y\n' \
    "3:5: error: conv_transpose2d: weight has 2 input channels (dim 0), input has 3"
prog sem_convt_padding 'input x: f32[1, 1, 2, 2]\nweight w: f32[1, 1, 2, 2] = ones\ny = conv_transpose2d(x, w, padding=2)\noutput y\n' \
    "3:5: error: conv_transpose2d: output size -1 in dim 2 is not positive (padding 2 too large)"
prog sem_reshape_count 'input x: f32[3, 4]\ny = reshape(x, 5, 2)\noutput y\n' \
    "2:5: error: reshape: cannot reshape [3, 4] (12 elements) to [5, 2]"
prog sem_expand 'input x: f32[2, 3]\ny = expand(x, 4, 3)\noutput y\n' \
    "2:5: error: expand: cannot expand [2, 3] to [4, 3]"
prog sem_permute_repeat 'input x: f32[2, 3]\ny = permute(x, 0, 0)\noutput y\n' \
    "2:5: error: permute: dim 0 repeats"
prog sem_transpose_dim 'input x: f32[2, 3]\ny = transpose(x, 0, 5)\noutput y\n' \
    "2:5: error: transpose: dim 5 is out of range for a tensor of rank 2"
prog sem_pool_empty 'input x: f32[1, 1, 0, 4]\ny = max_pool2d(x, 1, padding=1)\noutput y\n' \
    "2:5: error: max_pool: dim 2 of the input is empty (size 0): its padded windows hold only padding"
prog sem_gather_empty 'input x: f32[0, 4]\ninput i: f32[3]\ny = gather(x, i)\noutput y\n' \
    "3:5: error: gather: dim 0 of the data is empty: no index is in range"
prog sem_slice_dim 'input x: f32[3, 4]\ny = slice(x, 3, 0, 1)\noutput y\n' \
    "2:5: error: slice: dim 3 is out of range for a tensor of rank 2"
prog sem_slice_step 'input x: f32[3, 4]\ny = slice(x, 0, 0, 2, 0)\noutput y\n' \
    "2:5: error: slice: step must not be 0"
prog sem_pad_mode 'input x: f32[3, 4]\ny = pad(x, [1, 1], mode="wrap")\noutput y\n' \
    "2:25: error: pad: mode must be \"constant\", \"replicate\" or \"reflect\""
prog sem_pad_reflect_width 'input x: f32[3, 4]\ny = pad(x, [4, 0], mode="reflect")\noutput y\n' \
    "2:5: error: pad: reflect padding of 4 and 0 needs dim 1 to have more than that many elements, it has 4"
prog sem_cat_shapes 'input a: f32[2, 3]\ninput b: f32[3, 3]\ny = cat([a, b], dim=1)\noutput y\n' \
    "3:5: error: concat: part 1 is f32[3, 3], part 0 is f32[2, 3]: all dims but dim 1 must match"
prog sem_pool_window 'input x: f32[1, 2, 3, 3]\ny = max_pool2d(x, 5)\noutput y\n' \
    "2:5: error: max_pool: the window (extent 5) is larger than the padded input (3) in dim 2"
prog sem_layer_norm_shape 'input x: f32[2, 3]\ny = layer_norm(x, [4])\noutput y\n' \
    "2:5: error: layer_norm: normalized_shape [4] does not match the last dims of input shape [2, 3]"
prog sem_dropout_p 'input x: f32[2, 3]\ny = dropout(x, p=1.5)\noutput y\n' \
    "2:5: error: dropout: p must be in [0, 1], got 1.5"
prog sem_dtype_f32_op 'input x: bool[3, 4]\ny = exp(x)\noutput y\n' \
    "2:5: error: exp expects an f32 or f64 tensor, got bool"
prog sem_dtype_f64_conv 'input x: f64[1, 3, 8, 8]\nweight w: f32[4, 3, 3, 3] = randn(1)\ny = conv2d(x, w)\noutput y\n' \
    "3:5: error: conv2d expects an f32 tensor, got f64 (its library computes in f32)"
prog sem_dtype_bool_op 'input x: f32[3, 4]\ny = logical_not(x)\noutput y\n' \
    "2:5: error: logical_not expects a bool tensor, got f32"
prog sem_where_condition 'input x: f32[3, 4]\ny = where(x, x, x)\noutput y\n' \
    "2:5: error: where: the condition must be a bool tensor, got f32"

# ---- data -------------------------------------------------------------------------
check data_missing_file 1 "$t/nope.npy: cannot open: No such file or directory" -- \
    "$kiln" run "$t/p.kiln" -i "x=$t/nope.npy"
check data_directory 1 "$t/adir: cannot read: Is a directory" -- \
    "$kiln" run "$t/p.kiln" -i "x=$t/adir"
echo 'x,y' >"$t/data_not_npy.npy"
check data_not_npy 1 "not a .npy file (it does not start with \\x93NUMPY)" -- \
    "$kiln" run "$t/p.kiln" -i "x=$t/data_not_npy.npy"
mknpy "$t/data_version.npy" 9 "{}"
check data_version 1 "unsupported .npy format version 9.0 (kiln reads 1.0, 2.0 and 3.0)" -- \
    "$kiln" run "$t/p.kiln" -i "x=$t/data_version.npy"
head -c 100 $npy/f32_2x3.npy >"$t/data_truncated_header.npy"
check data_truncated_header 1 "truncated header: expected 118 bytes, found 90" -- \
    "$kiln" run "$t/p.kiln" -i "x=$t/data_truncated_header.npy"
head -c 140 $npy/f32_2x3.npy >"$t/data_truncated_data.npy"
check data_truncated_data 1 "truncated data: expected 24 bytes, found 12" -- \
    "$kiln" run "$t/p.kiln" -i "x=$t/data_truncated_data.npy"
{ cat $npy/f32_2x3.npy; printf 'xx'; } >"$t/data_trailing.npy"
check data_trailing 1 "trailing data: expected 24 bytes, found 26" -- \
    "$kiln" run "$t/p.kiln" -i "x=$t/data_trailing.npy"
mknpy "$t/data_malformed_header.npy" 1 "{'descr': '<f4', 'fortran_order': False, 'shape': (2, x), }
"
check data_malformed_header 1 "malformed header: 'shape' must be a tuple of integers (at header byte 54)" -- \
    "$kiln" run "$t/p.kiln" -i "x=$t/data_malformed_header.npy"
check data_unsupported_dtype 1 "unsupported dtype '<c8'" -- \
    "$kiln" run "$t/p3.kiln" -i "x=$npy/c64_2.npy"
check data_structured 1 "structured dtypes (records with named fields) are not supported" -- \
    "$kiln" run "$t/p.kiln" -i "x=$npy/structured_2.npy"
check data_fortran_order 1 "Fortran-order arrays are not supported; save with np.ascontiguousarray" -- \
    "$kiln" run "$t/p.kiln" -i "x=$npy/fortran_f32_2x3.npy"
check data_big_endian 1 "big-endian data is not supported (dtype '>f4'); save with arr.astype('<f4')" -- \
    "$kiln" run "$t/p3.kiln" -i "x=$npy/bigendian_f32_3.npy"
check data_empty_shape 1 "input 'x': expected f32[2, 3], got f32[0, 3]" -- \
    "$kiln" run "$t/p.kiln" -i "x=$npy/empty_0x3.npy"
{ head -c 131 $npy/bool_2x2.npy; printf '\002'; } >"$t/data_bad_bool.npy"
check data_bad_bool 1 "bool element 3 holds byte 2; bool bytes must be 0 or 1" -- \
    "$kiln" run "$t/pb.kiln" -i "x=$t/data_bad_bool.npy"
check data_wrong_dtype 1 "input 'x': expected f32[2, 2], got bool[2, 2]" -- \
    "$kiln" run "$t/p22.kiln" -i "x=$npy/bool_2x2.npy"
check data_wrong_dtype_f64 1 "input 'x': expected f32[2, 3], got f64[4]" -- \
    "$kiln" run "$t/p.kiln" -i "x=$npy/f64_4.npy"
check data_wrong_shape 1 "input 'x': expected f32[3], got f32[2, 3]" -- \
    "$kiln" run "$t/p3.kiln" -i "x=$npy/f32_2x3.npy"
check data_unknown_input 1 "the program has no input 'nope'" -- \
    "$kiln" run "$t/p.kiln" -i "nope=$npy/f32_2x3.npy"
# gather indices are data: 7 is out of range for a dim of size 5 (f32_2x3's
# header with the data 0, 7, 0, 0, 0, 0), -0.5 (f32_2x3 itself) no integer.
printf 'input x: f32[3, 5]\ninput i: f32[2, 3]\ny = relu(gather(x, i, axis=1))\noutput y\n' >"$t/pg.kiln"
{ head -c 128 $npy/f32_2x3.npy; printf '\000\000\000\000\000\000\340\100'
  printf '\000\000\000\000\000\000\000\000\000\000\000\000\000\000\000\000'; } >"$t/idx7.npy"
check data_gather_index 1 "gather: index 7 out of range for dim 1 of size 5" -- \
    "$kiln" run "$t/pg.kiln" -i "i=$t/idx7.npy"
check data_gather_index_interpret 1 "gather: index 7 out of range for dim 1 of size 5" -- \
    "$kiln" run "$t/pg.kiln" -i "i=$t/idx7.npy" --interpret
check data_gather_not_integer 1 "gather: index -0.5 is not an integer" -- \
    "$kiln" run "$t/pg.kiln" -i "i=$npy/f32_2x3.npy"
printf 'weight w: f32[4] = file("nope.npy")\noutput w\n' >"$t/data_weight_missing.kiln"
check data_weight_missing 1 "data_weight_missing.kiln:1:25: error: cannot load weight 'w': $t/nope.npy: cannot open" -- \
    "$kiln" run "$t/data_weight_missing.kiln"
cp $npy/f32_2x3.npy "$t/w23.npy"
printf 'weight w: f32[4] = file("w23.npy")\noutput w\n' >"$t/data_weight_shape.kiln"
check data_weight_shape 1 "data_weight_shape.kiln:1:25: error: $t/w23.npy has shape [2, 3], weight 'w' is declared [4]" -- \
    "$kiln" run "$t/data_weight_shape.kiln"

# outputs: nothing is written unless everything is (outdir_files: the listing)
outdir_files() {
    [ $ok = 1 ] || return
    got=$(ls -A "$2" | tr '\n' ' ')
    if [ "$got" = "$3" ]; then pass "$1"; else fail "$1" "$2 holds '$got', want '$3'"; fi
}
run_check out_dir_missing 3 "output directory '$t/nodir' does not exist" -- \
    "$kiln" run "$t/p.kiln" -o "$t/nodir"
if [ $ok = 1 ] && [ ! -e "$t/nodir" ]; then pass out_dir_missing
elif [ $ok = 1 ]; then fail out_dir_missing "$t/nodir was created"; fi
check out_dir_is_file 3 "output directory '$t/p.kiln' is not a directory" -- \
    "$kiln" run "$t/p.kiln" -o "$t/p.kiln"
# not writable: by permissions (as root, permissions do not stop writes, so
# the run drops to nobody with setpriv; where it cannot, the row is skipped)
mkdir -m 755 "$t/pub" && mkdir -m 555 "$t/pub/ro" && cp "$t/p.kiln" "$t/pub/" && chmod 755 "$t"
as_nobody() { setpriv --reuid=65534 --regid=65534 --clear-groups "$@"; }
can_drop=0
command -v setpriv >/dev/null 2>&1 && as_nobody "$kiln" --help >/dev/null 2>&1 && can_drop=1
if [ "$(id -u)" != 0 ]; then
    run_check out_dir_not_writable 3 "output directory '$t/pub/ro' is not writable: Permission denied" -- \
        "$kiln" run --interpret "$t/pub/p.kiln" -o "$t/pub/ro"
    outdir_files out_dir_not_writable "$t/pub/ro" ""
elif [ $can_drop = 1 ]; then
    run_check out_dir_not_writable 3 "output directory '$t/pub/ro' is not writable: Permission denied" -- \
        as_nobody "$kiln" run --interpret "$t/pub/p.kiln" -o "$t/pub/ro"
    outdir_files out_dir_not_writable "$t/pub/ro" ""
else
    echo "  (err_out_dir_not_writable skipped: root, and setpriv cannot drop to nobody)"
fi
# the second output cannot be put in place: the first is not left behind
mkdir -p "$t/o1/z.npy"
run_check out_partial 3 "cannot write $t/o1/z.npy: Is a directory" -- \
    "$kiln" run "$t/p.kiln" -o "$t/o1"
outdir_files out_partial "$t/o1" "z.npy "
mkdir -p "$t/clash"
run_check out_name_clash 1 "outputs 'a/b' and 'a_b' would both be written to $t/clash/a_b.npy" -- \
    "$kiln" run tests/onnx/output_clash.onnx -o "$t/clash"
outdir_files out_name_clash "$t/clash" ""
check out_report_dir_missing 3 "cannot write $t/nodir/r.json: No such file or directory" -- \
    "$kiln" run "$t/p.kiln" --report "$t/nodir/r.json"

# ---- ONNX models ------------------------------------------------------------------
ox=tests/onnx
head -c 20 $ox/mlp/model.onnx >"$t/onnx_truncated.onnx"
check onnx_truncated 1 "$t/onnx_truncated.onnx: not a valid ONNX model (the protobuf message is malformed or truncated)" -- \
    "$kiln" run "$t/onnx_truncated.onnx"
echo 'input x: f32[2]' >"$t/onnx_not_protobuf.onnx"
check onnx_not_protobuf 1 "onnx_not_protobuf.onnx: not a valid ONNX model" -- \
    "$kiln" run "$t/onnx_not_protobuf.onnx"
check onnx_unsupported_op 1 "$ox/unsupported.onnx: unsupported op Bernoulli (opset 13) at node 1 ('coin')" -- \
    "$kiln" run $ox/unsupported.onnx
check onnx_unsupported_ops 1 "$ox/unsupported_many.onnx: unsupported ops (opset 13) at 3 nodes: NonMaxSuppression at node 1 ('nms'), Bernoulli at node 2 ('coin'), com.microsoft.FusedGemm at node 3 ('fg')" -- \
    "$kiln" run $ox/unsupported_many.onnx
check onnx_loss_target 1 "$ox/nll.onnx: gather: index 3 out of range for dim 0 of size 3" -- \
    "$kiln" run $ox/nll.onnx -i x=$ox/x23.pb -i t=$ox/nll_target_bad.pb
check onnx_rnn_steps 1 "$ox/rnn_long.onnx: node 0 ('rnn', RNN): unsupported: 1025 time steps (kiln unrolls the time loop, up to 1024)" -- \
    "$kiln" run $ox/rnn_long.onnx
check onnx_scatter_runtime 1 "$ox/scatter_runtime.onnx: node 0 ('sc', ScatterElements): unsupported: the indices 'i' are computed at run time (a scatter needs them at import: give their value, kiln run -i i=FILE)" -- \
    "$kiln" run $ox/scatter_runtime.onnx
check onnx_size_from_values 1 "$ox/nonzero_runtime.onnx: node 1 ('nz', NonZero): unsupported: the input 'r' is computed at run time, and the output's size depends on its values (kiln's shapes are static)" -- \
    "$kiln" run $ox/nonzero_runtime.onnx
check onnx_quant_block 1 "$ox/quant_block.onnx: node 0 ('q', QuantizeLinear): unsupported: blocked quantization (block_size)" -- \
    "$kiln" run $ox/quant_block.onnx
# external data that would read outside the model's folder, or past its file
check onnx_external_absolute 1 "$ox/ext/ext_absolute.onnx: initializer: tensor 'W' (float): external data '/etc/hostname': an absolute location (a model's data must be in its folder)" -- \
    "$kiln" run $ox/ext/ext_absolute.onnx
check onnx_external_dotdot 1 "external data '../ext/data.bin': a location with '..' (outside the model's folder)" -- \
    "$kiln" run $ox/ext/ext_dotdot.onnx
check onnx_external_link 1 "external data 'outside.bin': a location that leads out of the model's folder (through a link)" -- \
    "$kiln" run $ox/ext/ext_link.onnx
check onnx_external_range 1 "external data 'data.bin': 48 bytes at offset 40, but the tensor needs 48 and the file has 76" -- \
    "$kiln" run $ox/ext/ext_range.onnx
check onnx_external_missing 1 "external data 'nothere.bin': cannot open: No such file or directory" -- \
    "$kiln" run $ox/ext/ext_missing.onnx
check onnx_loop_runtime 1 "$ox/loop_runtime.onnx: node 0 ('loop', Loop): unsupported: the loop's scan outputs have a size known only at run time (its body's condition is computed at run time)" -- \
    "$kiln" run $ox/loop_runtime.onnx
check onnx_loop_unroll_only 1 "$ox/loop_runtime.onnx: node 0 ('loop', Loop): unsupported: the body's condition is computed at run time (kiln unrolls a loop whose condition folds at import)" -- \
    env KILN_CONTROL_FLOW=unroll "$kiln" run $ox/loop_runtime.onnx
check onnx_control_flow_env 1 "$ox/loop_runtime.onnx: node 0 ('loop', Loop): KILN_CONTROL_FLOW is 'sometimes': auto, unroll or call" -- \
    env KILN_CONTROL_FLOW=sometimes "$kiln" run $ox/loop_runtime.onnx
check onnx_loop_body_run_error 1 "kiln: $ox/loop_gather_range.onnx: Loop 'loop' (node 1): gather: index 3 out of range for dim 0 of size 3" -- \
    env KILN_CONTROL_FLOW=call "$kiln" run $ox/loop_gather_range.onnx -i f=$ox/loop_gather_f5.pb
check onnx_loop_body_run_error_interpret 1 "kiln: $ox/loop_gather_range.onnx: Loop 'loop' (node 1): gather: index 3 out of range for dim 0 of size 3" -- \
    env KILN_CONTROL_FLOW=call "$kiln" run $ox/loop_gather_range.onnx -i f=$ox/loop_gather_f5.pb --interpret
check onnx_sequence_output 1 "$ox/seq_output.onnx: output 's': unsupported: a sequence (kiln's outputs are tensors)" -- \
    "$kiln" run $ox/seq_output.onnx
check onnx_index_range 1 "$ox/index_range.onnx: node 0 ('rev', ReverseSequence): unsupported: a time-by-batch plane of 16781312 elements (kiln computes indices in f32, exact below 2^24)" -- \
    "$kiln" explain $ox/index_range.onnx
check onnx_dft_bool 1 "$ox/dft_bool.onnx: node 0 ('', DFT): the signal is bool: this op takes a float tensor" -- \
    "$kiln" explain $ox/dft_bool.onnx
check onnx_scan_missing_input 1 "$ox/scan_missing.onnx: node 0 ('n0', Scan): input 1 (scan input 0) is missing" -- \
    "$kiln" explain $ox/scan_missing.onnx
check onnx_gathernd_range 1 "$ox/gathernd.onnx: gather: index 6 out of range for dim 0 of size 6" -- \
    "$kiln" run $ox/gathernd.onnx -i x=$ox/x23.pb -i i=$ox/gathernd_bad.pb
check onnx_opset 1 "$ox/opset22.onnx: unsupported opset 22 (kiln reads opsets 1 to 21)" -- \
    "$kiln" run $ox/opset22.onnx
check onnx_symbolic_dim 1 "input 'x' has a symbolic or unknown dim; give its shape (kiln --shape x=D0,D1,...)" -- \
    "$kiln" run $ox/mlp/model.onnx
check onnx_runtime_shape 1 "node 0 ('reshape', Reshape): unsupported: the shape input 'shape' is computed at run time" -- \
    "$kiln" run $ox/runtime_shape.onnx
check onnx_declared_dim 1 "$ox/mlp/model.onnx: input 'x': shape [2,5] given, but the model declares [N,4]: dim 1 is fixed at 4 (only symbolic dims take the shape given)" -- \
    "$kiln" run $ox/mlp/model.onnx --shape x=2,5
check onnx_declared_rank 1 "$ox/mlp/model.onnx: input 'x': shape [2,4,1] given, but the model declares [N,4] (rank 2)" -- \
    "$kiln" run $ox/mlp/model.onnx --shape x=2,4,1
check onnx_bad_shape 1 "$ox/symbolic.onnx: node 0 ('mm', MatMul): matmul: shapes [2, 5] and [4, 3] do not match (5 != 4) (with the shapes given: x [2,5])" -- \
    "$kiln" run $ox/symbolic.onnx --shape x=2,5
check onnx_int_inexact 1 "input 'x': element 0 is 9007199254740993, beyond the integers kiln holds exactly (2^53)" -- \
    "$kiln" run $ox/int_input.onnx -i x=$ox/big_int.pb
check onnx_pb_type 1 "string.pb: tensor of type string: unsupported element type" -- \
    "$kiln" run $ox/int_input.onnx -i x=$ox/string.pb
head -c 9 $ox/mlp/test_data_set_0/input_0.pb >"$t/onnx_truncated.pb"
check onnx_pb_truncated 1 "onnx_truncated.pb: not a valid ONNX tensor (the protobuf message is malformed or truncated)" -- \
    "$kiln" run $ox/mlp/model.onnx -i "x=$t/onnx_truncated.pb"
check onnx_shape_option 2 "--shape expects NAME=D0,D1,... (positive dims), got 'x=2,0'" -- \
    "$kiln" run $ox/mlp/model.onnx --shape x=2,0

# ---- usage ------------------------------------------------------------------------
check use_unknown_command 2 "unknown command 'frobnicate'" -- "$kiln" frobnicate
check use_unknown_option 2 "unknown option '--frob'" -- "$kiln" run "$t/p.kiln" --frob
check use_missing_value 2 "--seed needs a value" -- "$kiln" run "$t/p.kiln" --seed
check use_bad_number 2 "--threads needs a count from 1 to 1024, got '0'" -- \
    "$kiln" run "$t/p.kiln" --threads 0
check use_bad_binding 2 "-i expects NAME=FILE.npy, got 'x'" -- "$kiln" run "$t/p.kiln" -i x
check use_conflict 2 "--interpret runs no compiled code to check or report" -- \
    "$kiln" run --interpret --check "$t/p.kiln"
check use_unknown_target 2 "unknown target 'v9' (valid: v2, v3, v4, native)" -- \
    "$kiln" run "$t/p.kiln" --target v9
check use_unknown_target_env 2 "KILN_TARGET: unknown target 'avx9' (valid: v2, v3, v4, native)" -- \
    env KILN_TARGET=avx9 "$kiln" run "$t/p.kiln"
check use_bad_profile_env 2 "KILN_PROFILE=yes: expected 1 (profile every run) or 0" -- \
    env KILN_PROFILE=yes "$kiln" run "$t/p.kiln"

# ---- environment ------------------------------------------------------------------
# A tier this CPU cannot run: refused before the compiler is even looked
# for (CC points nowhere), naming what the CPU lacks.
no_tier=""
for tier in v4 v3 v2; do
    "$kiln" explain "$t/p.kiln" --target $tier >/dev/null 2>&1 || { no_tier=$tier; break; }
done
if [ -n "$no_tier" ]; then
    check env_target_unsupported 3 "target $no_tier: this CPU cannot run x86-64-$no_tier code: it lacks" -- \
        env CC=/nonexistent "$kiln" run "$t/p.kiln" --target $no_tier
else
    echo "errors: this CPU runs every tier: env_target_unsupported skipped (test_target covers it)"
    pass env_target_unsupported
fi
check env_no_compiler 3 "C compiler '/nonexistent' not found (set CC)" -- \
    env CC=/nonexistent "$kiln" run "$t/p.kiln"
check env_trace_unwritable 3 "KILN_TRACE: cannot write $t/no/t.json: No such file or directory" -- \
    env KILN_TRACE="$t/no/t.json" "$kiln" run "$t/p.kiln"
printf '#!/bin/sh\necho "cc: fatal error: simulated failure" >&2\nexit 1\n' >"$t/cc_fails"
printf '#!/bin/sh\nkill -SEGV $$\n' >"$t/cc_crashes"
printf '#!/bin/sh\nexit 0\n' >"$t/cc_silent"
printf '#!/bin/sh\nwhile [ $# -gt 0 ]; do [ "$1" = -o ] && echo junk >"$2"; shift; done\n' \
    >"$t/cc_junk"
chmod +x "$t/cc_fails" "$t/cc_crashes" "$t/cc_silent" "$t/cc_junk"
run_check env_compiler_fails 3 "C compiler '$t/cc_fails' failed (exit 1) compiling" -- \
    env CC="$t/cc_fails" KILN_CACHE_DIR="$t/c_fails" "$kiln" run "$t/p.kiln"
if [ $ok = 1 ] && grep -q "simulated failure" "$t/err" && grep -q "(source kept)" "$t/err" \
   && [ -z "$(ls "$t/c_fails" | grep '\.so')" ]; then pass env_compiler_fails
elif [ $ok = 1 ]; then fail env_compiler_fails "no compiler output, or a .so cached" "$(cat "$t/err")"; fi
check env_compiler_crashes 3 "C compiler '$t/cc_crashes' killed by signal 11 compiling" -- \
    env CC="$t/cc_crashes" KILN_CACHE_DIR="$t/c_crashes" "$kiln" run "$t/p.kiln"
check env_compiler_no_object 3 "C compiler '$t/cc_silent' exited 0 but wrote no object" -- \
    env CC="$t/cc_silent" KILN_CACHE_DIR="$t/c_silent" "$kiln" run "$t/p.kiln"
run_check env_compiler_junk_object 3 "not an ELF file" -- \
    env CC="$t/cc_junk" KILN_CACHE_DIR="$t/c_junk" "$kiln" run "$t/p.kiln"
if [ $ok = 1 ] && [ -z "$(ls "$t/c_junk" | grep '\.so')" ]; then pass env_compiler_junk_object
elif [ $ok = 1 ]; then fail env_compiler_junk_object "the junk object stayed in the cache"; fi
touch "$t/afile"
check env_cache_not_a_directory 3 "cannot create cache directory $t/afile/cache: Not a directory" -- \
    env KILN_CACHE_DIR="$t/afile/cache" "$kiln" run "$t/p.kiln"
mkdir -m 555 "$t/pub/cache_ro"
if [ "$(id -u)" != 0 ]; then
    check env_cache_not_writable 3 "cannot write to cache directory $t/pub/cache_ro: Permission denied" -- \
        env KILN_CACHE_DIR="$t/pub/cache_ro" "$kiln" run "$t/pub/p.kiln"
elif [ $can_drop = 1 ]; then
    check env_cache_not_writable 3 "cannot write to cache directory $t/pub/cache_ro: Permission denied" -- \
        as_nobody env KILN_CACHE_DIR="$t/pub/cache_ro" "$kiln" run "$t/pub/p.kiln"
else
    echo "  (err_env_cache_not_writable skipped: root, and setpriv cannot drop to nobody)"
fi
# A broken entry in the cache is deleted and rebuilt: the run succeeds and
# the same output comes out. so: the cached object of p.kiln, in a cache
# of its own.
export KILN_CACHE_DIR="$t/c_rebuild"
"$kiln" run "$t/p.kiln" >"$t/want" 2>&1
so=$(ls "$t/c_rebuild"/*.so 2>/dev/null | head -1)
rebuilt() {
    [ $ok = 1 ] || return
    if cmp -s "$t/out" "$t/want" && head -c 4 "$so" | grep -q ELF; then pass "$1"
    else fail "$1" "different output, or the entry was not rebuilt"; fi
}
if [ -z "$so" ]; then
    fail env_cache_garbage "no cached object after a run: $(cat "$t/want")"
else
    echo 'not an object' >"$so"
    run_check env_cache_garbage 0 "" -- "$kiln" run "$t/p.kiln"
    rebuilt env_cache_garbage
    # cut mid-way, the headers intact: dlopen used to fault (SIGBUS)
    head -c $(($(wc -c <"$so") / 2)) "$so" >"$t/half" && cat "$t/half" >"$so"
    run_check env_cache_truncated 0 "" -- "$kiln" run "$t/p.kiln"
    rebuilt env_cache_truncated
fi
export KILN_CACHE_DIR="$t/cache"

# two processes fill a fresh cache with the same entry at once
KILN_CACHE_DIR="$t/c_race" "$kiln" run "$t/p.kiln" >"$t/race1" 2>&1 &
pid1=$!
KILN_CACHE_DIR="$t/c_race" "$kiln" run "$t/p.kiln" >"$t/race2" 2>&1 &
pid2=$!
wait $pid1; rc1=$?
wait $pid2; rc2=$?
left=$(find "$t/c_race" -name '*.tmp*' | head -3)
if [ $rc1 = 0 ] && [ $rc2 = 0 ] && cmp -s "$t/race1" "$t/want" && cmp -s "$t/race2" "$t/want" \
   && [ -z "$left" ] && [ "$(ls "$t/c_race" | grep -c '\.so$')" = 1 ]; then pass env_cache_race
else fail env_cache_race "exits $rc1 $rc2; left: $left" "$(head -3 "$t/race1" "$t/race2")"; fi

# out of memory: exit 4 with the size asked for, in each path
printf 'input x: f32[100000, 100000, 100]\ny = relu(x)\noutput y\n' >"$t/huge_input.kiln"
check env_oom_input 4 "out of memory: 4e+12 bytes for input 'x'" -- \
    "$kiln" run "$t/huge_input.kiln"
printf 'input x: f32[1]\ny = expand(x, 100000, 100000, 100)\nz = y + 1\noutput z\n' \
    >"$t/huge_output.kiln"
check env_oom_interpreter 4 "out of memory: 8000000000000 bytes for expand (node 1)" -- \
    "$kiln" run --interpret "$t/huge_output.kiln"
check env_oom_run 4 "out of memory: inputs and outputs of a run" -- \
    "$kiln" run "$t/huge_output.kiln"
printf 'input x: f32[1]\ny = expand(x, 100000, 100000, 100)\nz = softmax(y + 1, dim=0)\nm = sum(z)\noutput m\n' \
    >"$t/huge_arena.kiln"
check env_oom_compile 4 "out of memory: 4000040000000 bytes of arena" -- \
    "$kiln" run "$t/huge_arena.kiln"
printf 'weight w: f32[100000, 100000, 100] = zeros\ny = relu(w)\noutput y\n' >"$t/huge_weight.kiln"
check env_oom_weight 4 "huge_weight.kiln:1:38: error: out of memory for a weight of shape [100000, 100000, 100]" -- \
    "$kiln" run "$t/huge_weight.kiln"
# larger than the memory budget though malloc would say yes (lazily)
printf 'input x: f32[1000, 1000, 100]\ny = relu(x)\noutput y\n' >"$t/big.kiln"
check env_oom_budget 4 "kiln holds at most 64.0 MiB" -- \
    env KILN_MEM_LIMIT=64M "$kiln" run --interpret "$t/big.kiln"
