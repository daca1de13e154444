package server

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
	"google.golang.org/grpc/codes"

	clv1 "github.com/clusterd/clusterd/gen/clusterlifecycle/v1"
	"github.com/clusterd/clusterd/infra"
	"github.com/clusterd/clusterd/infra/sim"
	"github.com/clusterd/clusterd/repository"
	"github.com/clusterd/clusterd/repository/repotest"
	"github.com/clusterd/clusterd/service"
)

// testKey is the key of testKeyFile: the dump test looks for its bytes.
var testKey = bytes.Repeat([]byte{0x5a, 0xc3, 0x17, 0x88}, 8)

// testKeyFile writes a secrets key file (mode 0600) holding testKey.
func testKeyFile(t testing.TB) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "secrets.key")
	if err := os.WriteFile(path, []byte("test1 "+base64.StdEncoding.EncodeToString(testKey)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// kubeconfigDoc is what client-go's clientcmd reads of a kubeconfig (its
// api/v1 field names), parsed here without client-go.
type kubeconfigDoc struct {
	APIVersion string `yaml:"apiVersion"`
	Kind       string `yaml:"kind"`
	Clusters   []struct {
		Name    string `yaml:"name"`
		Cluster struct {
			Server string `yaml:"server"`
			CA     string `yaml:"certificate-authority-data"`
		} `yaml:"cluster"`
	} `yaml:"clusters"`
	Users []struct {
		Name string `yaml:"name"`
		User struct {
			Cert string `yaml:"client-certificate-data"`
			Key  string `yaml:"client-key-data"`
		} `yaml:"user"`
	} `yaml:"users"`
	Contexts []struct {
		Name    string `yaml:"name"`
		Context struct {
			Cluster string `yaml:"cluster"`
			User    string `yaml:"user"`
		} `yaml:"context"`
	} `yaml:"contexts"`
	CurrentContext string `yaml:"current-context"`
}

// checkKubeconfig parses a kubeconfig as clientcmd would and checks that it
// is whole: one cluster at endpoint, one user whose certificate the
// cluster's CA signed for client auth as kubernetes-admin/system:masters,
// whose key is the certificate's, and a current context joining them. It
// returns the admin key (PEM).
func checkKubeconfig(t *testing.T, doc, endpoint string) []byte {
	t.Helper()
	var k kubeconfigDoc
	if err := yaml.Unmarshal([]byte(doc), &k); err != nil {
		t.Fatalf("kubeconfig is not YAML: %v\n%s", err, doc)
	}
	if k.APIVersion != "v1" || k.Kind != "Config" || len(k.Clusters) != 1 || len(k.Users) != 1 || len(k.Contexts) != 1 {
		t.Fatalf("kubeconfig shape: %+v", k)
	}
	ctx := k.Contexts[0]
	if k.CurrentContext != ctx.Name || ctx.Context.Cluster != k.Clusters[0].Name || ctx.Context.User != k.Users[0].Name {
		t.Fatalf("context %+v does not join cluster %q and user %q (current %q)", ctx, k.Clusters[0].Name, k.Users[0].Name, k.CurrentContext)
	}
	if got := k.Clusters[0].Cluster.Server; got != endpoint {
		t.Errorf("server %q; want the cluster's endpoint %q", got, endpoint)
	}
	dec := func(field, s string) []byte {
		b, err := base64.StdEncoding.DecodeString(s)
		if err != nil {
			t.Fatalf("%s is not base64: %v", field, err)
		}
		return b
	}
	caPEM := dec("certificate-authority-data", k.Clusters[0].Cluster.CA)
	certPEM := dec("client-certificate-data", k.Users[0].User.Cert)
	keyPEM := dec("client-key-data", k.Users[0].User.Key)
	if _, err := tls.X509KeyPair(certPEM, keyPEM); err != nil {
		t.Fatalf("client key does not match its certificate: %v", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		t.Fatal("certificate-authority-data holds no certificate")
	}
	blk, _ := pem.Decode(certPEM)
	cert, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cert.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Fatalf("the client certificate does not verify against the cluster's CA: %v", err)
	}
	if cert.Subject.CommonName != "kubernetes-admin" || fmt.Sprint(cert.Subject.Organization) != "[system:masters]" {
		t.Errorf("client certificate subject %v", cert.Subject)
	}
	return keyPEM
}

func TestGetKubeconfig(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b repotest.Backend) {
		h := start(t, b, withTokens(t))
		ctx := tctx(t)
		asA, asB, asAdmin := bearerContext(ctx, tokenA), bearerContext(ctx, tokenB), bearerContext(ctx, tokenAdmin)
		op, err := h.clients.clusters.CreateCluster(asA, &clv1.CreateClusterRequest{Cluster: &clv1.Cluster{
			DisplayName: "web", KubernetesVersion: "1.30.2", WorkerNodeCount: 1, ServiceOffering: "medium"}})
		if err != nil {
			t.Fatal(err)
		}
		done := h.wait(t, op)
		c := &clv1.Cluster{}
		if err := done.GetResponse().UnmarshalTo(c); err != nil {
			t.Fatalf("create: %v %v", err, done.GetError())
		}
		got, err := h.clients.clusters.GetKubeconfig(asA, &clv1.GetKubeconfigRequest{Name: c.GetName()})
		if err != nil {
			t.Fatalf("owner's GetKubeconfig: %v", err)
		}
		checkKubeconfig(t, got.GetKubeconfig(), c.GetEndpoint())
		if got.GetServer() != c.GetEndpoint() || !strings.Contains(got.GetCertificateAuthority(), "BEGIN CERTIFICATE") || got.GetContext() != "kubernetes-admin@web" {
			t.Errorf("structured fields: server %q, context %q", got.GetServer(), got.GetContext())
		}
		again, err := h.clients.clusters.GetKubeconfig(asAdmin, &clv1.GetKubeconfigRequest{Name: c.GetName()})
		if err != nil {
			t.Fatalf("admin's GetKubeconfig: %v", err)
		}
		if again.GetKubeconfig() != got.GetKubeconfig() {
			t.Error("two reads give two kubeconfigs")
		}
		_, err = h.clients.clusters.GetKubeconfig(asB, &clv1.GetKubeconfigRequest{Name: c.GetName()})
		if code, reason, _ := errorInfo(t, err); code != codes.NotFound || reason != service.ReasonNotFound {
			t.Errorf("another account's GetKubeconfig: %v %s; want NOT_FOUND", code, reason)
		}
		// Every read is in the history, naming the caller; the refused one is not.
		evs, err := h.clients.clusters.ListClusterEvents(asA, &clv1.ListClusterEventsRequest{Parent: c.GetName(), PageSize: 100})
		if err != nil {
			t.Fatal(err)
		}
		var reads []string
		for _, e := range evs.GetEvents() {
			if e.GetEvent() == repository.KubeconfigRead {
				reads = append(reads, e.GetMessage())
			}
		}
		if len(reads) != 2 || !strings.Contains(reads[0], "team-a") || !strings.Contains(reads[1], "admin") {
			t.Errorf("KUBECONFIG_READ entries %q; want the owner's, then the admin's", reads)
		}

		// A cluster without an endpoint yet: FAILED_PRECONDITION.
		fresh, _, err := h.seed.CreateCluster(ctx, repository.NewCluster{Account: "team-a", DisplayName: "fresh",
			Spec: repository.Spec{KubernetesVersion: "1.30.2", ControlNodeCount: 1, ServiceOffering: "medium"}},
			repository.NewJob{Kind: "create", ServerID: "test-server", ServerIncarnation: h.srv.self.Incarnation, Deadline: time.Now().Add(time.Hour)})
		if err != nil {
			t.Fatal(err)
		}
		_, err = h.clients.clusters.GetKubeconfig(asA, &clv1.GetKubeconfigRequest{Name: "clusters/" + fresh.ID})
		if code, reason, _ := errorInfo(t, err); code != codes.FailedPrecondition || reason != service.ReasonKubeconfigUnavailable {
			t.Errorf("GetKubeconfig without an endpoint: %v %s; want FAILED_PRECONDITION", code, reason)
		}

		// Destroyed: FAILED_PRECONDITION, and no secret left in the database.
		del, err := h.clients.clusters.DeleteCluster(asA, &clv1.DeleteClusterRequest{Name: c.GetName()})
		if err != nil {
			t.Fatal(err)
		}
		if d := h.wait(t, del); d.GetError() != nil {
			t.Fatalf("delete: %v", d.GetError())
		}
		_, err = h.clients.clusters.GetKubeconfig(asA, &clv1.GetKubeconfigRequest{Name: c.GetName()})
		if code, reason, _ := errorInfo(t, err); code != codes.FailedPrecondition || reason != service.ReasonKubeconfigUnavailable {
			t.Errorf("GetKubeconfig of a DESTROYED cluster: %v %s; want FAILED_PRECONDITION", code, reason)
		}
		left, err := h.seed.ClusterSecrets(ctx, strings.TrimPrefix(c.GetName(), "clusters/"), nil)
		if err != nil || len(left) != 0 {
			t.Errorf("secrets of the DESTROYED cluster: %d rows, %v; want none", len(left), err)
		}
	})
}

