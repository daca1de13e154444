-- +goose Up
-- Indexes for the scanner's passes (issue 10): every query of a pass reads
-- only what it acts on.
-- Orphans not held by any operation: (state, current_operation) finds the
-- unheld clusters of the operation states by point lookups; it also serves
-- every query on the state alone, so it replaces clusters_state.
CREATE INDEX clusters_state_operation ON clusters (state, current_operation);
DROP INDEX clusters_state;
-- Reconciliation looks only at clusters and machines that changed since its
-- last pass.
CREATE INDEX clusters_update_time ON clusters (update_time);
CREATE INDEX machines_update_time ON machines (update_time);
-- Purging walks finished jobs oldest first by their end time alone: no sort,
-- and nothing read when nothing is old enough. It replaces (status,
-- end_time), whose status <> IN_PROGRESS range needed a sort.
CREATE INDEX jobs_end_time ON jobs (end_time);
DROP INDEX jobs_status_end;
-- Liveness checks every running job's server and incarnation each pass:
-- with the incarnation in the index it reads index entries only, never the
-- jobs' rows (and a server's own jobs are one point lookup).
CREATE INDEX jobs_status_server_incarnation ON jobs (status, server_id, server_incarnation);
DROP INDEX jobs_status_server;

-- +goose Down
CREATE INDEX jobs_status_server ON jobs (status, server_id);
DROP INDEX jobs_status_server_incarnation;
CREATE INDEX jobs_status_end ON jobs (status, end_time);
DROP INDEX jobs_end_time;
DROP INDEX machines_update_time;
DROP INDEX clusters_update_time;
CREATE INDEX clusters_state ON clusters (state);
DROP INDEX clusters_state_operation;
