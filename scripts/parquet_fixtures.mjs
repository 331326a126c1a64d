// Writes Parquet files with two independent writers, each with a JSON-lines
// export of its rows made by the same tool (read back from the written file):
//   DuckDB (@duckdb/node-api: COPY ... TO (FORMAT parquet), JSON by COPY ... (FORMAT json))
//   parquet-wasm (arrow-rs writer; JSON from its own readParquet + apache-arrow)
// Usage: node parquet_fixtures.mjs OUTDIR [--rows N] [--large]
//   default: the small committed fixtures of tests/data/parquet (64 rows, 3 row
//   groups, small pages); --large: bigger row groups and pages for the interop test.
// Data are deterministic (no randomness): same versions, same bytes.
import { DuckDBInstance } from '@duckdb/node-api';
import * as pw from 'parquet-wasm/esm';
import { createRequire } from 'node:module';
import * as arrow from 'apache-arrow';
import { mkdirSync, writeFileSync, readFileSync } from 'node:fs';

// The ESM build, initialised from its .wasm file (the package's node build does
// not load as a module under Node 20).
pw.initSync({ module: readFileSync(createRequire(import.meta.url).resolve('parquet-wasm/esm/parquet_wasm_bg.wasm')) });

const args = process.argv.slice(2);
if (!args.length) {
  console.error('usage: node parquet_fixtures.mjs OUTDIR [--rows N] [--large]');
  process.exit(2);
}
const out = args[0];
const large = args.includes('--large');
const ri = args.indexOf('--rows');
const rows = ri >= 0 ? parseInt(args[ri + 1], 10) : 64;
mkdirSync(out, { recursive: true });

// ---- the rows (shared shape; each writer builds its own from these formulas) ----
const STRS = ['', 'café', '日本語のキャプション', 'emoji 😀 ok', 'quote " backslash \\ tab\t newline\n end',
  'a small red circle at the top left on a white background'];
function row(i) {
  const n = BigInt(i);
  return {
    id: n,                                                             // INT64 required
    i32: i % 7 === 3 ? null : ((i * 7919) % 20011) - 10000,            // INT32 optional
    big: i % 5 === 2 ? null : i === 1 ? 9223372036854775807n : i === 4 ? -9223372036854775808n
      : n * 1234567890123n - 4000000000000000n,                      // INT64 optional, extremes
    d: i % 9 === 4 ? null : i / 7 - 3.25,                              // DOUBLE optional
    f: Math.fround((i % 1000) * 0.1 - 7.3),                            // FLOAT required
    s: i % 6 === 5 ? null : i % 4 === 0 ? `caption ${i} ${'x'.repeat(i % 17)}` : STRS[i % STRS.length], // BYTE_ARRAY optional
    b: i % 11 === 10 ? null : (i * 3) % 5 < 2,                         // BOOLEAN optional
    tag: `tag${i % 4}`,                                               // BYTE_ARRAY required
  };
}
const data = Array.from({ length: rows }, (_, i) => row(i));

// ---- DuckDB ----
async function duckdb() {
  const inst = await DuckDBInstance.create(':memory:');
  const c = await inst.connect();
  await c.run('SET threads=1');
  await c.run('SET preserve_insertion_order=true');
  await c.run(`CREATE TABLE t (id BIGINT NOT NULL, i32 INTEGER, big BIGINT, d DOUBLE, f FLOAT NOT NULL,
               s VARCHAR, b BOOLEAN, tag VARCHAR NOT NULL)`);
  const app = await c.createAppender('t');
  for (const r of data) {
    app.appendBigInt(r.id);
    r.i32 === null ? app.appendNull() : app.appendInteger(r.i32);
    r.big === null ? app.appendNull() : app.appendBigInt(r.big);
    r.d === null ? app.appendNull() : app.appendDouble(r.d);
    app.appendFloat(r.f);
    r.s === null ? app.appendNull() : app.appendVarchar(r.s);
    r.b === null ? app.appendNull() : app.appendBoolean(r.b);
    app.appendVarchar(r.tag);
    app.endRow();
  }
  app.closeSync();
  // Row groups: DuckDB closes a row group at the end of an input chunk once it
  // holds ROW_GROUP_SIZE rows, so a UNION ALL of slices gives one group per slice.
  const parts = 3, per = Math.ceil(rows / parts);
  const src = Array.from({ length: parts }, (_, k) =>
    `SELECT * FROM t WHERE id >= ${k * per} AND id < ${(k + 1) * per}`).join(' UNION ALL ');
  const rg = large ? Math.max(1, Math.floor(per / 2)) : 20;
  const configs = [
    ['duckdb_v1_none', 'COMPRESSION uncompressed'],
    ['duckdb_v1_snappy', 'COMPRESSION snappy'],
    ['duckdb_v1_gzip', 'COMPRESSION gzip'],
    ['duckdb_v2_zstd', 'COMPRESSION zstd, PARQUET_VERSION V2'],
    ['duckdb_v2_snappy_nodict', 'COMPRESSION snappy, PARQUET_VERSION V2, DICTIONARY_SIZE_LIMIT 1'],
    ['duckdb_v1_zstd_nodict', 'COMPRESSION zstd, DICTIONARY_SIZE_LIMIT 1'],
  ];
  for (const [name, opts] of configs) {
    const f = `${out}/${name}.parquet`;
    await c.run(`COPY (${src}) TO '${f}' (FORMAT parquet, ROW_GROUP_SIZE ${rg}, ${opts})`);
    await c.run(`COPY (SELECT * FROM '${f}') TO '${out}/${name}.json' (FORMAT json)`);
  }
  if (!large) { // a tiny file for the fuzzer's seeds (<= 8 KB)
    await c.run(`COPY (SELECT * FROM t WHERE id < 12) TO '${out}/duckdb_tiny.parquet' (FORMAT parquet, COMPRESSION snappy)`);
    await c.run(`COPY (SELECT * FROM '${out}/duckdb_tiny.parquet') TO '${out}/duckdb_tiny.json' (FORMAT json)`);
  }
  c.closeSync();
}

