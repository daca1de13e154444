package deploy

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"
)

// TestSystemdUnit verifies clusterd.service with systemd-analyze: no error
// and no warning (an unknown or misspelt directive is only a warning, and
// would silently drop a hardening line), and an exposure level of at most
// 2.0 ("OK") by systemd-analyze security.
func TestSystemdUnit(t *testing.T) {
	if _, err := exec.LookPath("systemd-analyze"); err != nil {
		skipOrFail(t, "systemd-analyze is not installed: %v", err)
	}
	unit, err := os.ReadFile(filepath.Join("systemd", "clusterd.service"))
	if err != nil {
		t.Fatal(err)
	}
	// verify wants ExecStart's program to exist: any executable stands in
	// for /usr/local/bin/clusterd.
	text := strings.Replace(string(unit), "ExecStart=/usr/local/bin/clusterd", "ExecStart=/bin/true", 1)
	if text == string(unit) {
		t.Fatal("clusterd.service does not start /usr/local/bin/clusterd")
	}
	path := filepath.Join(t.TempDir(), "clusterd.service")
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("systemd-analyze", "verify", path).CombinedOutput()
	if err != nil || len(bytes.TrimSpace(out)) > 0 {
		t.Errorf("systemd-analyze verify clusterd.service: %v\n%s", err, out)
	}
	out, err = exec.Command("systemd-analyze", "security", "--offline=true", "--threshold=20", path).CombinedOutput()
	if err != nil {
		t.Errorf("systemd-analyze security clusterd.service: exposure over 2.0 (%v):\n%s", err, out)
	}
	for _, want := range []string{"ProtectSystem=strict", "Restart=on-failure", "StateDirectory=clusterd", "User=clusterd", "EnvironmentFile=/etc/clusterd/clusterd.env"} {
		if !strings.Contains(string(unit), "\n"+want+"\n") {
			t.Errorf("clusterd.service has no %s", want)
		}
	}
	sysusers, err := os.ReadFile(filepath.Join("systemd", "clusterd.sysusers"))
	if err != nil || !strings.Contains(string(sysusers), "\nu clusterd ") {
		t.Errorf("clusterd.sysusers does not make the user clusterd (%v)", err)
	}
}

// manifests decodes every document of deploy/kubernetes strictly: a field
// the Kubernetes API does not have, or a value of the wrong type, fails.
type manifests struct {
	deployments []*appsv1.Deployment
	services    []*corev1.Service
	secrets     []*corev1.Secret
	pdbs        []*policyv1.PodDisruptionBudget
	files       []string // the kustomization's resources
	images      []string // the images the kustomization points elsewhere
}

func load(t *testing.T) *manifests {
	t.Helper()
	m := &manifests{}
	paths, err := filepath.Glob(filepath.Join("kubernetes", "*.yaml"))
	if err != nil || len(paths) == 0 {
		t.Fatalf("no manifests in deploy/kubernetes: %v", err)
	}
	for _, path := range paths {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		for i, doc := range strings.Split(string(data), "\n---\n") {
			if strings.TrimSpace(doc) == "" {
				continue
			}
			where := fmt.Sprintf("%s, document %d", path, i+1)
			var tm metav1.TypeMeta
			if err := yaml.Unmarshal([]byte(doc), &tm); err != nil {
				t.Fatalf("%s: %v", where, err)
			}
			var obj any
			switch tm.APIVersion + " " + tm.Kind {
			case "apps/v1 Deployment":
				d := &appsv1.Deployment{}
				m.deployments, obj = append(m.deployments, d), d
			case "v1 Service":
				s := &corev1.Service{}
				m.services, obj = append(m.services, s), s
			case "v1 Secret":
				s := &corev1.Secret{}
				m.secrets, obj = append(m.secrets, s), s
			case "policy/v1 PodDisruptionBudget":
				p := &policyv1.PodDisruptionBudget{}
				m.pdbs, obj = append(m.pdbs, p), p
			case "kustomize.config.k8s.io/v1beta1 Kustomization":
				k := &struct {
					APIVersion string   `json:"apiVersion"`
					Kind       string   `json:"kind"`
					Resources  []string `json:"resources"`
					Images     []struct {
						Name    string `json:"name"`
						NewName string `json:"newName"`
						NewTag  string `json:"newTag"`
					} `json:"images"`
				}{}
				if err := yaml.UnmarshalStrict([]byte(doc), k); err != nil {
					t.Fatalf("%s: %v", where, err)
				}
				m.files = k.Resources
				for _, im := range k.Images {
					m.images = append(m.images, im.Name)
					if im.NewTag == "" || im.NewTag == "latest" {
						t.Errorf("%s: image %s is not pinned to a release (newTag %q)", where, im.Name, im.NewTag)
					}
				}
				continue
			default:
				t.Fatalf("%s: unexpected kind %q %q", where, tm.APIVersion, tm.Kind)
			}
			if err := yaml.UnmarshalStrict([]byte(doc), obj); err != nil {
				t.Errorf("%s: not a valid %s: %v", where, tm.Kind, err)
			}
		}
	}
	return m
}

