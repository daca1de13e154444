// Package version says which build of clusterd is running, for `--version`
// and the clusterd_build_info metric. `make build` stamps the version and
// commit with -ldflags; a plain `go build` or `go install` falls back to what
// the Go toolchain recorded in the binary (runtime/debug.ReadBuildInfo: the
// module version and the VCS revision).
package version

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// version and commit are set by the Makefile:
//
//	-ldflags "-X github.com/clusterd/clusterd/version.version=v1.2.3 -X github.com/clusterd/clusterd/version.commit=abc123"
var (
	version string
	commit  string
)

// Info is one build's identity.
type Info struct {
	// Version is the release (git describe), or the module version Go
	// recorded, or "devel".
	Version string
	// Commit is the VCS revision, with "-dirty" when the tree had changes,
	// or "unknown".
	Commit string
	// GoVersion is the toolchain that built the binary.
	GoVersion string
}

// Get returns this binary's Info.
func Get() Info {
	return resolve(version, commit, debug.ReadBuildInfo)
}

// resolve prefers the stamped values and fills what is missing from the
// build information.
func resolve(stampedVersion, stampedCommit string, read func() (*debug.BuildInfo, bool)) Info {
	info := Info{Version: stampedVersion, Commit: stampedCommit, GoVersion: runtime.Version()}
	if bi, ok := read(); ok {
		info.GoVersion = bi.GoVersion
		if info.Version == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			info.Version = bi.Main.Version
		}
		if info.Commit == "" {
			var rev string
			var modified bool
			for _, s := range bi.Settings {
				switch s.Key {
				case "vcs.revision":
					rev = s.Value
				case "vcs.modified":
					modified = s.Value == "true"
				}
			}
			if rev != "" && modified {
				rev += "-dirty"
			}
			info.Commit = rev
		}
	}
	if info.Version == "" {
		info.Version = "devel"
	}
	if info.Commit == "" {
		info.Commit = "unknown"
	}
	return info
}

// String is the line `--version` prints: "clusterd v1.2.3 (commit abc123, go1.26.8)".
func (i Info) String(program string) string {
	return fmt.Sprintf("%s %s (commit %s, %s)", program, i.Version, i.Commit, i.GoVersion)
}
