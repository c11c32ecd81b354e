"""The span conventions: every attribute and stage name tracekit writes or reads.

This module is the contract between ``tracekit.instrumentation`` (which writes spans)
and ``tracekit.analysis`` (which reads them). OpenTelemetry semantic-convention names
are used wherever one exists; tracekit's own names live under ``tracekit.``.
No other module spells these strings: import them from here.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final

# --- OpenTelemetry semantic conventions (resource) -------------------------------
SERVICE_NAME: Final = "service.name"
"""Logical service name (resource)."""
SERVICE_VERSION: Final = "service.version"
"""Release label (resource); ``--before``/``--after`` select on it."""
SERVICE_INSTANCE_ID: Final = "service.instance.id"
"""One replica (resource); the analyzer counts live replicas per window from it."""
HOST_NAME: Final = "host.name"
"""Host the process runs on (resource)."""

# --- OpenTelemetry semantic conventions (span) -----------------------------------
HTTP_ROUTE: Final = "http.route"
"""Matched route template of a SERVER span, e.g. ``/predict``."""
HTTP_REQUEST_METHOD: Final = "http.request.method"
"""HTTP method."""
HTTP_RESPONSE_STATUS_CODE: Final = "http.response.status_code"
"""HTTP status code of the response."""
HTTP_REQUEST_RESEND_COUNT: Final = "http.request.resend_count"
"""Ordinal of a retried HTTP request (1 for the first retry)."""
SERVER_ADDRESS: Final = "server.address"
"""Host name or address of the server a CLIENT span called."""
SERVER_PORT: Final = "server.port"
"""Port of the server a CLIENT span called."""
URL_FULL: Final = "url.full"
"""Absolute URL a CLIENT span requested."""
URL_TEMPLATE: Final = "url.template"
"""Low-cardinality template of a CLIENT span's URL, e.g. ``/users/{id}``."""
DB_SYSTEM: Final = "db.system"
"""Database system of a client span (older semantic-convention name)."""
DB_SYSTEM_NAME: Final = "db.system.name"
"""Database system of a client span (current semantic-convention name)."""
ERROR_TYPE: Final = "error.type"
"""Class of error a span ended with (exception type name or status code)."""
RPC_GRPC_STATUS_CODE: Final = "rpc.grpc.status_code"
"""gRPC status code of an RPC span (4: DEADLINE_EXCEEDED, a timeout)."""

# --- tracekit: request (root SERVER) span -----------------------------------------
INFLIGHT: Final = "tracekit.inflight"
"""Requests in flight in this process when this one arrived (itself included)."""
QUEUE_DEPTH: Final = "tracekit.queue.depth"
"""Batch-queue length when this request arrived."""
CPU_UTILIZATION: Final = "tracekit.cpu.utilization"
"""Process CPU use over a recent window: 0..1 of the cores it may use (affinity, cgroup
quota), or of its stated CPU request (``TRACEKIT_CPU_REQUEST``), which like a Kubernetes
HPA's utilisation can exceed 1 when the pod bursts above its request."""
GPU_UTILIZATION: Final = "tracekit.gpu.utilization"
"""GPU busy fraction 0..1 over a recent window (absent without a GPU)."""

# --- tracekit: stage spans ------------------------------------------------------
STAGE: Final = "tracekit.stage"
"""Serving stage this span (and its descendants) belongs to."""
TIME_KIND: Final = "tracekit.time_kind"
"""``wait`` or ``compute``: what kind of time the stage spends."""
CPU_TIME_NS: Final = "tracekit.cpu_time_ns"
"""CPU time the stage's thread used, when one thread ran the whole stage."""
GPU_TIME_NS: Final = "tracekit.gpu_time_ns"
"""Device time between CUDA events around the stage."""
GPU_SYNC: Final = "tracekit.gpu.sync"
"""How device time was taken: ``event``, ``device`` or ``none``."""
CACHE_HIT: Final = "tracekit.cache.hit"
"""Feature retrieval: whether the lookup was served from cache."""
BATCH_ID: Final = "tracekit.batch.id"
"""batch_queue / model_execute: id of the batch this request joined."""
BATCH_SIZE: Final = "tracekit.batch.size"
"""batch_queue / model_execute: number of requests in that batch."""
QUEUE_FILL_WAIT_NS: Final = "tracekit.queue.fill_wait_ns"
"""batch_queue: time spent waiting for the batch to fill."""
QUEUE_WORKER_WAIT_NS: Final = "tracekit.queue.worker_wait_ns"
"""batch_queue: time spent waiting for a free worker once the batch closed."""
BATCH_REQUEST_COUNT: Final = "tracekit.batch.request_count"
"""Batch span: number of member requests (each linked from the batch span)."""
SAMPLE_WEIGHT: Final = "tracekit.sample.weight"
"""Adjusted count when a sampler kept 1 in N (1 when absent)."""

