package repository

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/clusterd/clusterd/lifecycle"
)

// CountClusters returns how many clusters are in each state, DESTROYED
// included, across every account: the clusterd_clusters gauge. One grouped
// query on the state index, whatever the number of clusters.
func (s *Store) CountClusters(ctx context.Context) (map[lifecycle.State]int64, error) {
	var rows []struct {
		State string
		N     int64
	}
	if err := s.rdb.WithContext(ctx).Model(&clusterRow{}).Select("state, COUNT(*) AS n").Group("state").Scan(&rows).Error; err != nil {
		return nil, fmt.Errorf("count clusters: %w", classify(err))
	}
	out := make(map[lifecycle.State]int64, len(rows))
	for _, r := range rows {
		st, err := lifecycle.ParseState(r.State)
		if err != nil {
			return nil, fmt.Errorf("count clusters: stored state: %w", err)
		}
		out[st] = r.N
	}
	return out, nil
}

// PoolStats returns the connection pool's statistics (open, in use, idle,
// waits), so the server can export them without reaching the *sql.DB.
func (s *Store) PoolStats() sql.DBStats { return s.sqlDB.Stats() }
