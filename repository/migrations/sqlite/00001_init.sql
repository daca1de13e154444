-- +goose Up
CREATE TABLE clusters (
    id                  VARCHAR(36)  NOT NULL PRIMARY KEY,
    account             VARCHAR(63)  NOT NULL,
    display_name        VARCHAR(63)  NOT NULL,
    -- 1 while the cluster exists, NULL once destroyed: (account, display_name, alive)
    -- is unique, so a destroyed cluster's name can be taken again.
    alive               TINYINT      NULL DEFAULT 1,
    description         TEXT         NOT NULL,
    state               VARCHAR(32)  NOT NULL,
    version             BIGINT       NOT NULL,
    current_operation   VARCHAR(36)  NOT NULL DEFAULT '',
    kubernetes_version  VARCHAR(32)  NOT NULL,
    control_node_count  INT          NOT NULL,
    worker_node_count   INT          NOT NULL,
    service_offering    VARCHAR(64)  NOT NULL,
    autoscaling_enabled BOOLEAN      NOT NULL DEFAULT FALSE,
    autoscaling_min     INT          NOT NULL DEFAULT 0,
    autoscaling_max     INT          NOT NULL DEFAULT 0,
    endpoint            VARCHAR(255) NOT NULL DEFAULT '',
    create_time         DATETIME     NOT NULL,
    update_time         DATETIME     NOT NULL,
    delete_time         DATETIME     NULL
);

CREATE TABLE jobs (
    id                 VARCHAR(36)  NOT NULL PRIMARY KEY,
    kind               VARCHAR(32)  NOT NULL,
    -- The cluster the job acts on. NULL in rows written by servers that predate it.
    resource_id        VARCHAR(36)  NULL,
    server_id          VARCHAR(255) NOT NULL,
    server_incarnation VARCHAR(36)  NOT NULL DEFAULT '',
    status             VARCHAR(16)  NOT NULL,
    request_id         VARCHAR(128) NULL,
    params             TEXT         NOT NULL,
    result             TEXT         NOT NULL,
    error              TEXT         NOT NULL,
    step               VARCHAR(64)  NOT NULL DEFAULT '',
    steps_done         INT          NOT NULL DEFAULT 0,
    steps_total        INT          NOT NULL DEFAULT 0,
    cancel_requested   BOOLEAN      NOT NULL DEFAULT FALSE,
    deadline           DATETIME     NOT NULL,
    create_time        DATETIME     NOT NULL,
    update_time        DATETIME     NOT NULL,
    end_time           DATETIME     NULL
);

CREATE TABLE cluster_events (
    id          INTEGER      NOT NULL PRIMARY KEY AUTOINCREMENT,
    cluster_id  VARCHAR(36)  NOT NULL,
    time        DATETIME     NOT NULL,
    from_state  VARCHAR(32)  NOT NULL,
    event       VARCHAR(64)  NOT NULL,
    to_state    VARCHAR(32)  NOT NULL,
    operation   VARCHAR(36)  NOT NULL DEFAULT '',
    server      VARCHAR(255) NOT NULL DEFAULT '',
    message     TEXT         NOT NULL
);

CREATE TABLE servers (
    id             VARCHAR(255) NOT NULL PRIMARY KEY,
    incarnation    VARCHAR(36)  NOT NULL,
    start_time     DATETIME     NOT NULL,
    heartbeat_time DATETIME     NOT NULL
);

CREATE UNIQUE INDEX clusters_account_name ON clusters (account, display_name, alive);
CREATE INDEX clusters_state ON clusters (state);
CREATE INDEX clusters_current_operation ON clusters (current_operation);
CREATE UNIQUE INDEX jobs_request_id ON jobs (request_id);
CREATE INDEX jobs_resource_status ON jobs (resource_id, status);
CREATE INDEX jobs_status_server ON jobs (status, server_id);
CREATE INDEX jobs_status_end ON jobs (status, end_time);
CREATE INDEX cluster_events_cluster ON cluster_events (cluster_id, id);

-- +goose Down
DROP TABLE servers;
DROP TABLE cluster_events;
DROP TABLE jobs;
DROP TABLE clusters;
