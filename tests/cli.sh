#!/bin/sh
# CLI tests: exit statuses, messages, files written or not written.
# usage: tests/cli.sh PATH/TO/kiln   -- prints PASS:/FAIL: lines
kiln=$1
[ -x "$kiln" ] || { echo "FAIL: cli: no kiln binary at $kiln"; exit 1; }
t=$(mktemp -d)
trap 'rm -rf "$t"' EXIT
export KILN_CACHE_DIR="$t/cache"
pass() { echo "PASS: cli_$1"; }
fail() { echo "FAIL: cli_$1"; shift; for l in "$@"; do echo "  $l"; done; }

# expect NAME STATUS PATTERN -- CMD...: exit status and a stderr/stdout pattern
expect() {
    name=$1 want=$2 pat=$3; shift 4
    "$@" >"$t/out" 2>"$t/err"
    rc=$?
    if [ "$rc" -ne "$want" ]; then
        fail "$name" "exit $rc, want $want" "$(head -5 "$t/err")"
    elif [ "$rc" -ge 128 ]; then
        fail "$name" "killed by a signal"
    elif [ -n "$pat" ] && ! grep -q -- "$pat" "$t/out" "$t/err"; then
        fail "$name" "output lacks '$pat'" "$(head -5 "$t/err" "$t/out")"
    else
        pass "$name"
    fi
}

expect help 0 "usage: kiln COMMAND" -- "$kiln" --help
expect help_run 0 "usage: kiln run" -- "$kiln" help run
expect run_help 0 "usage: kiln run" -- "$kiln" run --help
expect no_args 2 "usage" -- "$kiln"
expect unknown_command 2 "unknown command 'frobnicate'" -- "$kiln" frobnicate
expect unknown_option 2 "unknown option '--frob'" -- "$kiln" run examples/chain.kiln --frob
expect missing_program 1 "cannot read" -- "$kiln" run "$t/nope.kiln"

# a parse error: position and caret, exit 1
printf 'input x: f32[4]\ny = relu(x) $ 2\noutput y\n' >"$t/bad.kiln"
expect parse_error 1 "bad.kiln:2:13: error" -- "$kiln" run "$t/bad.kiln"

# run prints a summary; the same seed gives the same numbers
printf 'input x: f32[3, 4]\ny = relu(x) * 2\nm = amax(y, dim=1)\noutput y, m\n' >"$t/p.kiln"
expect run_summary 0 "m: f32\[3\]" -- "$kiln" run "$t/p.kiln" --seed 3
"$kiln" run "$t/p.kiln" --seed 3 >"$t/a" 2>&1
"$kiln" run "$t/p.kiln" --seed 3 >"$t/b" 2>&1
"$kiln" run "$t/p.kiln" --seed 4 >"$t/c" 2>&1
if cmp -s "$t/a" "$t/b" && ! cmp -s "$t/a" "$t/c"; then pass seed_deterministic
else fail seed_deterministic "same seed should repeat, another seed differ"; fi

# -o writes NAME.npy files that read back as valid .npy
mkdir "$t/out1"
expect run_outdir 0 "" -- "$kiln" run "$t/p.kiln" -o "$t/out1"
if [ -f "$t/out1/y.npy" ] && [ -f "$t/out1/m.npy" ] && head -c 6 "$t/out1/y.npy" | grep -q NUMPY \
   && [ -z "$(ls "$t/out1" | grep -v '\.npy$')" ]; then pass outdir_files
else fail outdir_files "expected y.npy and m.npy only: $(ls "$t/out1")"; fi

# an output fed back as an input: -i binding; y = relu(x)*2 of y gives 2y
printf 'input x: f32[3, 4]\nz = x\nw = relu(x) * 2\noutput w\n' >"$t/q.kiln"
mkdir "$t/out2"
expect bind_input 0 "" -- "$kiln" run "$t/q.kiln" -i "x=$t/out1/y.npy" -o "$t/out2"
expect bind_unknown 1 "no input 'nope'" -- "$kiln" run "$t/q.kiln" -i "nope=$t/out1/y.npy"
expect bind_missing_file 1 "cannot open" -- "$kiln" run "$t/q.kiln" -i "x=$t/missing.npy"
expect bind_wrong_shape 1 "input 'x'" -- "$kiln" run "$t/q.kiln" -i "x=$t/out1/m.npy"
expect bind_malformed 2 "NAME=FILE.npy" -- "$kiln" run "$t/q.kiln" -i "x"

