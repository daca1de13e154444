-- +goose Up
-- Jobs record the account of the cluster they act on, so operations can be
-- listed per account and request ids (AIP-155) are keys per account; the
-- request hash lets a reused request id with other parameters be refused.
ALTER TABLE jobs ADD COLUMN account VARCHAR(63) NOT NULL DEFAULT '';
ALTER TABLE jobs ADD COLUMN request_hash VARCHAR(64) NOT NULL DEFAULT '';
UPDATE jobs SET account = COALESCE((SELECT c.account FROM clusters c WHERE c.id = jobs.resource_id), '');
DROP INDEX jobs_request_id;
CREATE UNIQUE INDEX jobs_account_request_id ON jobs (account, request_id);
CREATE INDEX jobs_account_id ON jobs (account, id);
CREATE INDEX clusters_account_id ON clusters (account, id);

-- +goose Down
DROP INDEX clusters_account_id;
DROP INDEX jobs_account_id;
DROP INDEX jobs_account_request_id;
CREATE UNIQUE INDEX jobs_request_id ON jobs (request_id);
ALTER TABLE jobs DROP COLUMN request_hash;
ALTER TABLE jobs DROP COLUMN account;
