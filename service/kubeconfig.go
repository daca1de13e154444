package service

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/clusterd/clusterd/auth"
	clv1 "github.com/clusterd/clusterd/gen/clusterlifecycle/v1"
	"github.com/clusterd/clusterd/lifecycle"
	"github.com/clusterd/clusterd/repository"
	"github.com/clusterd/clusterd/secrets"
)

// ReasonKubeconfigUnavailable: GetKubeconfig of a cluster that has no
// endpoint yet, is DESTROYED, or has no credentials (FAILED_PRECONDITION).
const ReasonKubeconfigUnavailable = "KUBECONFIG_UNAVAILABLE"

// KubeconfigUnavailableError refuses GetKubeconfig of a cluster that cannot
// be reached with its credentials (yet, or any more).
type KubeconfigUnavailableError struct {
	Cluster string
	Why     string
}

// Error says why.
func (e *KubeconfigUnavailableError) Error() string {
	return fmt.Sprintf("no kubeconfig for %s: %s", e.Cluster, e.Why)
}

// sealCredentials makes a new cluster's CA and admin client certificate
// and seals them for cluster id under the current key: the rows
// CreateCluster inserts with the cluster.
func (s *Clusters) sealCredentials(id string) ([]repository.Secret, error) {
	creds, err := secrets.NewCredentials(s.now())
	if err != nil {
		return nil, fmt.Errorf("cluster credentials: %w", err)
	}
	var out []repository.Secret
	for _, p := range []struct {
		kind      string
		cert, key []byte
	}{{secrets.KindCA, creds.CACert, creds.CAKey}, {secrets.KindAdmin, creds.AdminCert, creds.AdminKey}} {
		sealed, err := s.secrets.Seal(secrets.Bundle(p.cert, p.key), secrets.AAD(id, p.kind))
		if err != nil {
			return nil, fmt.Errorf("seal cluster %s: %w", p.kind, err)
		}
		out = append(out, repository.Secret{ClusterID: id, Kind: p.kind, KeyID: sealed.KeyID, Nonce: sealed.Nonce, Ciphertext: sealed.Ciphertext})
	}
	return out, nil
}

// openSecret opens one of a cluster's sealed secrets: its certificate and
// key (PEM).
func (s *Clusters) openSecret(sec repository.Secret) (cert, key []byte, err error) {
	plain, err := s.secrets.Open(secrets.Sealed{KeyID: sec.KeyID, Nonce: sec.Nonce, Ciphertext: sec.Ciphertext}, secrets.AAD(sec.ClusterID, sec.Kind))
	if err != nil {
		return nil, nil, fmt.Errorf("cluster %s secret %s: %w", sec.ClusterID, sec.Kind, err)
	}
	return secrets.SplitBundle(plain)
}

// GetKubeconfig returns the cluster's admin kubeconfig, to the cluster's
// account and admins only (NOT_FOUND for others, as GetCluster), recording
// the read, and who made it, in the cluster's history before answering.
func (s *Clusters) GetKubeconfig(ctx context.Context, req *clv1.GetKubeconfigRequest) (*clv1.Kubeconfig, error) {
	who, err := caller(ctx)
	if err != nil {
		return nil, err
	}
	c, err := s.visibleCluster(ctx, "name", req.GetName())
	if err != nil {
		return nil, err
	}
	switch {
	case c.State == lifecycle.Destroyed:
		return nil, &KubeconfigUnavailableError{Cluster: req.GetName(), Why: "the cluster is DESTROYED"}
	case c.Endpoint == "":
		return nil, &KubeconfigUnavailableError{Cluster: req.GetName(), Why: "the cluster has no API endpoint yet (state " + c.State.String() + ")"}
	}
	rows, err := s.store.ClusterSecrets(ctx, c.ID, &repository.Event{
		From: c.State, To: c.State, Name: repository.KubeconfigRead, Server: s.serverID, Message: "kubeconfig read by " + describe(who),
	})
	if err != nil {
		return nil, err
	}
	found := map[string]repository.Secret{}
	for _, r := range rows {
		found[r.Kind] = r
	}
	ca, okCA := found[secrets.KindCA]
	admin, okAdmin := found[secrets.KindAdmin]
	if !okCA || !okAdmin {
		return nil, &KubeconfigUnavailableError{Cluster: req.GetName(), Why: "clusterd holds no credentials for it (created before it kept them)"}
	}
	caCert, _, err := s.openSecret(ca)
	if err != nil {
		return nil, err
	}
	adminCert, adminKey, err := s.openSecret(admin)
	if err != nil {
		return nil, err
	}
	k := Kubeconfig{Name: c.DisplayName, Server: apiURL(c.Endpoint), CA: caCert, ClientCert: adminCert, ClientKey: adminKey}
	doc, err := k.YAML()
	if err != nil {
		return nil, err
	}
	s.log.InfoContext(ctx, "kubeconfig read", "cluster", c.ID, "by", describe(who))
	return &clv1.Kubeconfig{Kubeconfig: doc, Server: k.Server, CertificateAuthority: string(caCert), Context: k.ContextName()}, nil
}

