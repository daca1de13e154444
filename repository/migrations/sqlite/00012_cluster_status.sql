-- +goose Up
-- Why a cluster is not healthy, in one line: the history message of the
-- write that moved it into ALERT or ERROR (what reconciliation found, what
-- recovery repaired, why its operation failed), and when; cleared when it
-- is RUNNING, STOPPED or DESTROYED again (lifecycle.StatusOn). It is
-- written by the same compare-and-set as the state.
ALTER TABLE clusters ADD COLUMN status_message VARCHAR(1024) NOT NULL DEFAULT '';
ALTER TABLE clusters ADD COLUMN status_time DATETIME NULL;

-- +goose Down
ALTER TABLE clusters DROP COLUMN status_time;
ALTER TABLE clusters DROP COLUMN status_message;
