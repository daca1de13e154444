-- +goose Up
-- The catalog: the Kubernetes versions clusters may run and the
-- service offerings (machine sizes) their nodes may have, as resources an
-- admin manages rather than flags. claims counts the claims (creates,
-- upgrades, scales) that took the row: every such claim writes it in its
-- transaction, and a delete writes it first (see the MySQL migration).
CREATE TABLE kubernetes_versions (
    version       VARCHAR(32)  NOT NULL PRIMARY KEY,
    state         VARCHAR(16)  NOT NULL,
    min_cpus      INT          NOT NULL DEFAULT 0,
    min_memory_mb INT          NOT NULL DEFAULT 0,
    binaries_iso  VARCHAR(255) NOT NULL DEFAULT '',
    claims        BIGINT       NOT NULL DEFAULT 0,
    create_time   DATETIME     NOT NULL,
    update_time   DATETIME     NOT NULL
);

CREATE TABLE service_offerings (
    name        VARCHAR(64)  NOT NULL PRIMARY KEY,
    cpus        INT          NOT NULL,
    memory_mb   INT          NOT NULL,
    description TEXT         NOT NULL,
    state       VARCHAR(16)  NOT NULL,
    claims      BIGINT       NOT NULL DEFAULT 0,
    create_time DATETIME     NOT NULL,
    update_time DATETIME     NOT NULL
);

-- The control nodes' offering; '' means the cluster's service_offering (the
-- workers'). The indexes find a version's or an offering's users (live
-- clusters: alive = 1) when it is deleted.
ALTER TABLE clusters ADD COLUMN control_offering VARCHAR(64) NOT NULL DEFAULT '';
CREATE INDEX clusters_kubernetes_version ON clusters (kubernetes_version, alive);
CREATE INDEX clusters_service_offering ON clusters (service_offering, alive);
CREATE INDEX clusters_control_offering ON clusters (control_offering, alive);

-- The version (an upgrade's) or offering (a scale's) a running job moves its
-- cluster to, which the cluster row does not name until the job ends.
ALTER TABLE jobs ADD COLUMN target_version VARCHAR(32) NULL;
ALTER TABLE jobs ADD COLUMN target_offering VARCHAR(64) NULL;
CREATE INDEX jobs_target_version ON jobs (target_version, status);
CREATE INDEX jobs_target_offering ON jobs (target_offering, status);

-- +goose Down
DROP INDEX jobs_target_offering;
DROP INDEX jobs_target_version;
ALTER TABLE jobs DROP COLUMN target_offering;
ALTER TABLE jobs DROP COLUMN target_version;
DROP INDEX clusters_control_offering;
DROP INDEX clusters_service_offering;
DROP INDEX clusters_kubernetes_version;
ALTER TABLE clusters DROP COLUMN control_offering;
DROP TABLE service_offerings;
DROP TABLE kubernetes_versions;
