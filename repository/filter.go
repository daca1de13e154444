package repository

import (
	"fmt"
	"strings"
	"time"

	"github.com/clusterd/clusterd/lifecycle"
)

// Filter is a condition on the rows a list returns: comparisons of a Field
// with a value, joined by And, Or and Not. The service builds one from a
// client's AIP-160 filter; only this package turns it into SQL, always as a
// parameterised WHERE clause whose column names come from a fixed table, never
// from the client. The zero Filter matches every row.
type Filter struct {
	kind  filterKind
	field Field
	op    Op
	value any
	args  []Filter
}

type filterKind int

const (
	matchAll filterKind = iota
	compare
	and
	or
	not
)

// Field names what a Filter can compare, per collection: clusters
// (Cluster...) or jobs (Job...). A list refuses a field of the other
// collection.
type Field string

// The fields of clusters, with the Go type of the values they compare with.
const (
	ClusterState       Field = "cluster.state"        // lifecycle.State
	ClusterDisplayName Field = "cluster.display_name" // string
	ClusterAccount     Field = "cluster.account"      // string
	ClusterCreateTime  Field = "cluster.create_time"  // time.Time
	ClusterUpdateTime  Field = "cluster.update_time"  // time.Time
)

// The fields of jobs, with the Go type of the values they compare with.
const (
	// JobCluster is the id of the cluster a job acts on ("" for none).
	JobCluster    Field = "job.cluster"     // string
	JobKind       Field = "job.kind"        // string
	JobDone       Field = "job.done"        // bool: the job has ended
	JobCreateTime Field = "job.create_time" // time.Time
	JobUpdateTime Field = "job.update_time" // time.Time
)

// Op is a comparison operator.
type Op string

// The comparison operators. Ordering operators (<, <=, >, >=) apply to times only.
const (
	Eq Op = "="
	Ne Op = "<>"
	Lt Op = "<"
	Le Op = "<="
	Gt Op = ">"
	Ge Op = ">="
)

// Compare is the condition `field op value`.
func Compare(field Field, op Op, value any) Filter {
	return Filter{kind: compare, field: field, op: op, value: value}
}

// And matches rows every filter matches (every row when there is none).
func And(filters ...Filter) Filter { return Filter{kind: and, args: filters} }

// Or matches rows at least one filter matches (no row when there is none).
func Or(filters ...Filter) Filter { return Filter{kind: or, args: filters} }

// Not matches the rows f does not match.
func Not(f Filter) Filter { return Filter{kind: not, args: []Filter{f}} }

// String shows the filter the way SQL will read it, for logs and test failures.
func (f Filter) String() string {
	where, args, err := f.where(columnsOf(f))
	if err != nil {
		return "invalid filter: " + err.Error()
	}
	return fmt.Sprintf("%s %v", where, args)
}

// column is how one Field reads in SQL, and the Go type of its values.
type column struct {
	sql  string
	kind string // "state", "string", "bool", "time"
}

var clusterColumns = map[Field]column{
	ClusterState:       {"state", "state"},
	ClusterDisplayName: {"display_name", "string"},
	ClusterAccount:     {"account", "string"},
	ClusterCreateTime:  {"create_time", "time"},
	ClusterUpdateTime:  {"update_time", "time"},
}

var jobColumns = map[Field]column{
	// resource_id is NULL in rows of older servers; COALESCE keeps `!=` and
	// NOT from silently dropping them (NULL compares as unknown).
	JobCluster:    {"COALESCE(resource_id, '')", "string"},
	JobKind:       {"kind", "string"},
	JobDone:       {"status", "done"},
	JobCreateTime: {"create_time", "time"},
	JobUpdateTime: {"update_time", "time"},
}

// columnsOf guesses the table of a filter from its first field, for String.
func columnsOf(f Filter) map[Field]column {
	if f.kind == compare {
		if _, ok := jobColumns[f.field]; ok {
			return jobColumns
		}
		return clusterColumns
	}
	for _, a := range f.args {
		return columnsOf(a)
	}
	return clusterColumns
}

