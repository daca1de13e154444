package repository

import (
	"context"
	"errors"
	"fmt"
	"time"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"
)

// RegisterServer records a server process starting with a fresh incarnation,
// so its peers and its own later incarnations can tell its jobs apart from
// those of the process it replaces. It replaces whatever row the id had, live
// or not; a process that must not push a live one aside uses TakeOverServer.
func (s *Store) RegisterServer(ctx context.Context, id string) (Server, error) {
	now := s.stamp()
	row := serverRow{ID: id, Incarnation: newID(), StartTime: now, HeartbeatTime: now}
	err := s.retrying(ctx, func() error {
		return classify(s.db.WithContext(ctx).Clauses(clause.OnConflict{
			Columns:   []clause.Column{{Name: "id"}},
			DoUpdates: clause.AssignmentColumns([]string{"incarnation", "start_time", "heartbeat_time", "host", "pid"}),
		}).Create(&row).Error)
	})
	if err != nil {
		return Server{}, fmt.Errorf("register server %s: %w", id, err)
	}
	return row.toServer(), nil
}

// Registrant is the process a registration names. The caller chooses the
// incarnation (NewIncarnation) so that it can tell its own row later: a
// registration whose answer was lost, or whose context ended while the
// database still held it, may commit after the caller has given up on it.
type Registrant struct {
	Incarnation string
	Host        string
	PID         int
}

// NewIncarnation returns a fresh incarnation id for a Registrant.
func NewIncarnation() string { return newID() }

// TakeOverServer registers incarnation as.Incarnation of server id, run by
// process as.PID on as.Host, only if the id's row is still exactly as the
// caller saw it (seen; nil when it saw no row): a compare-and-set on the
// server row, so of two processes starting under one id at once only one
// registers, and a predecessor that heartbeats in between keeps its id. A
// miss is ErrConflict.
func (s *Store) TakeOverServer(ctx context.Context, id string, seen *Server, as Registrant) (Server, error) {
	if as.Incarnation == "" {
		return Server{}, fmt.Errorf("register server %s: no incarnation given", id)
	}
	now := s.stamp()
	row := serverRow{ID: id, Incarnation: as.Incarnation, StartTime: now, HeartbeatTime: now, Host: as.Host, PID: int64(as.PID)}
	if seen == nil {
		err := s.retrying(ctx, func() error { return classify(s.db.WithContext(ctx).Create(&row).Error) })
		if errors.Is(err, ErrAlreadyExists) {
			return Server{}, fmt.Errorf("register server %s: registered concurrently: %w", id, ErrConflict)
		}
		if err != nil {
			return Server{}, fmt.Errorf("register server %s: %w", id, err)
		}
		return row.toServer(), nil
	}
	var res *gorm.DB
	err := s.retrying(ctx, func() error {
		res = s.db.WithContext(ctx).Model(&serverRow{}).
			Where("id = ? AND incarnation = ? AND heartbeat_time = ?", id, seen.Incarnation, seen.HeartbeatTime.UTC()).
			Updates(map[string]any{
				"incarnation": row.Incarnation, "start_time": now, "heartbeat_time": now, "host": row.Host, "pid": row.PID,
			})
		return classify(res.Error)
	})
	if err != nil {
		return Server{}, fmt.Errorf("take over server %s: %w", id, err)
	}
	if res.RowsAffected != 1 {
		return Server{}, fmt.Errorf("take over server %s from incarnation %s: its row changed: %w", id, seen.Incarnation, ErrConflict)
	}
	return row.toServer(), nil
}

// Heartbeat tells peers the server is alive. It fails with ErrConflict when
// another process has registered under the same id since (this incarnation
// is superseded and must stop taking work).
func (s *Store) Heartbeat(ctx context.Context, srv Server) (Server, error) {
	now := s.stamp()
	var res *gorm.DB
	err := s.retrying(ctx, func() error {
		res = s.db.WithContext(ctx).Model(&serverRow{}).
			Where("id = ? AND incarnation = ?", srv.ID, srv.Incarnation).
			Update("heartbeat_time", now)
		return classify(res.Error)
	})
	if err != nil {
		return srv, fmt.Errorf("heartbeat of server %s: %w", srv.ID, err)
	}
	if res.RowsAffected != 1 {
		return srv, fmt.Errorf("heartbeat of server %s incarnation %s: superseded: %w", srv.ID, srv.Incarnation, ErrConflict)
	}
	srv.HeartbeatTime = now
	return srv, nil
}

// Stopped is the heartbeat time of a server that stopped gracefully: long
// enough ago that every peer counts it dead at once, and a process starting
// under its id need not wait to take it over.
var Stopped = time.Date(1970, 1, 1, 0, 0, 1, 0, time.UTC)

// ReleaseServer records that incarnation srv stopped gracefully (its
// heartbeat becomes Stopped), if the row is still that incarnation's: its
// peers then fail whatever jobs it could not end at their next scan, and a
// restart under its id starts at once.
func (s *Store) ReleaseServer(ctx context.Context, srv Server) error {
	err := s.retrying(ctx, func() error {
		return classify(s.db.WithContext(ctx).Model(&serverRow{}).
			Where("id = ? AND incarnation = ?", srv.ID, srv.Incarnation).
			Update("heartbeat_time", Stopped).Error)
	})
	if err != nil {
		return fmt.Errorf("release server %s: %w", srv.ID, err)
	}
	return nil
}

// GetServer reads one server row.
func (s *Store) GetServer(ctx context.Context, id string) (Server, error) {
	var row serverRow
	err := s.rdb.WithContext(ctx).Where("id = ?", id).Take(&row).Error
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return Server{}, fmt.Errorf("server %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return Server{}, fmt.Errorf("get server %s: %w", id, classify(err))
	}
	return row.toServer(), nil
}
