-- GPU time line of PyTorch-profiler (Kineto) ranks, written by tracekit.analysis.ingest.kineto.
-- One row per (run label, rank, step); step = -1 is the rank's whole profile in HTA's window
-- (ops launched before the last ProfilerStep began). Times are integer nanoseconds;
-- definitions (Holistic Trace Analysis's) are in docs/kineto.md.

CREATE TABLE IF NOT EXISTS kineto_gpu (
    run_label         VARCHAR NOT NULL,   -- --version of the ingest ('' when none)
    rank              INTEGER NOT NULL,
    step              BIGINT NOT NULL,    -- ProfilerStep#N, or -1 for the whole rank
    world_size        INTEGER,
    source            VARCHAR,            -- the rank file
    kernels           BIGINT NOT NULL,    -- device ops (kernels, memcpy, memset) counted
    window_ns         BIGINT NOT NULL,    -- first op start to last op end
    busy_ns           BIGINT NOT NULL,    -- union of all ops
    idle_ns           BIGINT NOT NULL,    -- window - busy
    compute_ns        BIGINT NOT NULL,    -- union of compute kernels
    non_compute_ns    BIGINT NOT NULL,    -- busy - compute
    comm_ns           BIGINT NOT NULL,    -- union of communication kernels
    overlap_ns        BIGINT NOT NULL,    -- communication while a compute kernel runs
    exposed_comm_ns   BIGINT NOT NULL,    -- comm - overlap
    host_wait_ns      BIGINT NOT NULL,    -- per-stream idle gaps: the host launched late
    kernel_wait_ns    BIGINT NOT NULL,    --   gaps under 30 us between launched ops
    other_idle_ns     BIGINT NOT NULL,    --   the rest
    kernel_compute_ns BIGINT NOT NULL,    -- summed durations by kernel type
    kernel_comm_ns    BIGINT NOT NULL,
    kernel_memory_ns  BIGINT NOT NULL,
    kernel_other_ns   BIGINT NOT NULL,
    PRIMARY KEY (run_label, rank, step)
);