# a missing output directory: exit 3, nothing written
expect outdir_missing 3 "does not exist" -- "$kiln" run "$t/p.kiln" -o "$t/nodir"
if [ ! -e "$t/nodir" ]; then pass outdir_missing_nothing_written
else fail outdir_missing_nothing_written "$t/nodir was created"; fi

# every example compiles, runs and matches the interpreter
for f in examples/*.kiln; do
    n=$(basename "$f" .kiln)
    expect "example_$n" 0 "check: passed" -- "$kiln" run "$f" --check
done
# ill-conditioned programs (docs/tolerances.md): --check passes with the
# reference's spread where the plain tolerance cannot hold
for f in tests/conditioning/*.kiln; do
    n=$(basename "$f" .kiln)
    s=$(sed -n 's/^# fuzz_diff seed \([0-9]*\).*/\1/p' "$f")
    expect "conditioning_$n" 0 "check: passed" -- "$kiln" run "$f" --seed "$s" --check
done
expect run_interpret 0 "w: f32" -- "$kiln" run "$t/q.kiln" --interpret
expect run_threads 0 "check: passed" -- "$kiln" run examples/softmax.kiln --threads 1 --check
expect run_bad_threads 2 "--threads needs" -- "$kiln" run examples/softmax.kiln --threads 0
expect interpret_check 2 "--interpret runs no compiled code" -- "$kiln" run "$t/q.kiln" --interpret --check

# reports: explain's text, JSON, the fusion log, generated code, dot
expect explain_siblings 0 "fusing op0 with op1" -- "$kiln" explain examples/siblings.kiln
expect explain_wall 0 "found 0 possible fusions" -- "$kiln" explain examples/wall.kiln
expect explain_softmax 0 "cannot fuse op1 with op3: intermediate nodes between node1 & node2" \
    -- "$kiln" explain examples/softmax.kiln
# the extern seed: Inductor's three calls with --no-extern-epilogue; by
# default the relu runs as the matmul's epilogue, inside its call
expect explain_report 0 "" -- "$kiln" explain examples/extern.kiln --no-extern-epilogue --report "$t/e.json"
if grep -q '"calls": \["cpp_fused_add_0", "extern_kernels.mm", "cpp_fused_relu_1"\]' "$t/e.json"
then pass explain_report_calls; else fail explain_report_calls "$(head -c 400 "$t/e.json")"; fi
expect explain_epilogue 0 "fusing op1 with op2 (epilogue of extern_kernels.mm)" \
    -- "$kiln" explain examples/extern.kiln --report "$t/ee.json"
if grep -q '"calls": \["cpp_fused_add_0", "extern_kernels.mm"\]' "$t/ee.json" &&
    grep -q '"name": "extern_kernels.mm", "kind": "extern", "origins": \["matmul", "relu"\]' "$t/ee.json" &&
    grep -q '"epilogue": \["op2"\]' "$t/ee.json"
then pass explain_epilogue_calls; else fail explain_epilogue_calls "$(head -c 600 "$t/ee.json")"; fi
expect run_no_epilogue 0 "check: passed" -- "$kiln" run examples/extern.kiln --no-extern-epilogue --check
expect code_epilogue 0 "epi_1_cb, (void \*)bufs" -- "$kiln" code examples/extern.kiln
expect code_no_epilogue 0 "cpp_fused_relu_1" -- "$kiln" code examples/extern.kiln --no-extern-epilogue
expect dot_no_epilogue 2 "unknown option" -- "$kiln" dot examples/extern.kiln --no-extern-epilogue
expect run_report 0 "" -- "$kiln" run examples/chain.kiln --check --report "$t/r.json"
if grep -q '"check": {"passed": true' "$t/r.json" && grep -q '"fused_bytes": 8388608' "$t/r.json"
then pass run_report_fields; else fail run_report_fields "$(head -c 400 "$t/r.json")"; fi
expect report_unwritable 3 "cannot write" -- "$kiln" explain examples/chain.kiln --report "$t/nodir/r.json"
KILN_LOGS=fusion "$kiln" run examples/siblings.kiln >/dev/null 2>"$t/log"
if grep -q "^found 1 possible fusions" "$t/log" && grep -q "^completed fusion round (1/10): fused 2 nodes into 1 nodes" "$t/log"
then pass logs_fusion; else fail logs_fusion "$(head -5 "$t/log")"; fi
# explain names what runs each extern call (conv.c's and matmul.c's choice), the JSON too
expect explain_runs_on 0 "# runs on oneDNN" -- "$kiln" explain examples/conv_bn_relu.kiln
expect explain_runs_on_isa 0 "# runs on oneDNN .*, on oneDNN's [a-z0-9_]* kernels" -- \
    "$kiln" explain examples/conv_bn_relu.kiln
