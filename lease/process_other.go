//go:build !unix

package lease

// processAlive cannot tell here: the predecessor's heartbeat is watched instead.
func processAlive(int) bool { return true }
