-- +goose Up
-- The simulator's machines and network rules live next to the clusters, so
-- they outlive a server crash and a restarted server sees them.
CREATE TABLE IF NOT EXISTS machines (
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
    create_time        DATETIME(6)  NOT NULL,
    update_time        DATETIME(6)  NOT NULL,
    KEY machines_cluster (cluster_id, id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE IF NOT EXISTS network_rules (
    id         BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    cluster_id VARCHAR(36)  NOT NULL,
    machine_id VARCHAR(36)  NOT NULL,
    kind       VARCHAR(16)  NOT NULL,
    port       INT          NOT NULL,
    -- Its leading cluster_id also serves listing a cluster's rules.
    UNIQUE KEY network_rules_rule (cluster_id, machine_id, kind, port),
    -- Deleting a machine deletes its rules; without this index InnoDB would
    -- scan, and lock, every cluster's rules to do it.
    KEY network_rules_machine (machine_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- +goose Down
DROP TABLE network_rules;
DROP TABLE machines;
