-- +goose Up
-- The change feed that WatchClusters and WatchOperation read (see
-- repository/changes.go): append-only, one row written in the same
-- transaction as each change a watcher must see (a cluster's history entry:
-- create, transition, end, adoption, hand-off, repair; a job's progress; a
-- job's end). id orders the feed, but ids commit out of order (and Galera
-- interleaves them across nodes): readers settle on time, the database's
-- NOW(6) at insert. state, version and current_operation are the cluster's
-- as the change left it; step, steps_done, steps_total and status the job's.
-- event_id is the history entry the change wrote, if any.
CREATE TABLE IF NOT EXISTS cluster_changes (
    id                BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    cluster_id        VARCHAR(36)  NOT NULL,
    account           VARCHAR(255) NOT NULL,
    operation         VARCHAR(36)  NOT NULL DEFAULT '',
    kind              VARCHAR(16)  NOT NULL,
    time              DATETIME(6)  NOT NULL,
    state             VARCHAR(32)  NOT NULL DEFAULT '',
    version           BIGINT       NOT NULL DEFAULT 0,
    current_operation VARCHAR(36)  NOT NULL DEFAULT '',
    event_id          BIGINT       NULL,
    step              VARCHAR(64)  NOT NULL DEFAULT '',
    steps_done        INT          NOT NULL DEFAULT 0,
    steps_total       INT          NOT NULL DEFAULT 0,
    status            VARCHAR(16)  NOT NULL DEFAULT '',
    KEY cluster_changes_time (time)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- The highest id a purge deleted: a resume token whose floor is below it may
-- have missed purged rows, and is refused (WATCH_EXPIRED). One row, id 1.
CREATE TABLE IF NOT EXISTS cluster_changes_purged (
    id     INT    NOT NULL PRIMARY KEY,
    max_id BIGINT NOT NULL
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- +goose Down
DROP TABLE IF EXISTS cluster_changes_purged;
DROP TABLE IF EXISTS cluster_changes;
