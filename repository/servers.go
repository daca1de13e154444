package repository

import (
	"context"
	"errors"
	"fmt"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"
)

// RegisterServer records a server process starting with a fresh incarnation,
// so its peers and its own later incarnations can tell its jobs apart from
// those of the process it replaces.
func (s *Store) RegisterServer(ctx context.Context, id string) (Server, error) {
	now := s.stamp()
	row := serverRow{ID: id, Incarnation: newID(), StartTime: now, HeartbeatTime: now}
	err := s.db.WithContext(ctx).Clauses(clause.OnConflict{
		Columns:   []clause.Column{{Name: "id"}},
		DoUpdates: clause.AssignmentColumns([]string{"incarnation", "start_time", "heartbeat_time"}),
	}).Create(&row).Error
	if err != nil {
		return Server{}, fmt.Errorf("register server %s: %w", id, classify(err))
	}
	return Server(row), nil
}

// Heartbeat tells peers the server is alive. It fails with ErrConflict when
// another process has registered under the same id since (this incarnation
// is superseded and must stop taking work).
func (s *Store) Heartbeat(ctx context.Context, srv Server) (Server, error) {
	now := s.stamp()
	res := s.db.WithContext(ctx).Model(&serverRow{}).
		Where("id = ? AND incarnation = ?", srv.ID, srv.Incarnation).
		Update("heartbeat_time", now)
	if res.Error != nil {
		return srv, fmt.Errorf("heartbeat of server %s: %w", srv.ID, classify(res.Error))
	}
	if res.RowsAffected != 1 {
		return srv, fmt.Errorf("heartbeat of server %s incarnation %s: superseded: %w", srv.ID, srv.Incarnation, ErrConflict)
	}
	srv.HeartbeatTime = now
	return srv, nil
}

// GetServer reads one server row.
func (s *Store) GetServer(ctx context.Context, id string) (Server, error) {
	var row serverRow
	err := s.db.WithContext(ctx).Where("id = ?", id).Take(&row).Error
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return Server{}, fmt.Errorf("server %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return Server{}, fmt.Errorf("get server %s: %w", id, classify(err))
	}
	row.StartTime, row.HeartbeatTime = row.StartTime.UTC(), row.HeartbeatTime.UTC()
	return Server(row), nil
}
