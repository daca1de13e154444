// Package agent is the node agent that runs in every machine clusterd
// drives through a real hypervisor, and the host's client for it. The host
// and the guest talk over one byte stream (a virtio-serial port in the
// guest, a unix socket on the host); the infrastructure driver turns each
// Kubernetes-level step (join_node, upgrade_node, drain_node, uncordon_node,
// delete_node, wait_api, fetch_kubeconfig, deploy_provider,
// deploy_autoscaler) into one request.
//
// # What the agent stands in for
//
// Kubernetes itself is not installed on these machines. The agent keeps, on
// the machine's own disk, what a node would know about itself (the cluster
// it joined, the Kubernetes version installed, whether it is cordoned, the
// add-ons deployed through it) and enforces the same preconditions a real
// node would: a version can only be installed from the binaries ISO
// attached to the machine, and only a joined node can be drained, upgraded
// or asked for a kubeconfig. This protocol is the seam where a kubeadm
// bootstrap goes: join becomes `kubeadm init`/`kubeadm join` with the
// binaries from the ISO, upgrade becomes `kubeadm upgrade node` and a kubelet
// restart, drain/uncordon become the API calls of `kubectl drain`/`uncordon`,
// leave becomes `kubeadm reset`, kubeconfig returns admin.conf, and deploy
// applies the add-on's manifests. The host side does not change.
//
// # Protocol
//
// Newline-delimited JSON, one request and then its response, in order. A
// request:
//
//	{"id":1,"op":"join","cluster":"c-1","version":"1.31.2","name":""}
//
// and its response, which always carries the node's status after the
// request (also when it failed):
//
//	{"id":1,"ok":true,"error":"","status":{"machine":"m-1","cluster":"c-1",
//	 "version":"1.31.2","iso_version":"1.31.2","joined":true,"cordoned":false},
//	 "kubeconfig":""}
//
// The ops (every one idempotent: repeating a request that succeeded succeeds
// and changes nothing more):
//
//   - status: changes nothing.
//   - join(cluster, version): installs version from the attached ISO (an
//     error if the ISO does not hold it, unless that version is already
//     installed) and joins cluster. A node joined to another cluster, or to
//     this one at another version, refuses.
//   - upgrade(version): installs version from the ISO (same rule) and
//     uncordons the node. Requires joined.
//   - drain: cordons the node. Requires joined.
//   - uncordon: uncordons the node. Requires joined.
//   - leave: forgets the cluster (delete_node); the installed version stays.
//   - kubeconfig: returns a kubeconfig for the cluster. Requires joined.
//   - deploy(name): records that add-on name ("provider" or "autoscaler")
//     is deployed. Requires joined.
//
// A line that is not a request gets a response with id 0 and ok false; the
// connection stays usable.
//
// # Devices in the guest
//
// The guest agent (cmd/clusterd-agent) serves on the virtio-serial port
// named PortName, keeps its state on the first virtio disk (/dev/vda, raw,
// no filesystem: see DiskStore) and reads VERSION from the ISO9660 image in
// the first cdrom (/dev/sr0: see ISOFile). The node image's kernel (Debian's
// cloud kernel) has no AHCI driver, so the cdrom must sit on a virtio-scsi
// controller. The machine id comes from the kernel command line
// (clusterd.machine=ID).
package agent

import "fmt"

// PortName is the virtio-serial port the guest agent serves on; the host
// names its channel the same (libvirt: <target type='virtio' name=.../>).
const PortName = "org.clusterd.agent.0"

// Ops, as they travel in Request.Op.
const (
	OpStatus     = "status"
	OpJoin       = "join"
	OpUpgrade    = "upgrade"
	OpDrain      = "drain"
	OpUncordon   = "uncordon"
	OpLeave      = "leave"
	OpKubeconfig = "kubeconfig"
	OpDeploy     = "deploy"
)

// Add-ons a deploy request may name.
const (
	AddonProvider   = "provider"
	AddonAutoscaler = "autoscaler"
)

// Request is one line from the host. Fields an op does not use are empty.
type Request struct {
	// ID is echoed in the response, so a client can tell its answer from
	// one owed to an earlier, abandoned request.
	ID      uint64 `json:"id"`
	Op      string `json:"op"`
	Cluster string `json:"cluster"` // join
	Version string `json:"version"` // join, upgrade
	Name    string `json:"name"`    // deploy
	// CACert and CAKey (PEM) are the cluster's CA, handed over on join: a
	// control node's init gets both, a worker's join the certificate only.
	// The agent stores them under Config.PKIDir (ca.crt, ca.key 0600).
	CACert string `json:"ca_cert,omitempty"` // join
	CAKey  string `json:"ca_key,omitempty"`  // join (control nodes)
}

// Response is the agent's answer to the request with the same ID.
type Response struct {
	ID         uint64 `json:"id"`
	OK         bool   `json:"ok"`
	Error      string `json:"error"`
	Status     Status `json:"status"`
	Kubeconfig string `json:"kubeconfig"`
}

// Status is what the node reports about itself, so the host can check a
// step's effect (and reconcile) without keeping its own copy.
type Status struct {
	// Machine is the machine id the guest was booted with.
	Machine string `json:"machine"`
	// Cluster is the cluster joined, empty when not joined.
	Cluster string `json:"cluster"`
	// Version is the Kubernetes version installed, empty before the first
	// install; it stays after a leave.
	Version string `json:"version"`
	// ISOVersion is the version on the attached ISO, empty without one.
	ISOVersion string `json:"iso_version"`
	// Joined is whether the node is a member of Cluster.
	Joined bool `json:"joined"`
	// Cordoned is whether the node takes no new work (drained).
	Cordoned bool `json:"cordoned"`
}

// Error is an agent's refusal of a request (ok false), as opposed to a
// failure to reach the agent, so a driver can tell "the node said no"
// (retrying will not help) from "the channel broke" (it may).
type Error struct {
	Op      string
	Message string
}

// Error reads "agent OP: MESSAGE".
func (e *Error) Error() string {
	return fmt.Sprintf("agent %s: %s", e.Op, e.Message)
}