# --- stage names ------------------------------------------------------------------
FEATURE_RETRIEVAL: Final = "feature_retrieval"
"""Fetching features (feature store, cache, embeddings)."""
PREPROCESS: Final = "preprocess"
"""Turning the request into model input (tokenising, tensor building)."""
BATCH_QUEUE: Final = "batch_queue"
"""Waiting in the dynamic batcher: for the batch to fill, then for a worker."""
MODEL_EXECUTE: Final = "model_execute"
"""Running the model (each request is charged its batch's whole execution)."""
POSTPROCESS: Final = "postprocess"
"""Turning model output into the response."""
DOWNSTREAM: Final = "downstream"
"""Calls to other services (HTTP, RPC); their own spans count here too."""
UNATTRIBUTED: Final = "unattributed"
"""Analysis only: time on the critical path inside the request but in no stage."""

QUEUE: Final = "queue"
"""LLM serving: waiting in the engine's scheduler queue (admitted to no batch yet)."""
PREFILL: Final = "prefill"
"""LLM serving: the forward pass over the prompt that yields the first output token."""
DECODE: Final = "decode"
"""LLM serving: generating the output tokens after the first one."""
LLM_STAGES: Final = (QUEUE, PREFILL, DECODE)
"""Stages of a token-streaming request (docs/llm.md), in request order."""

STAGES: Final = (FEATURE_RETRIEVAL, PREPROCESS, BATCH_QUEUE, MODEL_EXECUTE, POSTPROCESS, DOWNSTREAM)
"""The built-in stages in request order; users may add their own names."""

# --- time kinds -------------------------------------------------------------------


class TimeKind(StrEnum):
    """What kind of time a stage is; a ``str``, so it is written and compared as one."""

    WAIT = "wait"
    """Time spent waiting on something else (I/O, a queue, another service)."""
    COMPUTE = "compute"
    """Time spent computing on this process's CPU or its device."""
    HIDDEN_WAIT = "hidden_wait"
    """Analysis only: a compute stage whose wall time grew while its CPU/GPU time did not."""


WAIT: Final = TimeKind.WAIT
"""Time spent waiting on something else (I/O, a queue, another service)."""
COMPUTE: Final = TimeKind.COMPUTE
"""Time spent computing on this process's CPU or its device."""
HIDDEN_WAIT: Final = TimeKind.HIDDEN_WAIT
"""Analysis only: a compute stage whose wall time grew while its CPU/GPU time did not."""
TIME_KINDS: Final = (WAIT, COMPUTE)
"""Values ``tracekit.time_kind`` may take on a span."""

DEFAULT_TIME_KIND: Final[dict[str, str]] = {
    FEATURE_RETRIEVAL: WAIT,
    PREPROCESS: COMPUTE,
    BATCH_QUEUE: WAIT,
    MODEL_EXECUTE: COMPUTE,
    POSTPROCESS: COMPUTE,
    DOWNSTREAM: WAIT,
    QUEUE: WAIT,
    PREFILL: COMPUTE,
    DECODE: COMPUTE,
    # Time on the path in no stage carries no evidence of computing; in an async server
    # it is mostly the event loop or the framework between stages.
    UNATTRIBUTED: WAIT,
}
"""Default ``time_kind`` per built-in stage (and ``unattributed``); user stages default
to ``compute``."""

# --- gpu sync modes ---------------------------------------------------------------
SYNC_EVENT: Final = "event"
"""CUDA events around the work; wait only for this work's end event."""
SYNC_DEVICE: Final = "device"
"""``torch.cuda.synchronize()`` after the work: waits for all queued device work."""
SYNC_NONE: Final = "none"
"""No device time taken (CPU-only, or timing deliberately skipped)."""

# --- span names the instrumentation writes ---------------------------------------
BATCH_SPAN_NAME: Final = "tracekit.batch"
"""Name of the span that covers one batch execution and links to its member requests."""


def default_time_kind(stage: str) -> str:
    """The ``time_kind`` a stage gets when the span does not say."""
    return DEFAULT_TIME_KIND.get(stage, COMPUTE)