// ---- parquet-wasm (arrow-rs) ----
function arrowTable(rs) {
  const col = (k, type) => arrow.vectorFromArray(rs.map((r) => r[k]), type);
  const fields = [
    new arrow.Field('id', new arrow.Int64(), false),
    new arrow.Field('i32', new arrow.Int32(), true),
    new arrow.Field('big', new arrow.Int64(), true),
    new arrow.Field('d', new arrow.Float64(), true),
    new arrow.Field('f', new arrow.Float32(), false),
    new arrow.Field('s', new arrow.Utf8(), true),
    new arrow.Field('b', new arrow.Bool(), true),
    new arrow.Field('tag', new arrow.Utf8(), false),
  ];
  const schema = new arrow.Schema(fields);
  const vecs = fields.map((f) => col(f.name, f.type));
  const batch = new arrow.RecordBatch(schema, arrow.makeData({
    type: new arrow.Struct(fields), length: rs.length, nullCount: 0,
    children: vecs.map((v) => v.data[0]),
  }));
  return new arrow.Table([batch]);
}

function jsonLines(table) {
  const names = table.schema.fields.map((f) => f.name);
  let s = '';
  for (let i = 0; i < table.numRows; i++) {
    const parts = names.map((n) => {
      const v = table.getChild(n).get(i);
      let j;
      if (v === null || v === undefined) j = 'null';
      else if (typeof v === 'bigint') j = v.toString();
      else j = JSON.stringify(v);
      return `${JSON.stringify(n)}:${j}`;
    });
    s += `{${parts.join(',')}}\n`;
  }
  return s;
}

function parquetWasm() {
  const ipc = arrow.tableToIPC(arrowTable(data), 'stream');
  const C = pw.Compression, V = pw.WriterVersion;
  const rg = large ? Math.ceil(rows / 4) : 25;
  const page = large ? 16384 : 256;
  const configs = [
    ['pwasm_v1_none', C.UNCOMPRESSED, V.V1, true, 0],
    ['pwasm_v1_snappy_nodict', C.SNAPPY, V.V1, false, 0],
    ['pwasm_v2_gzip', C.GZIP, V.V2, true, 0],
    ['pwasm_v2_zstd_nodict', C.ZSTD, V.V2, false, 0],
    ['pwasm_v2_none_nodict', C.UNCOMPRESSED, V.V2, false, 0],
    ['pwasm_v1_snappy_fallback', C.SNAPPY, V.V1, true, large ? 2048 : 64], // dictionary fills up: PLAIN mid-chunk
  ];
  if (!large) configs.push(['pwasm_lz4raw', C.LZ4_RAW, V.V1, true, 0]); // unsupported codec (negative test)
  for (const [name, codec, ver, dict, dictLimit] of configs) {
    let b = new pw.WriterPropertiesBuilder().setCompression(codec).setWriterVersion(ver)
      .setDictionaryEnabled(dict).setMaxRowGroupSize(rg).setDataPageSizeLimit(page)
      .setWriteBatchSize(large ? 1024 : 16).setCreatedBy('parquet-wasm (ctuner fixtures)');
    if (dictLimit) b = b.setDictionaryPageSizeLimit(dictLimit);
    const bytes = pw.writeParquet(pw.Table.fromIPCStream(ipc), b.build());
    const f = `${out}/${name}.parquet`;
    writeFileSync(f, bytes);
    if (name === 'pwasm_lz4raw') continue;
    const back = arrow.tableFromIPC(pw.readParquet(readFileSync(f)).intoIPCStream());
    writeFileSync(`${out}/${name}.json`, jsonLines(back));
  }
  if (!large) {
    const tiny = arrow.tableToIPC(arrowTable(data.slice(0, 12)), 'stream');
    const props = new pw.WriterPropertiesBuilder().setCompression(C.UNCOMPRESSED).setWriterVersion(V.V2).build();
    const bytes = pw.writeParquet(pw.Table.fromIPCStream(tiny), props);
    writeFileSync(`${out}/pwasm_tiny.parquet`, bytes);
    const back = arrow.tableFromIPC(pw.readParquet(bytes).intoIPCStream());
    writeFileSync(`${out}/pwasm_tiny.json`, jsonLines(back));
  }
}

await duckdb();
parquetWasm();
console.log(`wrote ${out} (${rows} rows per file${large ? ', large layout' : ''})`);
