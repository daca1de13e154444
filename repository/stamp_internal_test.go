package repository

import (
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

func TestStampScan(t *testing.T) {
	east := time.FixedZone("", 5*3600+30*60)
	tests := []struct {
		in   any
		want time.Time
	}{
		// What the SQLite driver writes (_time_format=sqlite).
		{"2026-12-04 16:16:25.123456+00:00", time.Date(2026, 12, 4, 16, 16, 25, 123456000, time.UTC)},
		{"2026-12-04 16:16:25+00:00", time.Date(2026, 12, 4, 16, 16, 25, 0, time.UTC)},
		{"2026-12-04 21:46:25.5+05:30", time.Date(2026, 12, 4, 21, 46, 25, 500000000, east)},
		{"2026-12-04 11:16:25.999999999-05:00", time.Date(2026, 12, 4, 16, 16, 25, 999999999, time.UTC)},
		{"2024-02-29 00:00:00+00:00", time.Date(2024, 2, 29, 0, 0, 0, 0, time.UTC)},
		// strftime's, and other layouts the driver reads.
		{"2026-12-04 16:16:25.123", time.Date(2026, 12, 4, 16, 16, 25, 123000000, time.UTC)},
		{"2026-12-04T16:16:25Z", time.Date(2026, 12, 4, 16, 16, 25, 0, time.UTC)},
		{"2026-12-04 16:16:25.5 +0000 UTC", time.Date(2026, 12, 4, 16, 16, 25, 500000000, time.UTC)},
		{"2026-12-04 16:16", time.Date(2026, 12, 4, 16, 16, 0, 0, time.UTC)},
		{"2026-12-04", time.Date(2026, 12, 4, 0, 0, 0, 0, time.UTC)},
		{[]byte("2026-12-04 16:16:25.25+00:00"), time.Date(2026, 12, 4, 16, 16, 25, 250000000, time.UTC)},
		// What the driver writes without _time_format (time.Time's String),
		// and layouts with the "Z" the driver cuts.
		{"2026-12-04 16:16:25.5 +0000 UTC m=+0.100000001", time.Date(2026, 12, 4, 16, 16, 25, 500000000, time.UTC)},
		{"2026-12-04T16:16Z", time.Date(2026, 12, 4, 16, 16, 0, 0, time.UTC)},
		{"2026-12-04Z", time.Date(2026, 12, 4, 0, 0, 0, 0, time.UTC)},
		{"2026-12-04 16:16:25.1234567891Z", time.Date(2026, 12, 4, 16, 16, 25, 123456789, time.UTC)},
		// MySQL's driver hands over a time.Time.
		{time.Date(2026, 12, 4, 21, 46, 25, 0, east), time.Date(2026, 12, 4, 16, 16, 25, 0, time.UTC)},
	}
	for _, tt := range tests {
		var got time.Time
		if err := (stamp{&got}).Scan(tt.in); err != nil || !got.Equal(tt.want) || got.Location() != time.UTC {
			t.Errorf("Scan(%v) = %v (%v), %v; want %v in UTC", tt.in, got, got.Location(), err, tt.want)
		}
	}
	for _, bad := range []any{"2026-02-30 00:00:00+00:00", "2026-13-01 00:00:00+00:00", "2026-12-04 24:00:00+00:00",
		"2026-12-04 16:16:25.+00:00", "2026-12-04 16:16:25+0000", "yesterday", "", 42, nil} {
		var got time.Time
		if err := (stamp{&got}).Scan(bad); err == nil {
			t.Errorf("Scan(%q) = %v; want an error", bad, got)
		}
	}
	var p *time.Time = new(time.Time)
	if err := (maybeStamp{&p}).Scan(nil); err != nil || p != nil {
		t.Errorf("maybeStamp.Scan(nil) = %v, %v; want nil", p, err)
	}
	if err := (maybeStamp{&p}).Scan("2026-12-04 16:16:25+00:00"); err != nil || p == nil || !p.Equal(time.Date(2026, 12, 4, 16, 16, 25, 0, time.UTC)) {
		t.Errorf("maybeStamp.Scan(a time) = %v, %v", p, err)
	}
}

// TestParseStampAgreesWithTimeParse: whatever parseStamp accepts, time.Parse
// reads as the same instant in one of the driver's layouts, and every time
// the driver writes parseStamp reads by itself.
func TestParseStampAgreesWithTimeParse(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for range 20000 {
		at := time.Unix(r.Int64N(4e9), r.Int64N(1e9)).In(time.FixedZone("", (r.IntN(49)-24)*1800))
		s := at.Format(stampLayouts[0])
		got, ok := parseStamp(s)
		if !ok || !got.Equal(at) {
			t.Fatalf("parseStamp(%q) = %v, %v; want %v", s, got, ok, at)
		}
	}
	for _, s := range []string{"2026-12-04 16:16:25", "2026-12-04T16:16:25.000000001Z", "0001-01-01 00:00:00+00:00",
		"9999-12-31 23:59:59.999999999-23:59", "2026-12-04 16:16:25.1234567891+00:00", "2026-12-04 16:16:25+24:00"} {
		checkStampAgrees(t, s)
	}
}

func FuzzParseStamp(f *testing.F) {
	for _, s := range []string{"2026-12-04 16:16:25.123456+00:00", "2026-12-04T16:16:25Z", "2026-12-04 16:16:25", "2026-02-29 00:00:00-01:30"} {
		f.Add(s)
	}
	f.Fuzz(checkStampAgrees)
}

func checkStampAgrees(t *testing.T, s string) {
	got, ok := parseStamp(s)
	if !ok {
		return
	}
	bare := strings.TrimSuffix(s, "Z")
	for _, l := range stampLayouts {
		if want, err := time.Parse(l, bare); err == nil {
			if !got.Equal(want) {
				t.Fatalf("parseStamp(%q) = %v; time.Parse(%q) = %v", s, got, l, want)
			}
			return
		}
	}
	t.Fatalf("parseStamp(%q) = %v; time.Parse reads it in none of the layouts", s, got)
}
