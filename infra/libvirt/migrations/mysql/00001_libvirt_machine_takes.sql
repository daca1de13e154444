-- +goose Up
-- The libvirt driver's takes of free machines: validate_node (AddNodes)
-- inserts a machine's row, in the transaction that fences its call, before
-- it reads and writes the domain's metadata, so of clusters racing for one
-- free machine from several servers exactly one gets past it (the primary
-- key decides). A row names the cluster, job and attempt taking the
-- machine; the taker deletes it once the domain's metadata says who has
-- the machine, and a row left behind (its server died) is taken over once
-- its job has ended. server and time are for an operator reading it.
CREATE TABLE IF NOT EXISTS libvirt_machine_takes (
    machine_id VARCHAR(36)  NOT NULL PRIMARY KEY,
    cluster_id VARCHAR(36)  NOT NULL,
    job_id     VARCHAR(36)  NOT NULL,
    attempt    INT          NOT NULL DEFAULT 0,
    server     VARCHAR(255) NOT NULL DEFAULT '',
    time       DATETIME(6)  NOT NULL
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- +goose Down
DROP TABLE libvirt_machine_takes;