# the tier: named first by explain, in the report, and --target v2 caps the library
expect explain_target 0 "^== target: v[234] (-march=x86-64-v[234] -mtune=native" -- \
    "$kiln" explain examples/chain.kiln
expect explain_target_v2 0 "^== target: v2 (-march=x86-64-v2 -mtune=native), 4 float lanes" -- \
    "$kiln" explain examples/chain.kiln --target v2
expect explain_v2_dnnl_isa 0 "# runs on oneDNN .*, on oneDNN.s sse41 kernels" -- \
    env KILN_TARGET=v2 "$kiln" explain examples/conv_bn_relu.kiln
expect run_target_native 0 "" -- "$kiln" run examples/chain.kiln --target native
expect report_runs_on 0 "" -- "$kiln" explain examples/extern.kiln --report "$t/e.json"
if grep -q "\"name\": \"extern_kernels.mm\", .*\"runs_on\": \"oneDNN matmul (the constant B in the layout it picks, reordered once), on oneDNN's [a-z0-9_]* kernels\"" "$t/e.json"
then pass report_runs_on_field; else fail report_runs_on_field "$(head -c 600 "$t/e.json")"; fi
expect code_chain 0 "cpp_fused_add_mul_relu_sin_0" -- "$kiln" code examples/chain.kiln
expect code_entry 0 "kiln_entry" -- "$kiln" code examples/extern.kiln
expect dot_stdout 0 "digraph" -- "$kiln" dot examples/softmax.kiln
expect dot_file 0 "" -- "$kiln" dot examples/softmax.kiln -o "$t/g.dot"
if grep -q "cpp_fused_softmax_0" "$t/g.dot"; then pass dot_file_kernel; else fail dot_file_kernel; fi
if command -v dot >/dev/null 2>&1; then
    expect dot_svg 0 "" -- "$kiln" dot examples/softmax.kiln -o "$t/g.svg"
else
    expect dot_svg_no_graphviz 3 "graphviz" -- "$kiln" dot examples/softmax.kiln -o "$t/g.svg"
fi
if [ -z "$(ls "$t" | grep tmp)" ]; then pass no_tmp_files; else fail no_tmp_files "$(ls "$t")"; fi
expect bench 0 "speedup" -- "$kiln" bench examples/chain.kiln --repeat 2 --report "$t/b.json"
if grep -q '"fused_ms"' "$t/b.json" && grep -q '"bytes_unfused": 33554432' "$t/b.json" &&
    grep -q '"peak_rss_kib": [1-9][0-9]*' "$t/b.json"
then pass bench_report; else fail bench_report "$(head -c 400 "$t/b.json")"; fi
expect bench_no_epilogue 0 "speedup" -- "$kiln" bench examples/extern.kiln --repeat 2 --no-extern-epilogue

# --profile: every call, a summary by kind, the overhead line; --trace a
# Chrome trace whose every span is a call on the entry thread's track or a
# thread's share nested inside a call of the same number, one track per
# thread of the fixed team of 2
expect bench_profile 0 "^== by kind" -- "$kiln" bench examples/layernorm.kiln --repeat 3 \
    --threads 2 --fixed-threads --trace "$t/trace.json"
if grep -q "^profiled: median" "$t/out" && grep -q "cpp_fused" "$t/out"
then pass bench_profile_rows; else fail bench_profile_rows "$(head -30 "$t/out")"; fi
if python3 - "$t/trace.json" >"$t/why" 2>&1 <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
spans = [e for e in d["traceEvents"] if e["ph"] == "X"]
calls = [e for e in spans if e["cat"] == "call"]
threads = [e for e in spans if e["cat"] == "thread"]
names = {e["tid"] for e in d["traceEvents"] if e.get("name") == "thread_name"}
assert d["otherData"]["runs"] == 3 and len(calls) % 3 == 0 and calls, d["otherData"]
assert all(e["tid"] == 0 for e in calls), "a call off the entry thread"
assert {e["tid"] for e in threads} == {0, 1} == names, (names, {e["tid"] for e in threads})
for th in threads:
    assert any(c["args"]["call"] == th["args"]["call"] and c["ts"] <= th["ts"] + 1e-3 and
               th["ts"] + th["dur"] <= c["ts"] + c["dur"] + 1e-3 for c in calls), th
