-- +goose Up
-- Adoption of operations whose server is gone (SPEC §5 step 4). attempt counts
-- the servers that have run the job: 1 for the one that claimed it, one more
-- for every adoption. It is part of the fencing token, so a server whose job
-- was adopted is refused from that instant. handed_off marks a job its server
-- let go of on a graceful stop: any live server may adopt it at once.
ALTER TABLE jobs
    ADD COLUMN IF NOT EXISTS attempt    INT     NOT NULL DEFAULT 1,
    ADD COLUMN IF NOT EXISTS handed_off BOOLEAN NOT NULL DEFAULT FALSE;

-- Which attempt of the job made each infrastructure call, and on which
-- server, so a checker can see that no call of an earlier attempt went
-- through after an adoption.
ALTER TABLE sim_calls
    ADD COLUMN IF NOT EXISTS attempt INT          NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS server  VARCHAR(255) NOT NULL DEFAULT '';

-- +goose Down
ALTER TABLE sim_calls DROP COLUMN server, DROP COLUMN attempt;
ALTER TABLE jobs DROP COLUMN handed_off, DROP COLUMN attempt;
