package secrets

import (
	"os"
	"testing"
)

// TestKeyFileMode: others never; a group only when it is the server's own,
// non-root group (a Kubernetes Secret mounted with fsGroup).
func TestKeyFileMode(t *testing.T) {
	for _, tc := range []struct {
		perm           os.FileMode
		fileGID, ownID int
		ok             bool
	}{
		{0o600, 0, 0, true},
		{0o400, 65532, 65532, true},
		{0o440, 65532, 65532, true},  // fsGroup: the pod's own group
		{0o640, 65532, 65532, true},  // the same, writable by its owner
		{0o440, 0, 0, false},         // root's group
		{0o440, 100, 65532, false},   // another group
		{0o440, -1, 65532, false},    // a group it cannot tell
		{0o444, 65532, 65532, false}, // others
		{0o602, 0, 0, false},
	} {
		err := keyFileMode(tc.perm, tc.fileGID, tc.ownID)
		if (err == nil) != tc.ok {
			t.Errorf("keyFileMode(%04o, file group %d, own group %d) = %v; want ok=%v", tc.perm, tc.fileGID, tc.ownID, err, tc.ok)
		}
	}
}
