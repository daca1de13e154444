-- +goose Up
-- The catalog: the Kubernetes versions clusters may run and the
-- service offerings (machine sizes) their nodes may have, as resources an
-- admin manages rather than flags. claims counts the claims (creates,
-- upgrades, scales) that took the row: every such claim writes it in its
-- transaction, and a delete writes it first, so on Galera, which certifies
-- written rows only, a claim and a delete of the same version or offering
-- conflict and exactly one commits.
CREATE TABLE IF NOT EXISTS kubernetes_versions (
    version       VARCHAR(32)  NOT NULL PRIMARY KEY,
    state         VARCHAR(16)  NOT NULL,
    min_cpus      INT          NOT NULL DEFAULT 0,
    min_memory_mb INT          NOT NULL DEFAULT 0,
    binaries_iso  VARCHAR(255) NOT NULL DEFAULT '',
    claims        BIGINT       NOT NULL DEFAULT 0,
    create_time   DATETIME(6)  NOT NULL,
    update_time   DATETIME(6)  NOT NULL
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE IF NOT EXISTS service_offerings (
    name        VARCHAR(64)  NOT NULL PRIMARY KEY,
    cpus        INT          NOT NULL,
    memory_mb   INT          NOT NULL,
    description TEXT         NOT NULL,
    state       VARCHAR(16)  NOT NULL,
    claims      BIGINT       NOT NULL DEFAULT 0,
    create_time DATETIME(6)  NOT NULL,
    update_time DATETIME(6)  NOT NULL
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- The control nodes' offering; '' means the cluster's service_offering (the
-- workers'). The indexes find a version's or an offering's users (live
-- clusters: alive = 1) when it is deleted.
ALTER TABLE clusters
    ADD COLUMN IF NOT EXISTS control_offering VARCHAR(64) NOT NULL DEFAULT '',
    ADD KEY IF NOT EXISTS clusters_kubernetes_version (kubernetes_version, alive),
    ADD KEY IF NOT EXISTS clusters_service_offering (service_offering, alive),
    ADD KEY IF NOT EXISTS clusters_control_offering (control_offering, alive);

-- The version (an upgrade's) or offering (a scale's) a running job moves its
-- cluster to, which the cluster row does not name until the job ends: a
-- delete of either is refused while such a job is IN_PROGRESS.
ALTER TABLE jobs
    ADD COLUMN IF NOT EXISTS target_version  VARCHAR(32) NULL,
    ADD COLUMN IF NOT EXISTS target_offering VARCHAR(64) NULL,
    ADD KEY IF NOT EXISTS jobs_target_version (target_version, status),
    ADD KEY IF NOT EXISTS jobs_target_offering (target_offering, status);

-- +goose Down
ALTER TABLE jobs
    DROP KEY jobs_target_offering,
    DROP KEY jobs_target_version,
    DROP COLUMN target_offering,
    DROP COLUMN target_version;
ALTER TABLE clusters
    DROP KEY clusters_control_offering,
    DROP KEY clusters_service_offering,
    DROP KEY clusters_kubernetes_version,
    DROP COLUMN control_offering;
DROP TABLE service_offerings;
DROP TABLE kubernetes_versions;
