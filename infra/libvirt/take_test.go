package libvirt_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/clusterd/clusterd/infra"
	"github.com/clusterd/clusterd/infra/infratest"
	"github.com/clusterd/clusterd/infra/libvirt"
	"github.com/clusterd/clusterd/repository"
	"github.com/clusterd/clusterd/repository/repotest"
)

// peer is a second server's driver beside e's: a Store of its own on e's
// database and a driver of its own on the same libvirtd and storage pool,
// as two clusterd servers of one deployment have. It is closed at the end
// of the test, before e's clean-up.
func (e *env) peer(t *testing.T) *libvirt.Driver {
	t.Helper()
	store, err := repository.Open(ctxT(t), e.dsn, repository.WithServerID("s2"))
	if err != nil {
		t.Fatalf("open the peer's store: %v", err)
	}
	t.Cleanup(func() { _ = store.Close() })
	d, err := libvirt.New(ctxT(t), libvirt.Config{URI: testURI(), PoolDir: e.poolDir, Pool: e.pool,
		Guard: recordingGuard{storeGuard(store), e}, Takes: store, ShutdownTimeout: time.Minute})
	if err != nil {
		t.Fatalf("the peer's driver: %v", err)
	}
	t.Cleanup(func() { _ = d.Close() })
	return d
}

// takes counts the rows of the driver's take table.
func (e *env) takes(t *testing.T) int {
	t.Helper()
	rows, err := e.store.Conn().QueryContext(ctxT(t), "SELECT COUNT(*) FROM libvirt_machine_takes")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	n := 0
	if rows.Next() {
		if err := rows.Scan(&n); err != nil {
			t.Fatal(err)
		}
	}
	return n
}

// free makes a free, running EXTERNAL machine.
func (e *env) free(t *testing.T) string {
	t.Helper()
	m, err := e.d.CreateMachine(ctxT(t), infra.RoleExternal)
	if err != nil {
		t.Fatal(err)
	}
	e.track(m.ID, "")
	return m.ID
}

// TestTwoServersTakeAFreeMachineOnce: two servers sharing one database
// and one libvirtd each run validate_node (AddNodes) of the same free
// machine for a cluster of their own, at the same moment, round after
// round. Exactly one wins each round, the other is told the machine is
// unusable, and the domain's metadata names the winner's cluster.
func TestTwoServersTakeAFreeMachineOnce(t *testing.T) {
	const rounds = 20
	for _, b := range repotest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			e := newEnvOn(t, b, nil)
			drivers := []*libvirt.Driver{e.d, e.peer(t)}
			ctx := ctxT(t)
			twoWinners := 0
			for round := range rounds {
				id := e.free(t)
				clusters := []cluster{e.newCluster(t), e.newCluster(t)}
				errs := make([]error, 2)
				start := make(chan struct{})
				var wg sync.WaitGroup
				for i := range drivers {
					wg.Go(func() {
						<-start
						errs[i] = drivers[i].ValidateNode(ctx, clusters[i].call(id))
					})
				}
				close(start)
				wg.Wait()
				var won []int
				for i, err := range errs {
					switch {
					case err == nil:
						won = append(won, i)
					case !errors.Is(err, infra.ErrUnusable):
						t.Errorf("round %d: server %d: %v; want success or ErrUnusable", round, i+1, err)
					}
				}
				m := e.machine(t, id)
				switch len(won) {
				case 1:
					if w := clusters[won[0]].id; m.ClusterID != w || m.Role != infra.RoleWorker {
						t.Errorf("round %d: the machine is %s in cluster %q; want a WORKER of the winner's cluster %s", round, m.Role, m.ClusterID, w)
					}
				case 2:
					twoWinners++
					t.Errorf("round %d: both servers took the machine; its metadata names cluster %s", round, m.ClusterID)
				default:
					t.Errorf("round %d: neither server took the machine: %v", round, errs)
				}
			}
			if n := e.takes(t); n != 0 {
				t.Errorf("%d takes left in the database after the rounds; want none (the metadata is the record)", n)
			}
			t.Logf("%d of %d rounds had two winners", twoWinners, rounds)
		})
	}
}