// describe names a caller in the history: its account, its role, and
// where its identity came from.
func describe(id auth.Identity) string {
	d := fmt.Sprintf("%s (%s", id.Account, id.Role)
	if id.All {
		d = fmt.Sprintf("admin of every account (%s", id.Role)
	}
	if id.Subject != "" {
		d += ", " + id.Subject
	}
	return d + ")"
}

// apiURL is the API server's URL of an endpoint (the drivers report one
// with its scheme; a bare host:port is https).
func apiURL(endpoint string) string {
	if strings.Contains(endpoint, "://") {
		return endpoint
	}
	return "https://" + endpoint
}

// Kubeconfig is one cluster's admin kubeconfig: its API server and CA, and
// a client certificate and key.
type Kubeconfig struct {
	// Name is the kubeconfig's cluster name (the cluster's display name).
	Name       string
	Server     string
	CA         []byte
	ClientCert []byte
	ClientKey  []byte
}

// ContextName is the name of the kubeconfig's context and user, kubeadm's
// way: kubernetes-admin@<cluster>.
func (k Kubeconfig) ContextName() string { return secrets.AdminCommonName + "@" + k.Name }

// kubeconfigFile is the part of client-go's clientcmd/api/v1 Config that
// clusterd writes, with its field names, so kubectl and clientcmd.Load read
// it (byte fields are base64, as clientcmd's JSON has them).
type kubeconfigFile struct {
	APIVersion     string         `yaml:"apiVersion"`
	Kind           string         `yaml:"kind"`
	Clusters       []namedCluster `yaml:"clusters"`
	Users          []namedUser    `yaml:"users"`
	Contexts       []namedContext `yaml:"contexts"`
	CurrentContext string         `yaml:"current-context"`
	Preferences    struct{}       `yaml:"preferences"`
}

type namedCluster struct {
	Name    string `yaml:"name"`
	Cluster struct {
		Server                   string `yaml:"server"`
		CertificateAuthorityData string `yaml:"certificate-authority-data"`
	} `yaml:"cluster"`
}

type namedUser struct {
	Name string `yaml:"name"`
	User struct {
		ClientCertificateData string `yaml:"client-certificate-data"`
		ClientKeyData         string `yaml:"client-key-data"`
	} `yaml:"user"`
}

type namedContext struct {
	Name    string `yaml:"name"`
	Context struct {
		Cluster string `yaml:"cluster"`
		User    string `yaml:"user"`
	} `yaml:"context"`
}

// YAML renders k as a kubeconfig file (apiVersion v1, kind Config).
func (k Kubeconfig) YAML() (string, error) {
	if k.Name == "" || k.Server == "" {
		return "", errors.New("kubeconfig: no cluster name or server")
	}
	b64 := base64.StdEncoding.EncodeToString
	var c namedCluster
	c.Name = k.Name
	c.Cluster.Server = k.Server
	c.Cluster.CertificateAuthorityData = b64(k.CA)
	var u namedUser
	u.Name = k.ContextName()
	u.User.ClientCertificateData = b64(k.ClientCert)
	u.User.ClientKeyData = b64(k.ClientKey)
	var x namedContext
	x.Name = k.ContextName()
	x.Context.Cluster = k.Name
	x.Context.User = u.Name
	out, err := yaml.Marshal(kubeconfigFile{
		APIVersion: "v1", Kind: "Config", Clusters: []namedCluster{c}, Users: []namedUser{u},
		Contexts: []namedContext{x}, CurrentContext: x.Name,
	})
	if err != nil {
		return "", fmt.Errorf("kubeconfig: %w", err)
	}
	return string(out), nil
}
