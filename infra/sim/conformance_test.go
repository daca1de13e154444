package sim_test

import (
	"context"
	"testing"

	"github.com/clusterd/clusterd/infra"
	"github.com/clusterd/clusterd/infra/infratest"
	"github.com/clusterd/clusterd/infra/sim"
	"github.com/clusterd/clusterd/repository/repotest"
)

// The simulator passes the drivers' conformance suite on every backend its
// machines can live in, fenced by the repository they share.
func TestConformance(t *testing.T) {
	for _, b := range repotest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			infratest.Run(t, func(t *testing.T) infratest.Harness {
				store := repotest.Open(t, b)
				s := sim.New(store, sim.Config{})
				return infratest.Harness{
					Infra:  s,
					Holder: infratest.NewHolder(store),
					External: func(ctx context.Context) (string, error) {
						m, err := s.CreateMachine(ctx, infra.RoleExternal)
						return m.ID, err
					},
				}
			})
		})
	}
}