func TestGetKubeconfigOverREST(t *testing.T) {
	h := start(t, repotest.Backends(t)[0])
	c := h.create(t, "web", 1)
	code, body := h.restCall(t, "GET", "/v1/"+c.GetName()+":kubeconfig", nil)
	if code != 200 {
		t.Fatalf("GET :kubeconfig = %d %v", code, body)
	}
	doc, _ := body["kubeconfig"].(string)
	checkKubeconfig(t, doc, c.GetEndpoint())
	if body["server"] != c.GetEndpoint() || body["context"] != "kubernetes-admin@web" {
		t.Errorf("GET :kubeconfig fields %v", body)
	}
	code, body = h.restCall(t, "GET", "/v1/clusters/0192f0c1-7a3e-7000-8000-000000000000:kubeconfig", nil)
	if code != 404 {
		t.Errorf("GET :kubeconfig of a missing cluster = %d %v; want 404", code, body)
	}
}

// A dump of the database holds no private key in the clear: every row of
// every table is scanned for a PEM private key, the admin key's bytes and
// the secrets key's bytes, after a create and a kubeconfig read.
func TestDatabaseHoldsNoKeyInTheClear(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b repotest.Backend) {
		h := start(t, b, func(c *Config) { c.SecretsKeyFile = testKeyFile(t) })
		c := h.create(t, "web", 1)
		got, err := h.clients.clusters.GetKubeconfig(tctx(t), &clv1.GetKubeconfigRequest{Name: c.GetName()})
		if err != nil {
			t.Fatal(err)
		}
		adminKey := checkKubeconfig(t, got.GetKubeconfig(), c.GetEndpoint())
		blk, _ := pem.Decode(adminKey)
		needles := map[string][]byte{
			"PEM private key":           []byte("PRIVATE KEY"),
			"admin key (DER)":           blk.Bytes,
			"admin key (base64)":        []byte(base64.StdEncoding.EncodeToString(adminKey)),
			"secrets key":               testKey,
			"secrets key (base64)":      []byte(base64.StdEncoding.EncodeToString(testKey)),
			"admin key (DER, 16 bytes)": blk.Bytes[7:23], // the private scalar's first bytes
		}
		ctx := tctx(t)
		list := "SELECT name FROM sqlite_master WHERE type = 'table'"
		if h.seed.Backend() == repository.MySQL {
			list = "SELECT table_name FROM information_schema.tables WHERE table_schema = DATABASE()"
		}
		rows, err := h.seed.Conn().QueryContext(ctx, list)
		if err != nil {
			t.Fatal(err)
		}
		var tables []string
		for rows.Next() {
			var name string
			if err := rows.Scan(&name); err != nil {
				t.Fatal(err)
			}
			tables = append(tables, name)
		}
		rows.Close()
		scanned, sawSecrets := 0, false
		for _, table := range tables {
			rows, err := h.seed.Conn().QueryContext(ctx, "SELECT * FROM "+table)
			if err != nil {
				t.Fatalf("dump %s: %v", table, err)
			}
			cols, _ := rows.Columns()
			for rows.Next() {
				vals := make([]any, len(cols))
				ptrs := make([]any, len(cols))
				for i := range vals {
					ptrs[i] = &vals[i]
				}
				if err := rows.Scan(ptrs...); err != nil {
					t.Fatal(err)
				}
				scanned++
				sawSecrets = sawSecrets || table == "cluster_secrets"
				for i, v := range vals {
					var raw []byte
					switch v := v.(type) {
					case []byte:
						raw = v
					case string:
						raw = []byte(v)
					default:
						raw = []byte(fmt.Sprint(v))
					}
					for what, needle := range needles {
						if bytes.Contains(raw, needle) {
							t.Errorf("table %s column %s holds the %s in the clear", table, cols[i], what)
						}
					}
				}
			}
			rows.Close()
		}
		if !sawSecrets || scanned == 0 {
			t.Fatalf("scanned %d rows of %v; no cluster_secrets row among them", scanned, tables)
		}
	})
}

