-- +goose Up
-- The simulator's fencing log is purged with the jobs it records, after the
-- job retention period: oldest first by time, so nothing is sorted and
-- nothing is read when no entry is old enough.
CREATE INDEX sim_calls_time ON sim_calls (time);

-- +goose Down
DROP INDEX sim_calls_time;
