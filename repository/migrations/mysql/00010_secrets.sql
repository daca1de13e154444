-- +goose Up
-- A cluster's secrets (its CA, its admin client certificate), sealed by the
-- service (package secrets: AES-256-GCM, the additional data binding the
-- cluster id and the kind) before they reach this table: no key is stored in
-- the clear. key_id names the key that sealed the row, so rotate-secrets
-- finds the rows to seal again and rewrites each one only if it is still
-- under the key it read (WHERE key_id = old). The rows of a cluster are
-- written with the cluster, in its create transaction, and deleted with the
-- write that makes it DESTROYED.
CREATE TABLE IF NOT EXISTS cluster_secrets (
    cluster_id  VARCHAR(36)    NOT NULL,
    kind        VARCHAR(32)    NOT NULL,
    key_id      VARCHAR(64)    NOT NULL,
    nonce       VARBINARY(32)  NOT NULL,
    ciphertext  BLOB           NOT NULL,
    update_time DATETIME(6)    NOT NULL,
    PRIMARY KEY (cluster_id, kind)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- +goose Down
DROP TABLE IF EXISTS cluster_secrets;