def order_stages(names: set[str] | list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """Built-in stages in request order, then others alphabetically, then unattributed."""
    names = set(names)
    known = (*STAGES, *LLM_STAGES)
    builtin = [s for s in known if s in names]
    others = sorted(s for s in names if s not in known and s != UNATTRIBUTED)
    tail = [UNATTRIBUTED] if UNATTRIBUTED in names else []
    return tuple(builtin + others + tail)


# --- LLM serving (docs/llm.md) -------------------------------------------------------
# Attribute names exactly as vLLM's tracing writes them on its ``llm_request`` span
# (``vllm/tracing.py``, ``SpanAttributes``); latencies are in seconds (floats).
GEN_AI_LATENCY_TIME_IN_QUEUE: Final = "gen_ai.latency.time_in_queue"
GEN_AI_LATENCY_TIME_TO_FIRST_TOKEN: Final = "gen_ai.latency.time_to_first_token"
GEN_AI_LATENCY_E2E: Final = "gen_ai.latency.e2e"
GEN_AI_LATENCY_TIME_IN_SCHEDULER: Final = "gen_ai.latency.time_in_scheduler"
GEN_AI_LATENCY_TIME_IN_MODEL_PREFILL: Final = "gen_ai.latency.time_in_model_prefill"
GEN_AI_LATENCY_TIME_IN_MODEL_DECODE: Final = "gen_ai.latency.time_in_model_decode"
GEN_AI_LATENCY_TIME_IN_MODEL_INFERENCE: Final = "gen_ai.latency.time_in_model_inference"
GEN_AI_LATENCY_TIME_IN_MODEL_FORWARD: Final = "gen_ai.latency.time_in_model_forward"
GEN_AI_LATENCY_TIME_IN_MODEL_EXECUTE: Final = "gen_ai.latency.time_in_model_execute"
GEN_AI_USAGE_PROMPT_TOKENS: Final = "gen_ai.usage.prompt_tokens"
GEN_AI_USAGE_COMPLETION_TOKENS: Final = "gen_ai.usage.completion_tokens"
GEN_AI_USAGE_INPUT_TOKENS: Final = "gen_ai.usage.input_tokens"
"""The newer GenAI semantic-convention name of the prompt token count."""
GEN_AI_USAGE_OUTPUT_TOKENS: Final = "gen_ai.usage.output_tokens"
"""The newer GenAI semantic-convention name of the completion token count."""
GEN_AI_REQUEST_MAX_TOKENS: Final = "gen_ai.request.max_tokens"
GEN_AI_REQUEST_N: Final = "gen_ai.request.n"
GEN_AI_REQUEST_ID: Final = "gen_ai.request.id"
GEN_AI_RESPONSE_MODEL: Final = "gen_ai.response.model"
GEN_AI_SERVER_TTFT_METRIC: Final = "gen_ai.server.time_to_first_token"
"""GenAI metric (histogram, seconds): time to generate the first output token."""
GEN_AI_SERVER_TPOT_METRIC: Final = "gen_ai.server.time_per_output_token"
"""GenAI metric (histogram, seconds): time per output token after the first."""
GEN_AI_SERVER_DURATION_METRIC: Final = "gen_ai.server.request.duration"
"""GenAI metric (histogram, seconds): time from the request's arrival to its last token."""
STAGE_DERIVED: Final = "tracekit.stage.derived"
"""On a stage span tracekit synthesised at ingest: where it came from (``attributes``:
an engine's latency attributes, not a span it wrote)."""
DERIVED_FROM_ATTRIBUTES: Final = "attributes"
"""Value of :data:`STAGE_DERIVED` for stages built from an engine's latency attributes."""
GENERATION_SPAN_NAME: Final = "tracekit.generation"
"""The span ``tracekit.generation()`` starts for itself when no request SERVER span is current."""
GENERATION_FIRST_TOKEN_NS: Final = "tracekit.generation.first_token_ns"
"""tracekit's own generation span: Unix ns of the first output token."""

# --- profile on trigger (docs/profiling.md) -----------------------------------------
PROFILE_ID: Final = "tracekit.profile.id"
"""On a stage span that ran under a triggered ``torch.profiler`` capture: the capture's id
(16 hex digits), which the profile file's ``tracekit`` metadata carries too."""
PROFILE_METADATA_KEY: Final = "tracekit"
"""Top-level key of a capture's Kineto trace file holding tracekit's metadata: ``{profile_id,
service, service_version, instance_id, pid, reason, trigger {trace_id, span_id, stage,
duration_ms, rule}, captured [{trace_id, span_id, stage, start_ns, end_ns}]}``."""
PROFILE_FILE_PREFIX: Final = "tracekit-profile-"
"""Capture files are ``tracekit-profile-<service>-<pid>-<n>-<profile_id>.pt.trace.json``."""
PROFILE_MISSED: Final = "missed"
"""Capture metadata key: slow executions (above a rule's threshold) it did not capture, <= 100."""
PROFILE_MISSED_COUNT: Final = "missed_count"
"""Key of a capture's metadata: how many slow executions it did not capture, all of them."""

# --- training steps (docs/design.md, "Training steps") ----------------------------------
RANK: Final = "tracekit.rank"
"""This process's rank in the training job (resource; also written on each step span)."""
WORLD_SIZE: Final = "tracekit.world_size"
"""Number of ranks in the training job (resource; also on each step span)."""
LOCAL_RANK: Final = "tracekit.local_rank"
"""This process's rank on its host (resource; also on each step span)."""
STEP: Final = "tracekit.step"
"""Step span: step index, the same on every rank."""
STEP_SAMPLES: Final = "tracekit.step.samples"
"""Step span: samples this rank processed in the step."""
STEP_TOKENS: Final = "tracekit.step.tokens"
"""Step span: tokens this rank processed in the step."""
COMM_OP: Final = "tracekit.comm.op"
"""Communication span: the collective (``all_reduce``, ``all_gather``…)."""
COMM_BYTES: Final = "tracekit.comm.bytes"
"""Communication span: payload bytes of the collective (or DDP bucket)."""
COMM_GROUP: Final = "tracekit.comm.group"
"""Communication span: the process group the collective ran in."""
COMM_SEQ: Final = "tracekit.comm.seq"
"""Communication span: collective number within its group, equal on every rank."""
COMM_ASYNC: Final = "tracekit.comm.async"
"""Communication span: launched in the background while its stage kept computing (a DDP
bucket); only its part after the stage's last launch can be exposed."""
COMM_BACKEND: Final = "tracekit.comm.backend"
"""Communication span: ``nccl``, ``gloo``…; says whether the span is device or host time."""
COMM_GROUP_SIZE: Final = "tracekit.comm.group_size"
"""Communication span: ranks in the collective's process group (the ``n`` of the bus
bandwidth factors)."""
COMM_GROUP_DESC: Final = "tracekit.comm.group_desc"
"""Communication span: the process group's description where one was given
(``torch.distributed.new_group(group_desc=...)``, Kineto's ``Process Group
Description``): ``default_pg``, ``dp``, ``tp``, ``fsdp_shard``…"""
LINK_GBPS: Final = "tracekit.link.gbps"
"""Resource: the peak rate of the rank's network link in Gb/s, as links are sold
(``OTEL_RESOURCE_ATTRIBUTES=tracekit.link.gbps=400``); ``--link-gbps`` overrides it."""

STEP_SPAN_NAME: Final = "train_step"
"""Name of the root span of one training step on one rank."""
COMM_SPAN_NAME: Final = "tracekit.comm"
"""Name prefix of communication spans (``tracekit.comm all_reduce``)."""

DATA_WAIT: Final = "data_wait"
"""Training: blocked on the data loader for the step's batch."""
FORWARD: Final = "forward"
"""Training: the forward pass."""
BACKWARD: Final = "backward"
"""Training: the backward pass (DDP buckets launch under it)."""
OPTIMIZER: Final = "optimizer"
"""Training: the optimizer step and zeroing gradients."""
COMMUNICATION: Final = "communication"
"""Training: a collective; on the critical path only where exposed."""

TRAINING_STAGES: Final = (DATA_WAIT, FORWARD, BACKWARD, OPTIMIZER, COMMUNICATION)
"""The built-in training stages in step order."""
DEFAULT_TIME_KIND.update(
    {DATA_WAIT: WAIT, FORWARD: COMPUTE, BACKWARD: COMPUTE, OPTIMIZER: COMPUTE, COMMUNICATION: WAIT}
)

# --- metrics the instrumentation exports (configure(metrics=...)) ------------------
METRIC_HTTP_SERVER_DURATION: Final = "http.server.request.duration"
"""OTel semconv histogram of request durations in seconds, by ``http.route``."""
METRIC_STAGE_DURATION: Final = "tracekit.stage.duration"
"""Histogram of stage wall time in seconds, by ``tracekit.stage`` and ``tracekit.time_kind``."""
METRIC_INFLIGHT: Final = "tracekit.inflight"
"""Gauge: requests the process is serving now (the audit's in-flight signal)."""
METRIC_QUEUE_DEPTH: Final = "tracekit.queue.depth"
"""Gauge: requests waiting in the process's batch queues now."""
METRIC_BATCH_SIZE: Final = "tracekit.batch.size"
"""Histogram of requests per executed batch."""
