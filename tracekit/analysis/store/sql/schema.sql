-- tracekit store schema. One row per span in `spans`; `requests`, `request_stages` and
-- `request_operations` are derived by tracekit.analysis.attribution.per_request.refresh() after each ingest.
-- IDs are lower-case hex (trace 32 chars, span 16 chars); times are integer nanoseconds.

CREATE TABLE IF NOT EXISTS spans (
    trace_id            VARCHAR NOT NULL,
    span_id             VARCHAR NOT NULL,
    parent_span_id      VARCHAR,            -- NULL for a root; may name a span not in the store
    name                VARCHAR NOT NULL,
    kind                VARCHAR NOT NULL,   -- INTERNAL SERVER CLIENT PRODUCER CONSUMER UNSPECIFIED
    start_ns            BIGINT,             -- NULL when the source had no timestamps
    end_ns              BIGINT,
    status_code         VARCHAR NOT NULL,   -- UNSET OK ERROR
    service_name        VARCHAR,
    service_version     VARCHAR,
    instance_id         VARCHAR,
    host_name           VARCHAR,
    stage               VARCHAR,            -- tracekit.stage as written on the span (not inherited)
    time_kind           VARCHAR,            -- tracekit.time_kind as written on the span
    cpu_time_ns         BIGINT,
    gpu_time_ns         BIGINT,
    sample_weight       DOUBLE NOT NULL DEFAULT 1.0,
    attributes          JSON,               -- span attributes, OTLP AnyValue decoded to JSON
    resource_attributes JSON,
    links               JSON,               -- [{"trace_id":..,"span_id":..,"attributes":{..}}]
    source              VARCHAR,            -- "file:line" the span came from
    trace_state         VARCHAR,            -- W3C tracestate as the span carried it (sampling)
    PRIMARY KEY (trace_id, span_id)
);

-- Stores written before trace_state existed gain the column (NULL for their spans).
ALTER TABLE spans ADD COLUMN IF NOT EXISTS trace_state VARCHAR;

CREATE TABLE IF NOT EXISTS requests (
    trace_id          VARCHAR PRIMARY KEY,
    root_span_id      VARCHAR NOT NULL,
    service_name      VARCHAR,
    release           VARCHAR,              -- service.version of the root span's resource (or --version)
    instance_id       VARCHAR,
    host_name         VARCHAR,
    name              VARCHAR,              -- root span name, e.g. "POST /predict"
    route             VARCHAR,              -- http.route when present
    start_ns          BIGINT NOT NULL,
    duration_ns       BIGINT NOT NULL,
    is_error          BOOLEAN NOT NULL,
    sample_weight     DOUBLE NOT NULL,
    inflight          DOUBLE,
    queue_depth       DOUBLE,
    cpu_utilization   DOUBLE,
    gpu_utilization   DOUBLE,
    span_count        INTEGER NOT NULL,
    skewed_spans      INTEGER NOT NULL      -- children clipped to their parent (clock skew)
);

CREATE TABLE IF NOT EXISTS request_stages (
    trace_id     VARCHAR NOT NULL,
    stage        VARCHAR NOT NULL,          -- a stage name or 'unattributed'
    time_kind    VARCHAR NOT NULL,          -- wait | compute
    critical_ns  BIGINT NOT NULL,           -- time of this stage on the request's critical path
    wall_ns      BIGINT NOT NULL,           -- wall time of the stage's own spans (union, clipped)
    cpu_time_ns  BIGINT,                    -- sum of tracekit.cpu_time_ns, NULL when never measured
    gpu_time_ns  BIGINT,                    -- sum of tracekit.gpu_time_ns, NULL when never measured
    PRIMARY KEY (trace_id, stage)
);

-- Operations under stages: per request, per stage, the operations its spans perform
-- (tracekit.analysis.attribution.operations): a span's service and name with ids masked; a
-- CLIENT span names what it calls (its callee's SERVER span, else server address and URL).
CREATE TABLE IF NOT EXISTS request_operations (
    trace_id       VARCHAR NOT NULL,
    stage          VARCHAR NOT NULL,        -- the spans' effective stage, or 'unattributed'
    service        VARCHAR NOT NULL,
    operation      VARCHAR NOT NULL,        -- attacker-controlled text, at most 96 characters
    critical_ns    BIGINT NOT NULL,         -- the operation's own time on the critical path
    calls          INTEGER NOT NULL,        -- a CLIENT span and its callee's SERVER span: one call
    calls_on_path  INTEGER NOT NULL,        -- calls with critical-path time in their subtree
    overlapping    INTEGER NOT NULL,        -- calls begun while an earlier one under the same parent ran (0: serial)
    errors         INTEGER NOT NULL,        -- calls with a span of status ERROR
    PRIMARY KEY (trace_id, stage, service, operation)
);

CREATE TABLE IF NOT EXISTS ingest_log (
    ingested_at  TIMESTAMP DEFAULT current_timestamp,
    source       VARCHAR,
    spans        BIGINT,
    problems     BIGINT
);

-- Profiles captured on trigger: one row per Kineto file a serving process wrote with
-- tracekit's metadata (docs/kineto.md, "Profiles captured on trigger"), written by
-- tracekit.analysis.ingest.kineto_profiles. What explain shows is computed at ingest.
CREATE TABLE IF NOT EXISTS profiles (
    profile_id          VARCHAR PRIMARY KEY,  -- 16 hex; the captured spans' tracekit.profile.id
    source              VARCHAR,              -- the file it was read from
    service             VARCHAR,
    service_version     VARCHAR,              -- the metadata's, else --version
    instance_id         VARCHAR,
    pid                 BIGINT,
    reason              VARCHAR NOT NULL,     -- rule | on_demand
    trigger_trace_id    VARCHAR,              -- the request whose slow stage fired the rule
    trigger_span_id     VARCHAR,
    stage               VARCHAR,              -- the trigger's stage, else the captured one's
    trigger_duration_ms DOUBLE,
    trigger_rule        VARCHAR,
    trace_ids           VARCHAR[] NOT NULL,   -- the trigger's, captured and overlapping traces
    captured            JSON NOT NULL,        -- [{trace_id, span_id, stage, start_ns, end_ns}]
    overlapping         JSON NOT NULL,        -- the same, for executions profiled only in part
    start_ns            BIGINT,               -- first op's start (Unix ns, as the file says)
    wall_ns             BIGINT NOT NULL,      -- first op's start to the last op's end
    cpu_self_ns         BIGINT NOT NULL,      -- self time of every CPU op, summed
    kernel_ns           BIGINT NOT NULL,      -- time of every device op, summed (0: no GPU)
    top_ops             JSON NOT NULL,        -- CPU ops by self time: [{name, calls, self_ns, total_ns}]
    top_kernels         JSON NOT NULL,        -- device ops by time, the same fields
    gpu                 JSON                  -- GPU time line (kineto_gpu's figures); NULL without one
);
