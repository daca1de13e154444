-- +goose Up
-- Every scanner pass lists the owners of the jobs in progress and asks
-- whether any of them handed a job off (Store.InProgressOwners), so that
-- it reads the jobs themselves only when one may be adopted or failed.
-- With handed_off after the owner in the index both are seeks, never a
-- walk of the jobs in progress; it replaces (status, server_id,
-- server_incarnation), its prefix, so a job's writes keep as many indexes
-- as before. A server of the previous release names no index: it runs on
-- this schema unchanged.
CREATE INDEX IF NOT EXISTS jobs_status_owner ON jobs (status, server_id, server_incarnation, handed_off);
DROP INDEX IF EXISTS jobs_status_server_incarnation;

-- +goose Down
CREATE INDEX IF NOT EXISTS jobs_status_server_incarnation ON jobs (status, server_id, server_incarnation);
DROP INDEX IF EXISTS jobs_status_owner;
