// Package deploy holds no code: its folder has what running clusterd takes
// (the image's Dockerfile, a systemd unit with its environment file and
// user, Kubernetes manifests), and its tests check those files offline: the
// unit with systemd-analyze, the manifests by decoding them strictly into
// the Kubernetes API's own Go types and checking how they refer to each
// other.
package deploy
