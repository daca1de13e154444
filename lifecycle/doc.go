// Package lifecycle is clusterd's cluster state machine: the states a
// cluster can be in, the events that move it, and the one table that says
// which moves are allowed (SPEC §1-§3).
//
// It is pure data and pure functions, in the manner of etcd's raft core: no
// I/O, no clock, no state that changes after init. Handlers, workers and the
// scanner all ask this package, and only this package, whether a move is
// allowed (SPEC §3.9), so the rules live in one place that can be tested
// exhaustively and cannot drift between callers. Persisting a move (the
// compare-and-set of SPEC §3.1) is the caller's business.
package lifecycle
