package version

import (
	"runtime/debug"
	"strings"
	"testing"
)

func TestResolve(t *testing.T) {
	built := func(mainVersion string, settings ...debug.BuildSetting) func() (*debug.BuildInfo, bool) {
		return func() (*debug.BuildInfo, bool) {
			return &debug.BuildInfo{GoVersion: "go1.99.1", Main: debug.Module{Version: mainVersion}, Settings: settings}, true
		}
	}
	none := func() (*debug.BuildInfo, bool) { return nil, false }
	rev := debug.BuildSetting{Key: "vcs.revision", Value: "0123abcd"}
	dirty := debug.BuildSetting{Key: "vcs.modified", Value: "true"}
	for _, tc := range []struct {
		name             string
		version, commit  string
		read             func() (*debug.BuildInfo, bool)
		wantVer, wantRev string
	}{
		{"stamped by make build", "v1.2.3", "feedface", built("(devel)", rev), "v1.2.3", "feedface"},
		{"go build in a clean checkout", "", "", built("(devel)", rev), "devel", "0123abcd"},
		{"go build with changes", "", "", built("(devel)", rev, dirty), "devel", "0123abcd-dirty"},
		{"go install of a release", "", "", built("v1.4.0"), "v1.4.0", "unknown"},
		{"no build information", "", "", none, "devel", "unknown"},
	} {
		got := resolve(tc.version, tc.commit, tc.read)
		if got.Version != tc.wantVer || got.Commit != tc.wantRev || got.GoVersion == "" {
			t.Errorf("%s: %+v; want version %s, commit %s", tc.name, got, tc.wantVer, tc.wantRev)
		}
	}
}

func TestString(t *testing.T) {
	got := Info{Version: "v1.2.3", Commit: "abc", GoVersion: "go1.26.8"}.String("clusterd")
	if got != "clusterd v1.2.3 (commit abc, go1.26.8)" {
		t.Errorf("String = %q", got)
	}
	if s := Get().String("x"); !strings.HasPrefix(s, "x ") || !strings.Contains(s, "go1.") {
		t.Errorf("Get().String = %q; want the program, a version and the Go version", s)
	}
}