calls.sort(key=lambda e: e["ts"])
for a, b in zip(calls, calls[1:]):
    assert a["ts"] + a["dur"] <= b["ts"] + 1e-3, (a, b)
PY
then pass bench_trace_json; else fail bench_trace_json "$(tail -3 "$t/why")"; fi
expect bench_trace_unwritable 3 "cannot write" -- "$kiln" bench examples/chain.kiln --repeat 2 \
    --trace "$t/no/such/dir/t.json"
# KILN_PROFILE=1: kiln run's program prints its profile on stderr when freed
expect run_env_profile 0 "== profile: 1 call, 1 run" -- env KILN_PROFILE=1 "$kiln" run \
    examples/chain.kiln
# KILN_TRACE=FILE: the trace is written when the program is freed (valid
# JSON, one call span); one whose folder is missing is refused before
# anything runs (exit 3) and leaves nothing
expect run_env_trace 0 "" -- env KILN_TRACE="$t/env.json" "$kiln" run examples/chain.kiln
if python3 -c "import json, sys; d = json.load(open(sys.argv[1])); assert sum(e.get('cat') == 'call' for e in d['traceEvents']) == 1" "$t/env.json" 2>/dev/null
then pass run_env_trace_json; else fail run_env_trace_json "$(head -c 300 "$t/env.json")"; fi
expect run_env_trace_unwritable 3 "KILN_TRACE: cannot write" -- env KILN_TRACE="$t/no/dir/t.json" \
    "$kiln" run examples/chain.kiln
if [ ! -e "$t/no" ]; then pass run_env_trace_unwritable_nothing; else fail run_env_trace_unwritable_nothing; fi

# `$CC --version` is asked once per compiler (jit.c keeps the answer in the
# cache directory): a second process, its program cached, runs no compiler
# at all; the same compiler with a new modification time is asked again,
# and its unchanged answer keeps the cached program a hit
printf '#!/bin/sh\necho "$*" >>"%s/cc.log"\nexec cc "$@"\n' "$t" >"$t/logcc" && chmod +x "$t/logcc"
printf 'input x: f32[4]\ny = x * 3\noutput y\n' >"$t/v.kiln"
for i in 1 2; do CC="$t/logcc" KILN_CACHE_DIR="$t/vcache" "$kiln" run "$t/v.kiln" >/dev/null 2>&1; done
v1=$(grep -c -- '--version' "$t/cc.log"); c1=$(grep -vc -- '--version' "$t/cc.log")
touch -d '2001-02-03 04:05:06' "$t/logcc"
CC="$t/logcc" KILN_CACHE_DIR="$t/vcache" "$kiln" run "$t/v.kiln" >/dev/null 2>&1
v2=$(grep -c -- '--version' "$t/cc.log"); c2=$(grep -vc -- '--version' "$t/cc.log")
if [ "$v1" = 1 ] && [ "$c1" = 1 ] && [ "$v2" = 2 ] && [ "$c2" = 1 ] && ls "$t/vcache" | grep -q '^compiler-.*\.version$'
then pass compiler_version_kept
else fail compiler_version_kept "version queries $v1 then $v2 (want 1, 2), compiles $c1 then $c2 (want 1, 1)" "$(cat "$t/cc.log")"; fi

