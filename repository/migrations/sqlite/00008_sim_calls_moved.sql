-- +goose Up
-- The simulator's fencing log is the simulator's own table now, created by
-- its own migrations (package infra/sim, version table goose_sim_version)
-- after these: clusterd's schema no longer has it. The entries of an
-- existing log go with it (they are purged after the job retention anyway).
DROP TABLE sim_calls;

-- +goose Down
CREATE TABLE sim_calls (
    id            INTEGER      NOT NULL PRIMARY KEY AUTOINCREMENT,
    time          DATETIME     NOT NULL,
    cluster_id    VARCHAR(36)  NOT NULL,
    job_id        VARCHAR(36)  NOT NULL,
    step          VARCHAR(64)  NOT NULL,
    machine_id    VARCHAR(36)  NOT NULL DEFAULT '',
    last_event_id BIGINT       NOT NULL DEFAULT 0,
    refused       BOOLEAN      NOT NULL DEFAULT FALSE,
    reason        VARCHAR(255) NOT NULL DEFAULT '',
    attempt       INT          NOT NULL DEFAULT 0,
    server        VARCHAR(255) NOT NULL DEFAULT ''
);
CREATE INDEX sim_calls_cluster ON sim_calls (cluster_id, id);
CREATE INDEX sim_calls_time ON sim_calls (time);
