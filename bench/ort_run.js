#!/usr/bin/env node
// ort_run.js -- run an ONNX model with ONNX Runtime (npm's onnxruntime-node,
// installed into bench/node_modules by bench/compare) and time it.
//
//   node bench/ort_run.js MODEL.onnx THREADS REPEAT OUTDIR NAME=FILE.npy ...
//   (ORT_ALLOW_SPINNING=0 in the environment: intra-op threads do not spin;
//    ORT_PLAIN_REPEAT=N: how many plain runs, default REPEAT)
//
// Loads the model (all graph optimizations, intraOpNumThreads = THREADS,
// interOpNumThreads = 1, sequential), feeds the .npy inputs, runs once to
// warm up, then REPEAT timed runs two ways:
//   prealloc: outputs preallocated once and passed as fetches, so ORT writes
//             into the same memory every run (no allocation, no copy);
//   plain:    session.run(feeds), ORT returning fresh output tensors.
// Writes every output to OUTDIR/NAME.npy (for the correctness check) and
// prints one JSON line: {"prealloc_ms": [...], "plain_ms": [...], ...}.
'use strict';
const fs = require('fs');
const path = require('path');
const ort = require(path.join(__dirname, 'node_modules', 'onnxruntime-node'));

function readNpy(file) {
  const b = fs.readFileSync(file);
  if (b.toString('latin1', 1, 6) !== 'NUMPY') throw new Error(file + ': not a .npy file');
  const major = b[6];
  const hlen = major === 1 ? b.readUInt16LE(8) : b.readUInt32LE(8);
  const off = (major === 1 ? 10 : 12) + hlen;
  const header = b.toString('latin1', major === 1 ? 10 : 12, off);
  if (!/'descr':\s*'<f4'/.test(header) || /'fortran_order':\s*True/.test(header))
    throw new Error(file + ': only little-endian C-order float32 is supported');
  const shape = header.match(/'shape':\s*\(([^)]*)\)/)[1].split(',')
    .map((s) => s.trim()).filter((s) => s.length).map(Number);
  const n = shape.reduce((a, c) => a * c, 1);
  const data = new Float32Array(n);
  new Uint8Array(data.buffer).set(b.subarray(off, off + 4 * n));
  return { shape, data };
}

function writeNpy(file, dims, data) {
  let header = `{'descr': '<f4', 'fortran_order': False, 'shape': (${dims.join(', ')}${dims.length === 1 ? ',' : ''}), }`;
  const pad = 64 - ((10 + header.length + 1) % 64);
  header += ' '.repeat(pad % 64) + '\n';
  const head = Buffer.alloc(10);
  head.write('\x93NUMPY', 0, 'latin1');
  head[6] = 1; head[7] = 0;
  head.writeUInt16LE(header.length, 8);
  fs.writeFileSync(file, Buffer.concat([head, Buffer.from(header, 'latin1'),
    Buffer.from(data.buffer, data.byteOffset, data.byteLength)]));
}

function median(xs) {
  const s = [...xs].sort((a, b) => a - b);
  const n = s.length;
  return n % 2 ? s[(n - 1) / 2] : (s[n / 2 - 1] + s[n / 2]) / 2;
}

async function main() {
  const [model, threadsS, repeatS, outdir, ...binds] = process.argv.slice(2);
  const threads = Number(threadsS), repeat = Number(repeatS);
  const feeds = {};
  for (const bnd of binds) {
    const eq = bnd.indexOf('=');
    const { shape, data } = readNpy(bnd.slice(eq + 1));
    feeds[bnd.slice(0, eq)] = new ort.Tensor('float32', data, shape);
  }
  const t0 = process.hrtime.bigint();
  const opts = {
    intraOpNumThreads: threads, interOpNumThreads: 1, executionMode: 'sequential',
    graphOptimizationLevel: 'all',
  };
  // ORT_ALLOW_SPINNING=0: worker threads sleep instead of spinning between
  // tasks (what OMP_WAIT_POLICY=passive does for libgomp).
  if (process.env.ORT_ALLOW_SPINNING !== undefined)
    opts.extra = { session: { intra_op: { allow_spinning: process.env.ORT_ALLOW_SPINNING } } };
  const session = await ort.InferenceSession.create(model, opts);
  const loadMs = Number(process.hrtime.bigint() - t0) / 1e6;
  // plain run: warm-up, output shapes, outputs for the check
  const first = await session.run(feeds);
  const fetches = {};
  for (const name of session.outputNames) {
    const o = first[name];
    fetches[name] = new ort.Tensor('float32', new Float32Array(o.data.length), o.dims);
    writeNpy(path.join(outdir, name + '.npy'), o.dims, o.data);
  }
  const time = async (args, n = repeat) => {
    const ts = [];
    for (let i = 0; i < n; i++) {
      const a = process.hrtime.bigint();
      await session.run(...args);
      ts.push(Number(process.hrtime.bigint() - a) / 1e6);
    }
    return ts;
  };
  let prealloc = null, preallocError = null;
  try {
    await session.run(feeds, fetches); // warm-up, and does it work at all
    prealloc = await time([feeds, fetches]);
    for (const name of session.outputNames) {   // same answer as the plain run?
      const a = fetches[name].data, b = first[name].data;
      for (let i = 0; i < a.length; i++)
        if (!(a[i] === b[i] || (Number.isNaN(a[i]) && Number.isNaN(b[i])))) {
          throw new Error(`preallocated output ${name} differs at ${i}`);
        }
    }
  } catch (e) {
    preallocError = String(e);
    prealloc = null;
  }
  const plain = await time([feeds], Number(process.env.ORT_PLAIN_REPEAT || repeat));
  console.log(JSON.stringify({
    ort_version: ort.env.versions.common, threads, repeat, load_ms: loadMs,
    allow_spinning: process.env.ORT_ALLOW_SPINNING === undefined ? 'default' : process.env.ORT_ALLOW_SPINNING,
    prealloc_ms: prealloc, prealloc_median_ms: prealloc ? median(prealloc) : null,
    prealloc_error: preallocError, plain_ms: plain, plain_median_ms: median(plain),
    outputs: session.outputNames,
  }));
}

main().catch((e) => { console.error('ort_run: ' + (e && e.stack || e)); process.exit(1); });