# ONNX models: .pb inputs, --shape for a symbolic dim, outputs by
# their ONNX names and types (cls is int64), the conformance runner on a
# test whose expected outputs come from tests/onnx/oracle.py
onnx=tests/onnx/mlp
expect onnx_run_pb 0 "check: passed" -- "$kiln" run $onnx/model.onnx -i x=$onnx/test_data_set_0/input_0.pb --check
expect onnx_symbolic_dim 1 "give its shape (kiln --shape x=" -- "$kiln" run $onnx/model.onnx
expect onnx_shape 0 "p: f32\[5, 3\]" -- "$kiln" run $onnx/model.onnx --shape x=5,4
# f64 in and out: computed in double and written as NumPy writes it (the
# expected file is NumPy's, tests/npy/gen.py; 3e300 would be inf in float)
printf 'input x: f64[4]\ny = x * 3.0 - 0.1\noutput y\n' >"$t/f64.kiln"
mkdir -p "$t/f64_out"
expect f64_npy_run 0 "" -- "$kiln" run "$t/f64.kiln" -i x=tests/npy/f64_4.npy -o "$t/f64_out"
if cmp -s "$t/f64_out/y.npy" tests/npy/f64_4_x3_minus01.npy; then pass f64_npy_values
else fail f64_npy_values "y.npy differs from NumPy's tests/npy/f64_4_x3_minus01.npy"; fi
# an int64 output is summarized as the model's int64 (held in f64 inside)
expect onnx_int_output_type 0 "y: i64\[2\]" -- "$kiln" run tests/onnx/int_input.onnx
mkdir -p "$t/onnx_out"
expect onnx_outputs 0 "" -- "$kiln" run $onnx/model.onnx -i x=$onnx/test_data_set_0/input_0.pb -o "$t/onnx_out"
if [ -f "$t/onnx_out/p.npy" ] && head -c 80 "$t/onnx_out/cls.npy" | grep -q "'<i8'"
then pass onnx_output_types; else fail onnx_output_types "$(ls "$t/onnx_out")"; fi
expect onnx_test_runner 0 "tests/onnx/mlp: 1 passed, 0 failed, 0 unsupported" -- "$kiln" onnx-test $onnx
mkdir -p "$t/onnx_unsup/test_data_set_0" && cp tests/onnx/unsupported.onnx "$t/onnx_unsup/model.onnx" && cp tests/onnx/x23.pb "$t/onnx_unsup/test_data_set_0/input_0.pb"
expect onnx_test_unsupported 0 "0 passed, 0 failed, 1 unsupported" -- "$kiln" onnx-test "$t/onnx_unsup"
expect onnx_explain 0 "kernel" -- "$kiln" explain $onnx/model.onnx --shape x=2,4
expect onnx_help 0 "usage: kiln onnx-test" -- "$kiln" help onnx-test
# what opsets 18 to 21 changed (tests/onnx/ops/gen.py: expected outputs from
# NumPy), fused and interpreted
nops=$(ls -d tests/onnx/ops/*/ | wc -l)
expect onnx_opsets_18_21 0 "total: $nops passed, 0 failed, 0 unsupported" -- "$kiln" onnx-test tests/onnx/ops/*/
# a nearest 2x resize between a relu and an add is views: one kernel; so is
# a linear 0.5x resize (strided slices of the edge-padded input)
expect resize_nearest_one_kernel 0 "^== kernels: 1$" -- \
    "$kiln" explain tests/onnx/ops/resize_nearest_fused_op13/model.onnx
expect resize_linear_down_one_kernel 0 "^== kernels: 1$" -- \
    "$kiln" explain tests/onnx/ops/resize_linear_down_op13/model.onnx
# CumSum and Atan are one loop each (a masked reduction; pointwise); TopK
# two (the ranks, then the selection by rank)
expect cumsum_one_kernel 0 "^== kernels: 1$" -- \
    "$kiln" explain tests/onnx/ops/cumsum_axis1_e1_r1/model.onnx
expect atan_one_kernel 0 "^== kernels: 1$" -- \
    "$kiln" explain tests/onnx/ops/atan_wide/model.onnx
expect topk_two_kernels 0 "^== kernels: 2$" -- \
    "$kiln" explain tests/onnx/ops/topk_axis0_3d/model.onnx
# initial RNN states that are constants of zeros: step 0's products with
# them are left out. GRU both ways over 3 steps: 2 input projections and 2
# products per later step and direction (2 + 2 * 2 * 2); GRU with
# linear_before_reset one way: 1 + 2 * 2; LSTM both ways over 4 steps: 2 + 3 * 2
for c in gru_zero_states:10 gru_zero_states_lbr:5 lstm_zero_states_lens:8; do
    m=${c%:*} want=${c#*:}
    got=$("$kiln" explain tests/onnx/ops/$m/model.onnx 2>&1 | grep -c '^kernel.*extern_kernels\.b\{0,1\}mm')
    if [ "$got" = "$want" ]; then pass "rnn_zero_state_$m"; else fail "rnn_zero_state_$m" "matmuls: $got, want $want"; fi
done
# an output named "out/put:0" is written as out_put_0.npy
expect output_name_sanitized 0 "out_put_0.npy" -- sh -c "mkdir -p $t/sl && \"$kiln\" run \
    tests/onnx/slash_output.onnx -o $t/sl >/dev/null && ls $t/sl"
# explain says how the control flow was imported
expect explain_loop_unrolled 0 "onnx: Loop 'n0' (node 0): unrolled at import, 4 passes of its 4-node body" -- \
    "$kiln" explain tests/onnx/ops/loop_carried_early_exit/model.onnx
expect explain_if_where 0 "both branches (2 and 1 nodes) are imported and each output is a where" -- \
    "$kiln" explain tests/onnx/ops/if_runtime_then/model.onnx
# a quantized model's uint8 output is written as numpy's '|u1'
qc=tests/onnx/ops/qlinear_conv_per_channel_bias
expect quant_output_u1 0 "'descr': '|u1'" -- sh -c "\"$kiln\" run $qc/model.onnx \
    -i x=$qc/test_data_set_0/input_0.pb -o $t >/dev/null && head -c 100 $t/y.npy"
expect onnx_opsets_18_21_interpreted 0 "total: $nops passed, 0 failed, 0 unsupported" -- \
    "$kiln" onnx-test --interpret tests/onnx/ops/*/

# control flow as compiled sub-programs everywhere (KILN_CONTROL_FLOW=call):
# the Loop, Scan and If cases here and in ONNX's backend tests pass as they
# do unrolled or as a where, fused and interpreted; only the Loop whose
# early exit makes its scan output's length data-dependent is refused
cf=$t/control_flow
mkdir -p "$cf"
for d in tests/onnx/ops/loop_* tests/onnx/ops/scan_* tests/onnx/ops/if_*; do
    ln -s "$PWD/$d" "$cf/${d##*/}"
done
dt=/usr/share/libonnx-testdata/data/node
for d in test_if test_loop11 test_scan9_sum test_scan_sum test_range_float_type_positive_delta_expanded \
    test_range_int32_type_negative_delta_expanded; do
    [ -d "$dt/$d" ] && ln -s "$dt/$d" "$cf/$d"
done
ncf=$(ls "$cf" | wc -l)
expect control_flow_as_calls 0 "total: $((ncf - 1)) passed, 0 failed, 1 unsupported" -- \
    env KILN_CONTROL_FLOW=call "$kiln" onnx-test "$cf"
expect control_flow_as_calls_interpreted 0 "total: $((ncf - 1)) passed, 0 failed, 1 unsupported" -- \
    env KILN_CONTROL_FLOW=call "$kiln" onnx-test --interpret "$cf"
# the profile shows each sub-program's calls after its caller's, per run of
# it (an iteration, a branch taken)
expect profile_sub_programs 0 "^== sub-program: Loop 'n0' (node 0), body > If 'body_1' (node 1), else_branch (one run: a call that takes it)" -- \
    "$kiln" bench tests/onnx/ops/loop_if_nested/model.onnx --fused-only --profile --repeat 3
# explain shows each sub-program's fusion after its caller's
expect explain_sub_programs 0 "^==== sub-program: Loop 'n0' (node 0), body > If 'body_1' (node 1), then_branch" -- \
    "$kiln" explain tests/onnx/ops/loop_if_nested/model.onnx

# a bad KILN_NUM_THREADS or more threads than cores: a warning, and the run
# goes on (every core, or the count asked for)
for v in abc 0 2x; do
    expect "num_threads_env_$v" 0 "KILN_NUM_THREADS=$v is not a positive integer" -- \
        env KILN_NUM_THREADS=$v "$kiln" run examples/chain.kiln
done
# a program of several threads times each team size a run may use before
# bench times it, and says which the timed runs used; --fixed-threads keeps
# every run on the count asked for (no team line); KILN_LOGS=team logs
# each measured epoch
expect bench_team 0 "^team: 2 threads [0-9.]* ms ([0-9]* of 3 runs), 1 thread [0-9.]* ms" -- \
    "$kiln" bench examples/chain.kiln --threads 2 --repeat 3
expect bench_fixed_threads 0 "median of 3 runs" -- \
    "$kiln" bench examples/chain.kiln --threads 2 --repeat 3 --fixed-threads
if grep -q "^team:" "$t/out"; then fail bench_fixed_threads_no_team "$(grep "^team:" "$t/out")"; else pass bench_fixed_threads_no_team; fi
expect team_log 0 "^team: 1 thread: [0-9.]* ms per run over [0-9]* runs; next" -- \
    env KILN_LOGS=team "$kiln" bench examples/chain.kiln --threads 2 --repeat 3
cores=$(nproc)
expect threads_above_cores 0 "$((cores + 1)) threads on $cores cores" -- \
    "$kiln" run examples/chain.kiln --threads $((cores + 1))