// TestALeftTakeIsTakenOverOnceItsJobEnds: a take left behind by a server
// that died between its take and the domain's metadata refuses other
// clusters while its job is in progress, and is taken over once the job
// has ended (recovery failed it).
func TestALeftTakeIsTakenOverOnceItsJobEnds(t *testing.T) {
	for _, b := range repotest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			e := newEnvOn(t, b, nil)
			ctx := ctxT(t)
			h := infratest.NewHolder(e.store)
			id := e.free(t)
			dead, err := h.Hold(ctx, uuid.NewString())
			if err != nil {
				t.Fatal(err)
			}
			e.track("", dead.ClusterID)
			leaveTake(t, e, id, dead)
			other, err := h.Hold(ctx, uuid.NewString())
			if err != nil {
				t.Fatal(err)
			}
			e.track("", other.ClusterID)
			other.MachineID = id
			err = e.d.ValidateNode(ctx, other)
			if !errors.Is(err, infra.ErrUnusable) || !strings.Contains(err.Error(), "is taking it") {
				t.Fatalf("validate while the take's job is in progress: %v; want ErrUnusable saying another cluster is taking it", err)
			}
			if m := e.machine(t, id); m.ClusterID != "" {
				t.Fatalf("a refused validate took the machine: %+v", m)
			}
			if err := h.Fail(ctx, dead); err != nil {
				t.Fatal(err)
			}
			if err := e.d.ValidateNode(ctx, other); err != nil {
				t.Fatalf("validate once the take's job has ended: %v", err)
			}
			if m := e.machine(t, id); m.ClusterID != other.ClusterID || m.Role != infra.RoleWorker {
				t.Fatalf("after the take-over the machine is %+v; want a WORKER of cluster %s", m, other.ClusterID)
			}
			if n := e.takes(t); n != 0 {
				t.Errorf("%d takes left; want none", n)
			}
		})
	}
}

// TestAnAdoptedJobValidatesAgain: the attempt of a job that adopted it
// runs validate_node again, both after its predecessor's take was left
// behind (its server died before the metadata) and after the predecessor
// took the machine; the predecessor is refused once the job moved on.
func TestAnAdoptedJobValidatesAgain(t *testing.T) {
	for _, b := range repotest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			e := newEnvOn(t, b, nil)
			ctx := ctxT(t)
			h := infratest.NewHolder(e.store)
			first, err := h.Hold(ctx, uuid.NewString())
			if err != nil {
				t.Fatal(err)
			}
			e.track("", first.ClusterID)

			left := e.free(t)
			leaveTake(t, e, left, first)
			done := e.free(t)
			first.MachineID = done
			if err := e.d.ValidateNode(ctx, first); err != nil {
				t.Fatalf("validate by the first attempt: %v", err)
			}
			next, err := h.Adopt(ctx, first)
			if err != nil {
				t.Fatal(err)
			}
			for _, id := range []string{left, done} {
				next.MachineID = id
				if err := e.d.ValidateNode(ctx, next); err != nil {
					t.Fatalf("validate of machine %s by the adopted attempt: %v", id, err)
				}
				if m := e.machine(t, id); m.ClusterID != next.ClusterID || m.Role != infra.RoleWorker {
					t.Fatalf("machine %s after the adopted attempt's validate: %+v", id, m)
				}
			}
			if n := e.takes(t); n != 0 {
				t.Errorf("%d takes left; want none", n)
			}
			first.MachineID = e.free(t)
			if err := e.d.ValidateNode(ctx, first); !errors.Is(err, infra.ErrFenced) {
				t.Fatalf("validate by the first attempt after the adoption: %v; want ErrFenced", err)
			}
			if m := e.machine(t, first.MachineID); m.ClusterID != "" {
				t.Fatalf("the first attempt took a machine after the adoption: %+v", m)
			}
		})
	}
}

// leaveTake writes the row a server leaves when it dies between taking
// machine id for call's job and writing the domain's metadata.
func leaveTake(t *testing.T, e *env, id string, call infra.Call) {
	t.Helper()
	_, err := e.store.Conn().ExecContext(context.Background(),
		"INSERT INTO libvirt_machine_takes (machine_id, cluster_id, job_id, attempt, server, time) VALUES (?, ?, ?, ?, ?, ?)",
		id, call.ClusterID, call.Operation, call.Attempt, "dead", time.Now().UTC().Truncate(time.Microsecond))
	if err != nil {
		t.Fatal(fmt.Errorf("leave a take: %w", err))
	}
}

// TestTakeTableMigratesAgain: the driver's migrations run again on a
// database that has them, and on one whose version table lost them (a
// migration cut short on MariaDB, which commits each DDL statement on its
// own, runs whole again at the next start): the table and its rows stay.
func TestTakeTableMigratesAgain(t *testing.T) {
	for _, b := range repotest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			ctx := ctxT(t)
			dsn := b.NewDSN(t)
			store, err := repository.Open(ctx, dsn)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = store.Close() })
			if err := libvirt.Migrate(ctx, store); err != nil {
				t.Fatalf("migrate: %v", err)
			}
			e := &env{store: store}
			leaveTake(t, e, uuid.NewString(), infra.Call{ClusterID: uuid.NewString(), Operation: uuid.NewString(), Attempt: 1})
			if err := libvirt.Migrate(ctx, store); err != nil {
				t.Fatalf("migrate again: %v", err)
			}
			if _, err := store.Conn().ExecContext(ctx, "DROP TABLE goose_libvirt_version"); err != nil {
				t.Fatal(err)
			}
			if err := libvirt.Migrate(ctx, store); err != nil {
				t.Fatalf("migrate after the version table was lost: %v", err)
			}
			if n := e.takes(t); n != 1 {
				t.Fatalf("%d takes after migrating again; want the 1 written before", n)
			}
		})
	}
}
