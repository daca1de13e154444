package repository

import (
	"fmt"
	"strings"
	"time"
)

// Timestamps on the hot reads. SQLite keeps a time as the text its driver
// wrote (`_time_format=sqlite`: "2006-01-02 15:04:05.999999999-07:00"), and
// the driver turns a DATETIME column back into a time.Time by trying layouts
// in turn, the first of which never matches that text: measured here, 1.3 µs
// a value, where the rest of a row's column costs about 0.4. A page of
// ListClusters holds about 900 of them (its clusters' and their machines').
// So the hand-scanned reads of clusters, machines and jobs select their time columns through
// SQLite's unary + (a no-op on the value that makes the column an
// expression, which the driver hands over as text) and parse the one layout
// clusterd writes by hand. MySQL's driver hands over a time.Time, which is
// taken as it is.

// hotColumns are the column lists of the hand-scanned reads, as each backend
// is asked for them.
type hotColumns struct {
	// cluster is what scanCluster reads, qualified by the alias c.
	cluster string
	// machine is what scanMachine reads.
	machine string
	// getCluster and getClusterMachines are GetCluster's and
	// GetClusterWithMachines's statements, built once: one of them is read
	// for every call of the GetCluster RPC.
	getCluster, getClusterMachines string
	// job is what scanJob reads.
	job string
}

// columnsFor builds the column lists for backend b.
func columnsFor(b Backend) hotColumns {
	t := func(col string) string {
		if b == SQLite {
			return "+" + col
		}
		return col
	}
	cols := hotColumns{
		cluster: "c.id, c.account, c.display_name, c.alive, c.description, c.state, c.version, " +
			"c.current_operation, c.kubernetes_version, c.control_node_count, c.worker_node_count, " +
			"c.service_offering, c.autoscaling_enabled, c.autoscaling_min, c.autoscaling_max, c.endpoint, " +
			t("c.create_time") + ", " + t("c.update_time") + ", " + t("c.delete_time") + ", c.control_offering, c.status_message, " +
			t("c.status_time"),
		machine: "id, cluster_id, " + machineColumns(t, ""),
		job: "id, kind, account, resource_id, server_id, server_incarnation, status, request_id, request_hash," +
			" params, result, error, step, steps_done, steps_total, cancel_requested, attempt, handed_off, " +
			t("deadline") + ", " + t("create_time") + ", " + t("update_time") + ", " + t("end_time"),
	}
	cols.getCluster = "SELECT " + cols.cluster + " FROM clusters c WHERE c.id = ?"
	// The cluster, then the columns of each of its machines (m, LEFT
	// JOINed) but their cluster_id.
	cols.getClusterMachines = "SELECT " + cols.cluster + ", m.id, " + machineColumns(t, "m.") +
		" FROM clusters c LEFT JOIN machines m ON m.cluster_id = c.id WHERE c.id = ? ORDER BY m.create_time, m.id"
	return cols
}

// machineColumns are a machine's columns after its id and cluster, each
// qualified by prefix, the time columns as t selects them.
func machineColumns(t func(string) string, prefix string) string {
	p := func(col string) string { return prefix + col }
	return p("role") + ", " + p("power") + ", " + p("joined") + ", " + p("cordoned") + ", " + p("kubernetes_version") + ", " +
		p("attached_iso") + ", " + p("offering") + ", " + t(p("create_time")) + ", " + t(p("update_time"))
}

// stamp scans a timestamp column into *t, in UTC, whichever way the driver
// hands it over: a time.Time, or the text SQLite keeps.
type stamp struct{ t *time.Time }

// Scan implements sql.Scanner.
func (d stamp) Scan(v any) error {
	switch v := v.(type) {
	case time.Time:
		*d.t = v.UTC()
		return nil
	case string:
		return parseStampInto(d.t, v)
	case []byte:
		return parseStampInto(d.t, string(v))
	}
	return fmt.Errorf("timestamp: cannot scan %T", v)
}

// maybeStamp is stamp for a column that may be NULL, which leaves *t nil.
type maybeStamp struct{ t **time.Time }

