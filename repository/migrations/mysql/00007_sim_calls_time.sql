-- +goose Up
-- The simulator's fencing log is purged with the jobs it records, after the
-- job retention period: oldest first by time, so nothing is sorted and
-- nothing is read when no entry is old enough.
ALTER TABLE sim_calls ADD KEY IF NOT EXISTS sim_calls_time (time);

-- +goose Down
ALTER TABLE sim_calls DROP KEY sim_calls_time;
