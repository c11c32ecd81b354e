#!/usr/bin/env node
// Exports request traces through the real Node.js OpenTelemetry SDK to an OTLP receiver,
// for tests/collect/test_node_sdk.py.
//
//   node export.js --url URL --protocol proto|json|grpc --compression gzip|none \
//                  --spans N --service NAME --version V
//
// --spans N is the number of requests: N SERVER roots `POST /predict`, each with two
// INTERNAL children (feature_retrieval, model_execute), 3N spans in all. One span links
// to another, one carries an event, one ends with status ERROR. Every time is explicit,
// so every duration is non-zero.
//
// After forceFlush() and shutdown() it prints ONE JSON line on stdout: the list of every
// span as the SDK saw it when it ended (ids as lower-case hex, parentSpanId "" for a
// root, kind as the JS API's SpanKind number — INTERNAL 0, SERVER 1, CLIENT 2, PRODUCER
// 3, CONSUMER 4 — times as decimal nanosecond strings from the SDK's HrTime, attributes
// as a plain object, status.code as UNSET 0 / OK 1 / ERROR 2, links, resource
// attributes). The line is printed even when an export failed, so the caller can say
// what was sent; the exit status is then 1 and the errors are on stderr.
//
// The modules come from .cache/node/node_modules (`make node-deps`): the test puts that
// folder on NODE_PATH; without NODE_PATH this script looks there itself.
'use strict';

const path = require('path');
const { createRequire } = require('module');

function load(name) {
  try {
    return require(name);
  } catch (err) {
    if (err.code !== 'MODULE_NOT_FOUND') throw err;
    const cache = path.resolve(__dirname, '..', '..', '..', '.cache', 'node', 'package.json');
    return createRequire(cache)(name);
  }
}

const api = load('@opentelemetry/api');
const { NodeTracerProvider } = load('@opentelemetry/sdk-trace-node');
const { BatchSpanProcessor } = load('@opentelemetry/sdk-trace-base');
const { resourceFromAttributes } = load('@opentelemetry/resources');

const USAGE =
  'usage: node export.js --url URL --protocol proto|json|grpc --compression gzip|none ' +
  '--spans N --service NAME --version V';

function parseArgs(argv) {
  const opts = {};
  for (let i = 0; i < argv.length; i += 2) {
    const key = argv[i];
    const value = argv[i + 1];
    if (!key.startsWith('--') || value === undefined) throw new Error(USAGE);
    opts[key.slice(2)] = value;
  }
  for (const key of ['url', 'protocol', 'compression', 'spans', 'service', 'version']) {
    if (opts[key] === undefined) throw new Error(`--${key} is required\n${USAGE}`);
  }
  if (!['proto', 'json', 'grpc'].includes(opts.protocol)) {
    throw new Error(`--protocol must be proto, json or grpc, not ${opts.protocol}`);
  }
  if (!['gzip', 'none'].includes(opts.compression)) {
    throw new Error(`--compression must be gzip or none, not ${opts.compression}`);
  }
  opts.spans = Number(opts.spans);
  if (!Number.isInteger(opts.spans) || opts.spans < 1) throw new Error('--spans must be >= 1');
  return opts;
}

function makeExporter(opts) {
  const config = { url: opts.url, compression: opts.compression, timeoutMillis: 10000 };
  if (opts.protocol === 'proto') {
    const { OTLPTraceExporter } = load('@opentelemetry/exporter-trace-otlp-proto');
    return new OTLPTraceExporter(config);
  }
  if (opts.protocol === 'json') {
    const { OTLPTraceExporter } = load('@opentelemetry/exporter-trace-otlp-http');
    return new OTLPTraceExporter(config);
  }
  // gRPC: an http:// url means plaintext (insecure) credentials.
  const { OTLPTraceExporter } = load('@opentelemetry/exporter-trace-otlp-grpc');
  return new OTLPTraceExporter(config);
}

// Wraps the exporter to see every export's result: the BatchSpanProcessor only hands a
// failure to the global error handler, and forceFlush() resolves regardless.
class RecordingExporter {
  constructor(inner) {
    this.inner = inner;
    this.errors = [];
    this.exported = 0;
  }

  export(spans, done) {
    this.inner.export(spans, (result) => {
      if (result.code === 0) {
        this.exported += spans.length;
      } else {
        const why = result.error ? result.error.stack || String(result.error) : 'no error given';
        this.errors.push(`export of ${spans.length} span(s) failed: ${why}`);
      }
      done(result);
    });
  }

  forceFlush() {
    return this.inner.forceFlush ? this.inner.forceFlush() : Promise.resolve();
  }

  shutdown() {
    return this.inner.shutdown();
  }
}

const NS_PER_S = 1000000000n;

function hrToNs(hr) {
  return BigInt(hr[0]) * NS_PER_S + BigInt(hr[1]);
}

function nsToHr(ns) {
  return [Number(ns / NS_PER_S), Number(ns % NS_PER_S)];
}

function toPlain(value) {
  return Array.isArray(value) ? value.slice() : value;
}

