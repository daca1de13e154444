package sim_test

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/clusterd/clusterd/infra"
	"github.com/clusterd/clusterd/infra/infratest"
	"github.com/clusterd/clusterd/infra/sim"
	"github.com/clusterd/clusterd/repository"
	"github.com/clusterd/clusterd/repository/repotest"
)

// The simulator passes the drivers' conformance suite on every backend its
// machines can live in, fenced by the repository they share.
func TestConformance(t *testing.T) {
	for _, b := range repotest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			infratest.Run(t, func(t *testing.T) infratest.Harness {
				// Two servers' stores on one database, and a simulator
				// on each (Peer).
				dsn := b.NewDSN(t)
				var sims []*sim.Simulator
				var first *repository.Store
				for i := range 2 {
					store, err := repository.Open(context.Background(), dsn, repository.WithServerID(fmt.Sprintf("s%d", i+1)))
					if err != nil {
						t.Fatal(err)
					}
					repotest.SeedCatalog(t, store)
					t.Cleanup(func() { _ = store.Close() })
					s, err := sim.Open(context.Background(), store, sim.Config{})
					if err != nil {
						t.Fatal(err)
					}
					sims = append(sims, s)
					if first == nil {
						first = store
					}
				}
				s := sims[0]
				return infratest.Harness{
					Infra:  s,
					Peer:   sims[1],
					Holder: infratest.NewHolder(first),
					External: func(ctx context.Context) (string, error) {
						m, err := s.CreateMachine(ctx, infra.RoleExternal)
						return m.ID, err
					},
					// The machines go with the database; this checks that
					// the suite names every machine it made, as a driver
					// whose machines outlive the test needs.
					Cleanup: func(ctx context.Context, machines, _ []string) error {
						all, err := s.Machines(ctx)
						if err != nil {
							return err
						}
						for _, m := range all {
							if !slices.Contains(machines, m.ID) {
								return fmt.Errorf("machine %s (%+v) was not named for clean-up", m.ID, m)
							}
						}
						return nil
					},
				}
			})
		})
	}
}
