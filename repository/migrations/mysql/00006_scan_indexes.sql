-- +goose Up
-- Indexes for the scanner's passes (issue 10): every query of a pass reads
-- only what it acts on.
-- Orphans not held by any operation: (state, current_operation) finds the
-- unheld clusters of the operation states by point lookups; it also serves
-- every query on the state alone, so it replaces clusters_state.
-- Reconciliation looks only at clusters and machines that changed since its
-- last pass (update_time).
ALTER TABLE clusters
    ADD KEY IF NOT EXISTS clusters_state_operation (state, current_operation),
    DROP KEY IF EXISTS clusters_state,
    ADD KEY IF NOT EXISTS clusters_update_time (update_time);
ALTER TABLE machines ADD KEY IF NOT EXISTS machines_update_time (update_time);
-- Purging walks finished jobs oldest first by their end time alone: no
-- filesort, and nothing read when nothing is old enough. It replaces
-- (status, end_time), whose status <> IN_PROGRESS range needed a filesort.
-- Liveness checks every running job's server and incarnation each pass:
-- with the incarnation in the index it reads index entries only, never the
-- jobs' rows (and a server's own jobs are one point lookup).
ALTER TABLE jobs
    ADD KEY IF NOT EXISTS jobs_end_time (end_time),
    DROP KEY IF EXISTS jobs_status_end,
    ADD KEY IF NOT EXISTS jobs_status_server_incarnation (status, server_id, server_incarnation),
    DROP KEY IF EXISTS jobs_status_server;

-- +goose Down
ALTER TABLE jobs
    ADD KEY jobs_status_end (status, end_time),
    DROP KEY jobs_end_time,
    ADD KEY jobs_status_server (status, server_id),
    DROP KEY jobs_status_server_incarnation;
ALTER TABLE machines DROP KEY machines_update_time;
ALTER TABLE clusters
    ADD KEY clusters_state (state),
    DROP KEY clusters_state_operation,
    DROP KEY clusters_update_time;
