-- +goose Up
-- Jobs record the account of the cluster they act on, so operations can be
-- listed per account and request ids (AIP-155) are keys per account; the
-- request hash lets a reused request id with other parameters be refused.
ALTER TABLE jobs
    ADD COLUMN IF NOT EXISTS account VARCHAR(63) NOT NULL DEFAULT '' AFTER kind,
    ADD COLUMN IF NOT EXISTS request_hash VARCHAR(64) NOT NULL DEFAULT '' AFTER request_id;
UPDATE jobs j JOIN clusters c ON c.id = j.resource_id SET j.account = c.account;
ALTER TABLE jobs
    DROP INDEX IF EXISTS jobs_request_id,
    ADD UNIQUE KEY IF NOT EXISTS jobs_account_request_id (account, request_id),
    ADD KEY IF NOT EXISTS jobs_account_id (account, id);
ALTER TABLE clusters ADD KEY IF NOT EXISTS clusters_account_id (account, id);

-- +goose Down
ALTER TABLE clusters DROP KEY clusters_account_id;
ALTER TABLE jobs
    DROP KEY jobs_account_id,
    DROP KEY jobs_account_request_id,
    ADD UNIQUE KEY jobs_request_id (request_id);
ALTER TABLE jobs DROP COLUMN request_hash, DROP COLUMN account;