// where translates f into a WHERE clause with ? placeholders and its
// arguments. A field not in columns, a value of the wrong type or an ordering
// operator on a non-time field is an error: the service should not have built
// such a filter.
func (f Filter) where(columns map[Field]column) (string, []any, error) {
	switch f.kind {
	case matchAll:
		return "1 = 1", nil, nil
	case compare:
		return f.comparison(columns)
	case not:
		inner, args, err := f.args[0].where(columns)
		if err != nil {
			return "", nil, err
		}
		return "NOT (" + inner + ")", args, nil
	case and, or:
		if len(f.args) == 0 {
			if f.kind == and {
				return "1 = 1", nil, nil
			}
			return "1 = 0", nil, nil
		}
		join := " AND "
		if f.kind == or {
			join = " OR "
		}
		parts := make([]string, len(f.args))
		var args []any
		for i, a := range f.args {
			part, more, err := a.where(columns)
			if err != nil {
				return "", nil, err
			}
			parts[i] = "(" + part + ")"
			args = append(args, more...)
		}
		return strings.Join(parts, join), args, nil
	}
	return "", nil, fmt.Errorf("filter: unknown kind %d", f.kind)
}

func (f Filter) comparison(columns map[Field]column) (string, []any, error) {
	col, ok := columns[f.field]
	if !ok {
		return "", nil, fmt.Errorf("filter: field %s does not belong to this collection", f.field)
	}
	switch f.op {
	case Eq, Ne:
	case Lt, Le, Gt, Ge:
		if col.kind != "time" {
			return "", nil, fmt.Errorf("filter: %s %s: only times are ordered", f.field, f.op)
		}
	default:
		return "", nil, fmt.Errorf("filter: unknown operator %q", f.op)
	}
	var arg any
	switch v := f.value.(type) {
	case lifecycle.State:
		if col.kind == "state" {
			arg = v.String()
		}
	case string:
		if col.kind == "string" {
			arg = v
		}
	case time.Time:
		if col.kind == "time" {
			// Rows hold UTC at microsecond precision (Store.stamp).
			arg = v.UTC().Truncate(time.Microsecond)
		}
	case bool:
		if col.kind == "done" {
			// A job is done unless it is IN_PROGRESS.
			running := !v
			if f.op == Ne {
				running = !running
			}
			if running {
				return col.sql + " = ?", []any{string(JobInProgress)}, nil
			}
			return col.sql + " <> ?", []any{string(JobInProgress)}, nil
		}
	}
	if arg == nil {
		return "", nil, fmt.Errorf("filter: %s compared with %T", f.field, f.value)
	}
	return col.sql + " " + string(f.op) + " ?", []any{arg}, nil
}

// MatchCluster reports whether c is a row f keeps, as ListClusters's WHERE
// clause would: a watch applies a list's filter to each cluster a change
// names, in memory, rather than asking the database once per watcher. A
// filter that is not on clusters is an error.
func (f Filter) MatchCluster(c Cluster) (bool, error) {
	switch f.kind {
	case matchAll:
		return true, nil
	case not:
		m, err := f.args[0].MatchCluster(c)
		return !m, err
	case and, or:
		for _, a := range f.args {
			m, err := a.MatchCluster(c)
			if err != nil {
				return false, err
			}
			if f.kind == and && !m {
				return false, nil
			}
			if f.kind == or && m {
				return true, nil
			}
		}
		return f.kind == and, nil
	case compare:
		return f.matchClusterField(c)
	}
	return false, fmt.Errorf("filter: unknown kind %d", f.kind)
}

func (f Filter) matchClusterField(c Cluster) (bool, error) {
	if _, _, err := f.comparison(clusterColumns); err != nil {
		return false, err
	}
	var cmp int
	switch f.field {
	case ClusterState:
		cmp = strings.Compare(c.State.String(), f.value.(lifecycle.State).String())
	case ClusterDisplayName:
		cmp = strings.Compare(c.DisplayName, f.value.(string))
	case ClusterAccount:
		cmp = strings.Compare(c.Account, f.value.(string))
	case ClusterCreateTime:
		cmp = c.CreateTime.Compare(f.value.(time.Time).UTC().Truncate(time.Microsecond))
	case ClusterUpdateTime:
		cmp = c.UpdateTime.Compare(f.value.(time.Time).UTC().Truncate(time.Microsecond))
	}
	switch f.op {
	case Eq:
		return cmp == 0, nil
	case Ne:
		return cmp != 0, nil
	case Lt:
		return cmp < 0, nil
	case Le:
		return cmp <= 0, nil
	case Gt:
		return cmp > 0, nil
	default:
		return cmp >= 0, nil
	}
}
