-- +goose Up
-- Every scanner pass asks whether any job in progress is handed off
-- (Store.InProgressOwners), so that one is adopted at once: with
-- (status, handed_off) that is a seek, rather than a walk of every job in
-- progress. Only an index is added, so a server of the previous release
-- runs on this schema unchanged.
ALTER TABLE jobs ADD KEY IF NOT EXISTS jobs_status_handed_off (status, handed_off);

-- +goose Down
ALTER TABLE jobs DROP KEY IF EXISTS jobs_status_handed_off;
