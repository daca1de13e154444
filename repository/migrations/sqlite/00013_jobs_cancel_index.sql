-- +goose Up
-- A runner asks every heartbeat which of its running jobs have a
-- cancellation requested (runner.Config.WatchCancels): with
-- (status, cancel_requested) that is a range over the cancelled jobs in
-- progress, which are few, rather than a lookup of every running job.
-- Only an index is added, so a server of the previous release runs on
-- this schema unchanged.
CREATE INDEX IF NOT EXISTS jobs_status_cancel ON jobs (status, cancel_requested);

-- +goose Down
DROP INDEX IF EXISTS jobs_status_cancel;
