-- +goose Up
-- The simulator's machines and network rules live next to the clusters, so
-- they outlive a server crash and a restarted server sees them.
CREATE TABLE machines (
    id                 VARCHAR(36)  NOT NULL PRIMARY KEY,
    -- The cluster the machine belongs to; '' for a free (EXTERNAL) machine.
    cluster_id         VARCHAR(36)  NOT NULL DEFAULT '',
    role               VARCHAR(16)  NOT NULL,
    power              VARCHAR(16)  NOT NULL,
    joined             BOOLEAN      NOT NULL DEFAULT FALSE,
    cordoned           BOOLEAN      NOT NULL DEFAULT FALSE,
    kubernetes_version VARCHAR(32)  NOT NULL DEFAULT '',
    attached_iso       VARCHAR(255) NOT NULL DEFAULT '',
    offering           VARCHAR(64)  NOT NULL DEFAULT '',
    create_time        DATETIME     NOT NULL,
    update_time        DATETIME     NOT NULL
);

CREATE TABLE network_rules (
    id         INTEGER      NOT NULL PRIMARY KEY AUTOINCREMENT,
    cluster_id VARCHAR(36)  NOT NULL,
    machine_id VARCHAR(36)  NOT NULL,
    kind       VARCHAR(16)  NOT NULL,
    port       INT          NOT NULL
);

CREATE INDEX machines_cluster ON machines (cluster_id, id);
CREATE UNIQUE INDEX network_rules_rule ON network_rules (cluster_id, machine_id, kind, port);
CREATE INDEX network_rules_machine ON network_rules (machine_id);

-- +goose Down
DROP TABLE network_rules;
DROP TABLE machines;