// TestKubernetesManifests checks the manifests against the API's types and
// against each other: 3 replicas replaced one at a time, gRPC readiness
// and liveness probes on the health port the container opens (liveness on
// the "liveness" service, which a database outage does not fail), a
// non-root read-only container, selectors that match the pods, a
// PodDisruptionBudget that keeps 2 of 3, every Secret key the pods use
// defined, and the kustomization listing every file.
func TestKubernetesManifests(t *testing.T) {
	m := load(t)
	if len(m.deployments) != 1 || len(m.pdbs) != 1 || len(m.services) == 0 {
		t.Fatalf("want one Deployment, one PodDisruptionBudget and Services; have %d, %d, %d", len(m.deployments), len(m.pdbs), len(m.services))
	}
	d := m.deployments[0]
	if d.Spec.Replicas == nil || *d.Spec.Replicas != 3 {
		t.Errorf("Deployment replicas %v; want 3", d.Spec.Replicas)
	}
	if ru := d.Spec.Strategy.RollingUpdate; d.Spec.Strategy.Type != appsv1.RollingUpdateDeploymentStrategyType || ru == nil || ru.MaxUnavailable == nil || ru.MaxUnavailable.IntValue() != 0 {
		t.Errorf("Deployment strategy %+v; want a rolling update with maxUnavailable 0", d.Spec.Strategy)
	}
	podLabels := labels.Set(d.Spec.Template.Labels)
	sel, err := metav1.LabelSelectorAsSelector(d.Spec.Selector)
	if err != nil || !sel.Matches(podLabels) {
		t.Errorf("Deployment selector %v does not match its pods' labels %v (%v)", d.Spec.Selector, podLabels, err)
	}
	pod := d.Spec.Template.Spec
	if sc := pod.SecurityContext; sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.RunAsUser == nil || *sc.RunAsUser != 65532 || sc.FSGroup == nil || *sc.FSGroup != 65532 {
		t.Errorf("pod security context %+v; want non-root, uid 65532, fsGroup 65532 (the image's user)", pod.SecurityContext)
	}
	if len(pod.Containers) != 1 {
		t.Fatalf("%d containers; want 1", len(pod.Containers))
	}
	c := pod.Containers[0]
	if sc := c.SecurityContext; sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || sc.Capabilities == nil || len(sc.Capabilities.Drop) != 1 || sc.Capabilities.Drop[0] != "ALL" {
		t.Errorf("container security context %+v; want read-only root, no privilege escalation, all capabilities dropped", c.SecurityContext)
	}
	ports := map[int32]string{}
	for _, p := range c.Ports {
		ports[p.ContainerPort] = p.Name
	}
	env := map[string]corev1.EnvVar{}
	for _, e := range c.Env {
		env[e.Name] = e
	}
	healthPort := int32(0)
	if v := env["CLUSTERD_HEALTH_ADDR"].Value; strings.HasPrefix(v, ":") {
		_, _ = fmt.Sscanf(v, ":%d", &healthPort)
	}
	if healthPort == 0 || ports[healthPort] == "" {
		t.Fatalf("CLUSTERD_HEALTH_ADDR %q is not a port the container opens (%v)", env["CLUSTERD_HEALTH_ADDR"].Value, ports)
	}
	probe := func(name string, p *corev1.Probe, service string) {
		switch {
		case p == nil || p.GRPC == nil:
			t.Errorf("%s probe %+v; want a gRPC probe", name, p)
		case p.GRPC.Port != healthPort:
			t.Errorf("%s probe on port %d; want the health port %d (gRPC probes speak no TLS)", name, p.GRPC.Port, healthPort)
		case p.GRPC.Service == nil && service != "" || p.GRPC.Service != nil && *p.GRPC.Service != service:
			got := "(none)"
			if p.GRPC.Service != nil {
				got = fmt.Sprintf("%q", *p.GRPC.Service)
			}
			t.Errorf("%s probe asks for service %s; want %q", name, got, service)
		}
	}
	probe("readiness", c.ReadinessProbe, "")
	probe("liveness", c.LivenessProbe, "liveness")
	probe("startup", c.StartupProbe, "liveness")

	secretKeys := map[string]map[string]bool{}
	for _, s := range m.secrets {
		keys := map[string]bool{}
		for k := range s.StringData {
			keys[k] = true
		}
		for k := range s.Data {
			keys[k] = true
		}
		secretKeys[s.Name] = keys
	}
	for _, e := range c.Env {
		if r := e.ValueFrom; r != nil && r.SecretKeyRef != nil && !secretKeys[r.SecretKeyRef.Name][r.SecretKeyRef.Key] {
			t.Errorf("env %s reads key %q of Secret %q, which the manifests do not define", e.Name, r.SecretKeyRef.Key, r.SecretKeyRef.Name)
		}
	}
	mounts := map[string]string{}
	for _, vm := range c.VolumeMounts {
		mounts[vm.Name] = vm.MountPath
	}
	files := map[string]bool{}
	for _, v := range pod.Volumes {
		if _, ok := mounts[v.Name]; !ok {
			t.Errorf("volume %s is not mounted", v.Name)
		}
		if v.Secret == nil {
			continue
		}
		keys, ok := secretKeys[v.Secret.SecretName]
		if !ok {
			t.Errorf("volume %s mounts Secret %q, which the manifests do not define", v.Name, v.Secret.SecretName)
		}
		if v.Secret.DefaultMode == nil || *v.Secret.DefaultMode&0o007 != 0 {
			t.Errorf("volume %s's files are readable by others (defaultMode %v); the secrets key's check refuses that", v.Name, v.Secret.DefaultMode)
		}
		if len(v.Secret.Items) == 0 {
			for k := range keys {
				files[filepath.Join(mounts[v.Name], k)] = true
			}
		}
		for _, it := range v.Secret.Items {
			if !keys[it.Key] {
				t.Errorf("volume %s projects key %q, which Secret %q does not define", v.Name, it.Key, v.Secret.SecretName)
			}
			files[filepath.Join(mounts[v.Name], it.Path)] = true
		}
	}
	for _, name := range []string{"CLUSTERD_AUTH_TOKENS", "CLUSTERD_SECRETS_KEY_FILE", "CLUSTERD_TLS_CERT", "CLUSTERD_TLS_KEY"} {
		if v := env[name].Value; !files[v] {
			t.Errorf("%s=%q is no file a mounted Secret provides (%v)", name, v, files)
		}
	}

	for _, s := range m.services {
		if !labels.SelectorFromSet(s.Spec.Selector).Matches(podLabels) || len(s.Spec.Selector) == 0 {
			t.Errorf("Service %s selects %v; want the pods (%v)", s.Name, s.Spec.Selector, podLabels)
		}
		for _, p := range s.Spec.Ports {
			if name := p.TargetPort.String(); !containsValue(ports, name) {
				t.Errorf("Service %s port %s targets %q, which the container does not name", s.Name, p.Name, name)
			}
		}
	}
	pdb := m.pdbs[0]
	psel, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector)
	if err != nil || !psel.Matches(podLabels) {
		t.Errorf("PodDisruptionBudget selector %v does not match the pods (%v)", pdb.Spec.Selector, err)
	}
	if pdb.Spec.MaxUnavailable == nil || pdb.Spec.MaxUnavailable.IntValue() != 1 {
		t.Errorf("PodDisruptionBudget maxUnavailable %v; want 1", pdb.Spec.MaxUnavailable)
	}

	if image, _, _ := strings.Cut(c.Image, ":"); !contains(m.images, image) {
		t.Errorf("the container's image %q is not one the kustomization sets (%v)", c.Image, m.images)
	}
	paths, _ := filepath.Glob(filepath.Join("kubernetes", "*.yaml"))
	for _, p := range paths {
		if base := filepath.Base(p); base != "kustomization.yaml" && !contains(m.files, base) {
			t.Errorf("kustomization.yaml does not list %s", base)
		}
	}
}

func containsValue(m map[int32]string, v string) bool {
	for _, x := range m {
		if x == v {
			return true
		}
	}
	return false
}

func contains(list []string, v string) bool {
	for _, x := range list {
		if x == v {
			return true
		}
	}
	return false
}

func skipOrFail(t *testing.T, format string, args ...any) {
	t.Helper()
	if os.Getenv("CI") != "" {
		t.Fatalf(format, args...)
	}
	t.Skipf(format, args...)
}
