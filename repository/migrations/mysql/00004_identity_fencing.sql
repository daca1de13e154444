-- +goose Up
-- Who runs a server id: the host and process id of the incarnation, so a
-- process starting under the same id can tell a predecessor that died on
-- this host (its process is gone: take over at once) from one that may be
-- alive (watch its heartbeat first; refuse to start if it advances).
ALTER TABLE servers
    ADD COLUMN IF NOT EXISTS host VARCHAR(255) NOT NULL DEFAULT '',
    ADD COLUMN IF NOT EXISTS pid  BIGINT       NOT NULL DEFAULT 0;

-- The simulator's fencing log: one row per infrastructure call, accepted or
-- refused, written in the same transaction as the call's machine writes and
-- its check that the job still holds the cluster. last_event_id is the id of
-- the cluster's latest history entry at that moment (read under the
-- cluster's row lock), so a checker can replay the history up to it and see
-- who held the cluster when the call changed something.
CREATE TABLE IF NOT EXISTS sim_calls (
    id            BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    time          DATETIME(6)  NOT NULL,
    cluster_id    VARCHAR(36)  NOT NULL,
    job_id        VARCHAR(36)  NOT NULL,
    step          VARCHAR(64)  NOT NULL,
    machine_id    VARCHAR(36)  NOT NULL DEFAULT '',
    last_event_id BIGINT       NOT NULL DEFAULT 0,
    refused       BOOLEAN      NOT NULL DEFAULT FALSE,
    -- Why a call was refused: the holder found, or the job's status.
    reason        VARCHAR(255) NOT NULL DEFAULT '',
    KEY sim_calls_cluster (cluster_id, id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- +goose Down
DROP TABLE sim_calls;
ALTER TABLE servers DROP COLUMN pid, DROP COLUMN host;