function describe(span) {
  const ctx = span.spanContext();
  const parent = span.parentSpanContext;
  const attributes = {};
  for (const [key, value] of Object.entries(span.attributes)) attributes[key] = toPlain(value);
  const resource = {};
  for (const [key, value] of Object.entries(span.resource.attributes)) {
    resource[key] = toPlain(value);
  }
  return {
    traceId: ctx.traceId,
    spanId: ctx.spanId,
    parentSpanId: parent ? parent.spanId : '',
    name: span.name,
    kind: span.kind,
    startTimeUnixNano: hrToNs(span.startTime).toString(),
    endTimeUnixNano: hrToNs(span.endTime).toString(),
    attributes,
    status: { code: span.status.code, message: span.status.message || '' },
    links: span.links.map((link) => ({
      traceId: link.context.traceId,
      spanId: link.context.spanId,
      attributes: { ...(link.attributes || {}) },
    })),
    events: span.events.map((event) => ({ name: event.name, attributes: { ...event.attributes } })),
    resource,
  };
}

async function main() {
  const opts = parseArgs(process.argv.slice(2));
  const errors = [];
  api.diag.setLogger(
    {
      error: (...args) => errors.push(`diag error: ${args.join(' ')}`),
      warn: (...args) => process.stderr.write(`diag warn: ${args.join(' ')}\n`),
      info: () => {},
      debug: () => {},
      verbose: () => {},
    },
    api.DiagLogLevel.WARN,
  );

  const exporter = new RecordingExporter(makeExporter(opts));
  const finished = [];
  const recorder = {
    onStart() {},
    onEnd(span) {
      finished.push(span);
    },
    forceFlush: () => Promise.resolve(),
    shutdown: () => Promise.resolve(),
  };
  const provider = new NodeTracerProvider({
    resource: resourceFromAttributes({
      'service.name': opts.service,
      'service.version': opts.version,
      'service.instance.id': `${opts.service}-node-${process.pid}`,
    }),
    spanProcessors: [recorder, new BatchSpanProcessor(exporter, { scheduledDelayMillis: 50 })],
  });
  const tracer = provider.getTracer('tracekit-node-sdk-test', '1.0.0');

  // Requests 10 ms apart from a base one minute ago; every time is explicit HrTime, with
  // an odd nanosecond part so that a receiver rounding to µs or ms would show.
  const base = BigInt(Date.now() - 60000) * 1000000n + 123457n;
  const ms = (n) => BigInt(Math.round(n * 1e6));
  let previousRoot = null;
  for (let i = 0; i < opts.spans; i++) {
    const t0 = base + ms(10 * i);
    const root = tracer.startSpan('POST /predict', {
      kind: api.SpanKind.SERVER,
      startTime: nsToHr(t0),
      attributes: {
        'http.route': '/predict',
        'http.request.method': 'POST',
        'http.response.status_code': i === opts.spans - 1 ? 500 : 200,
        'tracekit.test.request_index': i,
        'tracekit.test.score': 0.25 + i,
        'tracekit.test.cached': i % 2 === 0,
        'tracekit.test.models': ['ranker', `ranker-${i}`],
        'tracekit.test.weights': [0.5, 1.5],
      },
    });
    const parent = api.trace.setSpan(api.context.active(), root);

    const fr = tracer.startSpan(
      'feature_retrieval',
      {
        kind: api.SpanKind.INTERNAL,
        startTime: nsToHr(t0 + ms(0.2)),
        attributes: { 'tracekit.stage': 'feature_retrieval', 'tracekit.time_kind': 'wait' },
      },
      parent,
    );
    if (i === 0) {
      fr.addEvent('cache_miss', { 'cache.key': 'user:42', 'cache.shard': 3 }, nsToHr(t0 + ms(0.5)));
    }
    fr.end(nsToHr(t0 + ms(2.2)));

    const links = [];
    if (previousRoot !== null) {
      links.push({ context: previousRoot.spanContext(), attributes: { 'link.reason': 'batched' } });
    }
    const model = tracer.startSpan(
      'model_execute',
      {
        kind: api.SpanKind.INTERNAL,
        startTime: nsToHr(t0 + ms(2.5)),
        attributes: {
          'tracekit.stage': 'model_execute',
          'tracekit.time_kind': 'compute',
          'tracekit.gpu_time_ns': 3000000 + i,
        },
        links: i === 1 ? links : [],
      },
      parent,
    );
    model.end(nsToHr(t0 + ms(6.5)));

    if (i === opts.spans - 1) {
      root.setStatus({ code: api.SpanStatusCode.ERROR, message: 'model failed' });
    }
    root.end(nsToHr(t0 + ms(7.25)));
    previousRoot = root;
  }

  try {
    await provider.forceFlush();
  } catch (err) {
    errors.push(`forceFlush rejected: ${err && err.stack ? err.stack : err}`);
  }
  try {
    await provider.shutdown();
  } catch (err) {
    errors.push(`shutdown rejected: ${err && err.stack ? err.stack : err}`);
  }

  process.stdout.write(JSON.stringify(finished.map(describe)) + '\n');
  errors.unshift(...exporter.errors);
  if (exporter.exported !== finished.length) {
    errors.push(`${exporter.exported} of ${finished.length} spans were exported successfully`);
  }
  if (errors.length) {
    process.stderr.write(errors.join('\n') + '\n');
    process.exitCode = 1;
  }
}

main().catch((err) => {
  process.stderr.write(`${err && err.stack ? err.stack : err}\n`);
  process.exitCode = 2;
});
