-- tracekit's attributed tables, next to the Collector exporter's spans: one row per
-- request, one per (request, stage) and one per (request, stage, operation), as
-- tracekit's own `requests`, `request_stages` and `request_operations` (sql/schema.sql), written by `tracekit attribute` and read by every
-- analysis command on a ClickHouse store. Rows are versioned by AttributedAt: a trace
-- attributed again (late spans) replaces its rows, and readers keep the latest version
-- (FINAL, and stage rows of the request's own version only), so no request counts twice.
-- {db}, {requests}, {stages}, {attributes}, {state}, {operations} are allow-listed identifiers;
-- {on_cluster} is empty or ON CLUSTER `name`; {engine} is ReplacingMergeTree or its
-- Replicated form.

-- name: requests
CREATE TABLE IF NOT EXISTS {db}.{requests} {on_cluster}
(
    TraceId         String CODEC(ZSTD(1)),
    RootSpanId      String CODEC(ZSTD(1)),
    ServiceName     LowCardinality(String),
    Release         LowCardinality(String),
    InstanceId      LowCardinality(String),
    HostName        LowCardinality(String),
    Name            LowCardinality(String),
    Route           LowCardinality(String),
    StartNs         Int64 CODEC(Delta, ZSTD(1)),
    DurationNs      Int64 CODEC(ZSTD(1)),
    IsError         Bool,
    SampleWeight    Float64 CODEC(ZSTD(1)),
    Inflight        Nullable(Float64),
    QueueDepth      Nullable(Float64),
    CpuUtilization  Nullable(Float64),
    GpuUtilization  Nullable(Float64),
    SpanCount       UInt32,
    SkewedSpans     UInt32,
    SpansSeen       UInt32,         -- spans of the trace in the table when attributed
    AttributedAt    DateTime64(9)
)
ENGINE = {engine}(AttributedAt)
PARTITION BY toDate(fromUnixTimestamp64Nano(StartNs))
ORDER BY (Release, ServiceName, TraceId)

-- name: stages
CREATE TABLE IF NOT EXISTS {db}.{stages} {on_cluster}
(
    TraceId         String CODEC(ZSTD(1)),
    Stage           LowCardinality(String),
    TimeKind        LowCardinality(String),
    CriticalNs      Int64 CODEC(ZSTD(1)),
    WallNs          Int64 CODEC(ZSTD(1)),
    CpuTimeNs       Nullable(Int64),
    GpuTimeNs       Nullable(Int64),
    AttributedAt    DateTime64(9)
)
ENGINE = {engine}(AttributedAt)
ORDER BY (TraceId, Stage)

-- name: operations
-- Per (request, stage, operation), as `request_operations` (sql/schema.sql): the path time
-- of each operation beneath its stage, its calls, calls on the path, calls that overlapped
-- an earlier one under the same parent (0: serial) and calls with an error. Service and
-- Operation are span text (attacker-controlled), bound as data, never spliced into SQL.
CREATE TABLE IF NOT EXISTS {db}.{operations} {on_cluster}
(
    TraceId         String CODEC(ZSTD(1)),
    Stage           LowCardinality(String),
    Service         LowCardinality(String),
    Operation       LowCardinality(String),
    CriticalNs      Int64 CODEC(ZSTD(1)),
    Calls           UInt32,
    CallsOnPath     UInt32,
    Overlapping     UInt32,
    Errors          UInt32,
    AttributedAt    DateTime64(9)
)
ENGINE = {engine}(AttributedAt)
ORDER BY (TraceId, Stage, Service, Operation)

-- name: attributes
-- The distinct (attribute, value) pairs of each request's spans that BubbleUp may rank
-- (identifiers, clocks and URLs left out when attributed), so a diff's attribute ranking
-- needs no span.
CREATE TABLE IF NOT EXISTS {db}.{attributes} {on_cluster}
(
    TraceId         String CODEC(ZSTD(1)),
    Attribute       LowCardinality(String),
    Value           String CODEC(ZSTD(1)),
    AttributedAt    DateTime64(9)
)
ENGINE = {engine}(AttributedAt)
ORDER BY (TraceId, Attribute, Value)

-- name: state
-- One row per (spans table, shard): attributed up to Watermark (request end, ns).
CREATE TABLE IF NOT EXISTS {db}.{state} {on_cluster}
(
    SpansTable      String,
    Shard           String,
    Watermark       Int64,
    Requests        UInt64,
    UpdatedAt       DateTime64(9)
)
ENGINE = {engine}(UpdatedAt)
ORDER BY (SpansTable, Shard)
