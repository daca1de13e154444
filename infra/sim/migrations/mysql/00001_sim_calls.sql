-- +goose Up
-- clusterd's own migrations 4, 5 and 7 created this table, with this very
-- schema, before the simulator owned it; they stay for the databases they
-- made, whose log is kept. On those this migration changes nothing.
-- The simulator's fencing log: one row per infrastructure call, accepted or
-- refused. An accepted call's row is written in the same transaction as its
-- machine writes and its guard (the job still holds the cluster); a refused
-- call's row just after the refusal. last_event_id is the id of the
-- cluster's latest history entry at that moment (read under the cluster's
-- row lock for an accepted call), so a checker can replay the history up to
-- it and see who held the cluster when the call changed something. attempt
-- and server say which attempt of the job made the call, and on which
-- server, so a checker can see that no call of an earlier attempt went
-- through after an adoption. It is purged with the jobs it records, oldest
-- first by time.
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
    attempt       INT          NOT NULL DEFAULT 0,
    server        VARCHAR(255) NOT NULL DEFAULT '',
    KEY sim_calls_cluster (cluster_id, id),
    KEY sim_calls_time (time)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- +goose Down
DROP TABLE sim_calls;
