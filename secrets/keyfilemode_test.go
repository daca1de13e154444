package secrets

import (
	"os"
	"testing"
)

// TestKeyFileMode: others never, a group's write never, a group's read
// only of a root-owned file in one of the server's own non-root groups (a
// Kubernetes Secret mounted with fsGroup).
func TestKeyFileMode(t *testing.T) {
	own := []int{65532, 1000}
	for _, tc := range []struct {
		perm             os.FileMode
		fileUID, fileGID int
		ok               bool
	}{
		{0o600, 1000, 1000, true},
		{0o400, 0, 0, true},
		{0o440, 0, 65532, true},     // fsGroup: root-owned, the pod's own group
		{0o640, 0, 65532, true},     // the same, writable by root
		{0o440, 0, 1000, true},      // a supplementary group of the server's
		{0o440, 1000, 65532, false}, // the server user's own file: its group may be shared
		{0o640, 1000, 1000, false},
		{0o440, 0, 0, false},       // root's group
		{0o440, 0, 100, false},     // a group not the server's
		{0o440, -1, -1, false},     // owner and group unknown
		{0o460, 0, 65532, false},   // group write
		{0o444, 0, 65532, false},   // others
		{0o602, 1000, 1000, false}, // others write
	} {
		err := keyFileMode(tc.perm, tc.fileUID, tc.fileGID, own)
		if (err == nil) != tc.ok {
			t.Errorf("keyFileMode(%04o, owner %d, group %d, own groups %v) = %v; want ok=%v", tc.perm, tc.fileUID, tc.fileGID, own, err, tc.ok)
		}
	}
}
