package server

import (
	"fmt"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	clv1 "github.com/clusterd/clusterd/gen/clusterlifecycle/v1"
)

// TestCodecMarshalsResponses: what the codec encodes decodes to the same
// message, for a response smaller than gRPC's pooling threshold and for
// pages of every size up to past the largest pooled buffer, each encoding
// after a larger one has returned its buffer to the pool; a message proto
// refuses to encode is an error.
func TestCodecMarshalsResponses(t *testing.T) {
	c := newRequestCodec()
	page := func(n int) *clv1.ListClustersResponse {
		resp := &clv1.ListClustersResponse{NextPageToken: "next"}
		for i := range n {
			resp.Clusters = append(resp.Clusters, &clv1.Cluster{
				Name: fmt.Sprintf("clusters/%08d", i), DisplayName: strings.Repeat("x", i%50),
				State: clv1.Cluster_RUNNING, WorkerNodeCount: int32(i % 7),
			})
		}
		return resp
	}
	for _, n := range []int{0, 1, 100, 3000, 20000, 100, 1, 3000} {
		want := page(n)
		data, err := c.Marshal(want)
		if err != nil {
			t.Fatalf("Marshal of %d clusters: %v", n, err)
		}
		got := &clv1.ListClustersResponse{}
		if err := proto.Unmarshal(data.Materialize(), got); err != nil || !proto.Equal(got, want) {
			t.Fatalf("%d clusters: decoded %d clusters, %v; want them as sent", n, len(got.GetClusters()), err)
		}
		if data.Len() != proto.Size(want) {
			t.Errorf("%d clusters: %d bytes sent; the message is %d", n, data.Len(), proto.Size(want))
		}
		data.Free()
	}
	for _, n := range []int{0, 3000} {
		bad := page(n)
		bad.NextPageToken = "\xff"
		if _, err := c.Marshal(bad); err == nil {
			t.Errorf("Marshal of %d clusters with a token that is not UTF-8: no error", n)
		}
	}
}