// Scan implements sql.Scanner.
func (d maybeStamp) Scan(v any) error {
	if v == nil {
		*d.t = nil
		return nil
	}
	var t time.Time
	if err := (stamp{&t}).Scan(v); err != nil {
		return err
	}
	*d.t = &t
	return nil
}

// joinedStamp is stamp for a column of a LEFT JOINed table, NULL when the
// join found no row: NULL leaves the zero time.
type joinedStamp struct{ t *time.Time }

// Scan implements sql.Scanner.
func (d joinedStamp) Scan(v any) error {
	if v == nil {
		*d.t = time.Time{}
		return nil
	}
	return stamp(d).Scan(v)
}

// stampLayouts are the layouts SQLite's driver reads, after the one
// parseStamp reads by hand: a row written some other way still reads.
// parseStampInto also takes what the driver takes around them (spaces, a
// trailing "Z", the monotonic clock reading of time.Time's String).
var stampLayouts = []string{
	"2006-01-02 15:04:05.999999999-07:00",
	"2006-01-02T15:04:05.999999999-07:00",
	"2006-01-02 15:04:05.999999999",
	"2006-01-02T15:04:05.999999999",
	"2006-01-02 15:04:05.999999999 -0700 MST",
	"2006-01-02 15:04",
	"2006-01-02T15:04",
	"2006-01-02",
}

func parseStampInto(dst *time.Time, s string) error {
	if t, ok := parseStamp(s); ok {
		*dst = t
		return nil
	}
	bare := strings.TrimSpace(s)
	if i := strings.Index(bare, " m="); i >= 0 {
		bare = bare[:i]
	}
	bare = strings.TrimSuffix(bare, "Z")
	for _, l := range stampLayouts {
		if t, err := time.Parse(l, bare); err == nil {
			*dst = t.UTC()
			return nil
		}
	}
	return fmt.Errorf("timestamp: %q is in no layout this store reads", s)
}

// parseStamp reads "YYYY-MM-DD HH:MM:SS", a 'T' in place of the space
// allowed, then optionally a fraction of 1 to 9 digits, then "Z", "±HH:MM" or
// nothing (UTC), in UTC. It refuses what time.Parse would refuse on those
// layouts (a field out of range, a day the month does not have) by saying
// false, and the caller falls back to time.Parse.
func parseStamp(s string) (time.Time, bool) {
	if len(s) < 19 || s[4] != '-' || s[7] != '-' || (s[10] != ' ' && s[10] != 'T') || s[13] != ':' || s[16] != ':' {
		return time.Time{}, false
	}
	ok := true
	num := func(from, to int) int {
		n := 0
		for i := from; i < to; i++ {
			c := s[i]
			if c < '0' || c > '9' {
				ok = false
				return 0
			}
			n = n*10 + int(c-'0')
		}
		return n
	}
	year, month, day := num(0, 4), num(5, 7), num(8, 10)
	hour, minute, sec := num(11, 13), num(14, 16), num(17, 19)
	if !ok || month < 1 || month > 12 || day < 1 || hour > 23 || minute > 59 || sec > 59 {
		return time.Time{}, false
	}
	i, nsec := 19, 0
	if i < len(s) && s[i] == '.' {
		i++
		digits := 0
		for ; i < len(s) && s[i] >= '0' && s[i] <= '9'; i++ {
			if digits == 9 {
				return time.Time{}, false
			}
			nsec = nsec*10 + int(s[i]-'0')
			digits++
		}
		if digits == 0 {
			return time.Time{}, false
		}
		for ; digits < 9; digits++ {
			nsec *= 10
		}
	}
	offset := 0
	switch rest := s[i:]; {
	case rest == "", rest == "Z":
	case len(rest) == 6 && (rest[0] == '+' || rest[0] == '-') && rest[3] == ':':
		oh, om := num(i+1, i+3), num(i+4, i+6)
		if !ok || oh > 23 || om > 59 {
			return time.Time{}, false
		}
		offset = oh*3600 + om*60
		if rest[0] == '-' {
			offset = -offset
		}
	default:
		return time.Time{}, false
	}
	t := time.Date(year, time.Month(month), day, hour, minute, sec, nsec, time.UTC)
	if t.Day() != day {
		return time.Time{}, false // a day the month does not have
	}
	return t.Add(-time.Duration(offset) * time.Second), true
}
