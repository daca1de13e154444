package service

import (
	"context"

	"cloud.google.com/go/longrunning/autogen/longrunningpb"

	clv1 "github.com/clusterd/clusterd/gen/clusterlifecycle/v1"
)

// The mutating RPCs land with the operations work (issue 3). Until then they
// answer UNIMPLEMENTED and say so, rather than the generated stub's bare
// "method not implemented".
const pendingDetail = "cluster operations are not available in this build yet; reads, history and the Operations service work"

func pending(method string) error { return &NotImplementedError{Method: method, Detail: pendingDetail} }

// CreateCluster is not available yet.
func (s *Clusters) CreateCluster(context.Context, *clv1.CreateClusterRequest) (*longrunningpb.Operation, error) {
	return nil, pending("CreateCluster")
}

// StartCluster is not available yet.
func (s *Clusters) StartCluster(context.Context, *clv1.StartClusterRequest) (*longrunningpb.Operation, error) {
	return nil, pending("StartCluster")
}

// StopCluster is not available yet.
func (s *Clusters) StopCluster(context.Context, *clv1.StopClusterRequest) (*longrunningpb.Operation, error) {
	return nil, pending("StopCluster")
}

// ScaleCluster is not available yet.
func (s *Clusters) ScaleCluster(context.Context, *clv1.ScaleClusterRequest) (*longrunningpb.Operation, error) {
	return nil, pending("ScaleCluster")
}

// UpgradeCluster is not available yet.
func (s *Clusters) UpgradeCluster(context.Context, *clv1.UpgradeClusterRequest) (*longrunningpb.Operation, error) {
	return nil, pending("UpgradeCluster")
}

// AddNodes is not available yet.
func (s *Clusters) AddNodes(context.Context, *clv1.AddNodesRequest) (*longrunningpb.Operation, error) {
	return nil, pending("AddNodes")
}

// RemoveNodes is not available yet.
func (s *Clusters) RemoveNodes(context.Context, *clv1.RemoveNodesRequest) (*longrunningpb.Operation, error) {
	return nil, pending("RemoveNodes")
}

// DeleteCluster is not available yet.
func (s *Clusters) DeleteCluster(context.Context, *clv1.DeleteClusterRequest) (*longrunningpb.Operation, error) {
	return nil, pending("DeleteCluster")
}
