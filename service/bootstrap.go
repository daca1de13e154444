package service

import (
	"context"
	"fmt"

	"github.com/clusterd/clusterd/infra"
	"github.com/clusterd/clusterd/secrets"
)

// nodeCredentials is what a machine of role is handed at its join: the
// cluster's CA certificate, and, for a control node (kubeadm's init), the
// CA's key too. A cluster created before clusterd kept credentials hands
// nothing. The CA is read and opened once per operation.
func (o *op) nodeCredentials(ctx context.Context, role infra.Role) (infra.NodeCredentials, error) {
	if o.ca == nil {
		rows, err := o.s.store.ClusterSecrets(ctx, o.job.ResourceID, nil)
		if err != nil {
			return infra.NodeCredentials{}, err
		}
		ca := infra.NodeCredentials{}
		for _, r := range rows {
			if r.Kind != secrets.KindCA {
				continue
			}
			cert, key, err := o.s.openSecret(r)
			if err != nil {
				return infra.NodeCredentials{}, fmt.Errorf("bootstrap credentials: %w", err)
			}
			ca = infra.NodeCredentials{CACert: cert, CAKey: key}
		}
		o.ca = &ca
	}
	if role == infra.RoleControl {
		return *o.ca, nil
	}
	return infra.NodeCredentials{CACert: o.ca.CACert}, nil
}

// joinNode is the join_node step of machine id of role: the join, handed
// the credentials a node of that role gets.
func (o *op) joinNode(ctx context.Context, id string, role infra.Role, version string) error {
	creds, err := o.nodeCredentials(ctx, role)
	if err != nil {
		return err
	}
	return o.do(ctx, infra.StepJoinNode, func() error { return o.s.infra.JoinNode(ctx, o.call(id), version, creds) })
}
