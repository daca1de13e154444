-- +goose Up
-- Quotas per account (see the package doc, "Quotas"). A row exists once an
-- admin set the account's limits (explicit = 1) or once the account made a
-- claim that may grow what it holds: every such claim first bumps claims,
-- a write to the one row of its account, so two claims of one account
-- serialise (InnoDB's row lock on one node, certification across Galera
-- nodes). A NULL limit is unlimited.
CREATE TABLE IF NOT EXISTS quotas (
    account      VARCHAR(63)  NOT NULL PRIMARY KEY,
    explicit     TINYINT      NOT NULL DEFAULT 0,
    max_clusters BIGINT       NULL,
    max_nodes    BIGINT       NULL,
    max_cpus     BIGINT       NULL,
    max_memory_mb BIGINT      NULL,
    claims       BIGINT       NOT NULL DEFAULT 0,
    update_time  DATETIME(6)  NOT NULL DEFAULT CURRENT_TIMESTAMP(6)
) ENGINE=InnoDB;
-- What a cluster is about to hold while an operation that grows it runs: a
-- scale up's or add nodes' worker count, an offering change's offering.
-- Cleared when the operation releases the cluster.
ALTER TABLE clusters
    ADD COLUMN IF NOT EXISTS hold_worker_node_count INT NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS hold_service_offering VARCHAR(63) NOT NULL DEFAULT '';

-- +goose Down
ALTER TABLE clusters DROP COLUMN hold_service_offering, DROP COLUMN hold_worker_node_count;
DROP TABLE quotas;
