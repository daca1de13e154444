-- +goose Up
CREATE TABLE IF NOT EXISTS clusters (
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
    create_time         DATETIME(6)  NOT NULL,
    update_time         DATETIME(6)  NOT NULL,
    delete_time         DATETIME(6)  NULL,
    UNIQUE KEY clusters_account_name (account, display_name, alive),
    KEY clusters_state (state),
    KEY clusters_current_operation (current_operation)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE IF NOT EXISTS jobs (
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
    deadline           DATETIME(6)  NOT NULL,
    create_time        DATETIME(6)  NOT NULL,
    update_time        DATETIME(6)  NOT NULL,
    end_time           DATETIME(6)  NULL,
    UNIQUE KEY jobs_request_id (request_id),
    KEY jobs_resource_status (resource_id, status),
    KEY jobs_status_server (status, server_id),
    KEY jobs_status_end (status, end_time)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE IF NOT EXISTS cluster_events (
    id          BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    cluster_id  VARCHAR(36)  NOT NULL,
    time        DATETIME(6)  NOT NULL,
    from_state  VARCHAR(32)  NOT NULL,
    event       VARCHAR(64)  NOT NULL,
    to_state    VARCHAR(32)  NOT NULL,
    operation   VARCHAR(36)  NOT NULL DEFAULT '',
    server      VARCHAR(255) NOT NULL DEFAULT '',
    message     TEXT         NOT NULL,
    KEY cluster_events_cluster (cluster_id, id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE IF NOT EXISTS servers (
    id             VARCHAR(255) NOT NULL PRIMARY KEY,
    incarnation    VARCHAR(36)  NOT NULL,
    start_time     DATETIME(6)  NOT NULL,
    heartbeat_time DATETIME(6)  NOT NULL
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- +goose Down
DROP TABLE servers;
DROP TABLE cluster_events;
DROP TABLE jobs;
DROP TABLE clusters;