// The bootstrap hands the cluster's CA to its nodes: the control node's
// join (kubeadm's init) gets the certificate and key, the workers' the
// certificate only, as the simulator records.
func TestBootstrapHandsTheCAToTheNodes(t *testing.T) {
	h := start(t, repotest.Backends(t)[0])
	c := h.create(t, "web", 2)
	k, err := h.clients.clusters.GetKubeconfig(tctx(t), &clv1.GetKubeconfigRequest{Name: c.GetName()})
	if err != nil {
		t.Fatal(err)
	}
	machines, err := h.srv.sim.Machines(tctx(t), strings.TrimPrefix(c.GetName(), "clusters/"))
	if err != nil || len(machines) != 3 {
		t.Fatalf("machines: %d, %v", len(machines), err)
	}
	for _, m := range machines {
		got, ok := h.srv.sim.Received(m.ID)
		if !ok {
			t.Errorf("machine %s (%s) never joined", m.ID, m.Role)
			continue
		}
		if got.CACert != sim.Fingerprint([]byte(k.GetCertificateAuthority())) {
			t.Errorf("machine %s (%s) was handed another CA certificate", m.ID, m.Role)
		}
		if want := m.Role == infra.RoleControl; got.CAKey != want {
			t.Errorf("machine %s (%s) handed the CA key: %v; want %v", m.ID, m.Role, got.CAKey, want)
		}
	}
}
