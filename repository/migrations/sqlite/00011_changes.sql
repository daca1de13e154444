-- +goose Up
-- The change feed that WatchClusters and WatchOperation read (see
-- repository/changes.go and the MySQL migration of the same number). time
-- is the database's clock at insert, strftime('%Y-%m-%d %H:%M:%f', 'now')
-- in UTC, so it compares as text.
CREATE TABLE cluster_changes (
    id                INTEGER      NOT NULL PRIMARY KEY AUTOINCREMENT,
    cluster_id        VARCHAR(36)  NOT NULL,
    account           VARCHAR(255) NOT NULL,
    operation         VARCHAR(36)  NOT NULL DEFAULT '',
    kind              VARCHAR(16)  NOT NULL,
    time              TEXT         NOT NULL,
    state             VARCHAR(32)  NOT NULL DEFAULT '',
    version           BIGINT       NOT NULL DEFAULT 0,
    current_operation VARCHAR(36)  NOT NULL DEFAULT '',
    event_id          BIGINT       NULL,
    step              VARCHAR(64)  NOT NULL DEFAULT '',
    steps_done        INT          NOT NULL DEFAULT 0,
    steps_total       INT          NOT NULL DEFAULT 0,
    status            VARCHAR(16)  NOT NULL DEFAULT ''
);
CREATE INDEX cluster_changes_time ON cluster_changes (time);

CREATE TABLE cluster_changes_purged (
    id     INTEGER NOT NULL PRIMARY KEY,
    max_id BIGINT  NOT NULL
);

-- +goose Down
DROP TABLE cluster_changes_purged;
DROP TABLE cluster_changes;
