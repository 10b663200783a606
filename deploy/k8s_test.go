package deploy_test

// Checks of the Kubernetes manifests (deploy/k8s), the Prometheus rules and scrape
// configuration (deploy/prometheus), and the Grafana dashboard and provisioning
// (deploy/grafana) against the code: the modules, ports, probe paths and configuration
// the binary has, and the metric names and labels it registers. Only parsing, except
// TestK8sProbesAnswer, which runs the Kubernetes configuration; kubectl (to render the
// kustomizations) and promtool (to evaluate the rules) are used when they are on PATH.

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"io/fs"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	dto "github.com/prometheus/client_model/go"
	"go.yaml.in/yaml/v3"

	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	"github.com/mantle-mesh/mantle/pkg/app"
	"github.com/mantle-mesh/mantle/pkg/mesh"
	"github.com/mantle-mesh/mantle/pkg/mesh/meshtest"
)

// Paths relative to this package's directory.
const (
	k8sBase        = "k8s/base"
	k8sDev         = "k8s/overlays/dev"
	k8sConfigFile  = "k8s/base/mantle.yaml"
	kustomization  = "kustomization.yaml"
	alertsFile     = "prometheus/alerts.yaml"
	alertTestsFile = "prometheus/alerts_test.yaml"
	prometheusFile = "prometheus/prometheus.yml"
	dashboardFile  = "grafana/dashboards/mantle.json"
	datasourcesDir = "grafana/provisioning/datasources"
	providersDir   = "grafana/provisioning/dashboards"
)

// ---------------------------------------------------------------------------------------
// Kubernetes objects: only the fields these tests read.

// k8sObject is one document of a manifest. The spec is decoded again by kind (spec).
type k8sObject struct {
	APIVersion string  `yaml:"apiVersion"`
	Kind       string  `yaml:"kind"`
	Metadata   k8sMeta `yaml:"metadata"`
	source     string
	doc        *yaml.Node
}

type k8sMeta struct {
	Name        string            `yaml:"name"`
	Namespace   string            `yaml:"namespace"`
	Labels      map[string]string `yaml:"labels"`
	Annotations map[string]string `yaml:"annotations"`
}

func (o k8sObject) String() string {
	return fmt.Sprintf("%s %s (%s)", o.Kind, o.Metadata.Name, o.source)
}

// spec decodes the whole document into out, a struct with the fields of that kind.
func spec[T any](t *testing.T, o k8sObject) T {
	t.Helper()
	var out T
	if err := o.doc.Decode(&out); err != nil {
		t.Fatalf("%s: %v", o, err)
	}
	return out
}

type labelSelector struct {
	MatchLabels map[string]string `yaml:"matchLabels"`
}

type deploymentDoc struct {
	Spec struct {
		Replicas *int          `yaml:"replicas"`
		Selector labelSelector `yaml:"selector"`
		Template struct {
			Metadata k8sMeta `yaml:"metadata"`
			Spec     podSpec `yaml:"spec"`
		} `yaml:"template"`
	} `yaml:"spec"`
}

type podSpec struct {
	TerminationGracePeriodSeconds *int `yaml:"terminationGracePeriodSeconds"`
	SecurityContext               struct {
		RunAsNonRoot *bool `yaml:"runAsNonRoot"`
	} `yaml:"securityContext"`
	Containers []container `yaml:"containers"`
	Volumes    []volume    `yaml:"volumes"`
}

type container struct {
	Name  string   `yaml:"name"`
	Image string   `yaml:"image"`
	Args  []string `yaml:"args"`
	Ports []struct {
		Name          string `yaml:"name"`
		ContainerPort int    `yaml:"containerPort"`
	} `yaml:"ports"`
	Env []struct {
		Name      string `yaml:"name"`
		ValueFrom *struct {
			SecretKeyRef *struct {
				Name string `yaml:"name"`
				Key  string `yaml:"key"`
			} `yaml:"secretKeyRef"`
		} `yaml:"valueFrom"`
	} `yaml:"env"`
	ReadinessProbe *probe `yaml:"readinessProbe"`
	LivenessProbe  *probe `yaml:"livenessProbe"`
	Resources      struct {
		Requests map[string]string `yaml:"requests"`
		Limits   map[string]string `yaml:"limits"`
	} `yaml:"resources"`
	SecurityContext struct {
		RunAsNonRoot             *bool `yaml:"runAsNonRoot"`
		ReadOnlyRootFilesystem   *bool `yaml:"readOnlyRootFilesystem"`
		AllowPrivilegeEscalation *bool `yaml:"allowPrivilegeEscalation"`
	} `yaml:"securityContext"`
	VolumeMounts []struct {
		Name      string `yaml:"name"`
		MountPath string `yaml:"mountPath"`
		SubPath   string `yaml:"subPath"`
		ReadOnly  bool   `yaml:"readOnly"`
	} `yaml:"volumeMounts"`
}

type probe struct {
	HTTPGet *struct {
		Path string `yaml:"path"`
		Port string `yaml:"port"` // a number or a container port name
	} `yaml:"httpGet"`
	PeriodSeconds    int `yaml:"periodSeconds"`
	FailureThreshold int `yaml:"failureThreshold"`
}

// window is how long the probe takes to act on a failing endpoint, with the API defaults.
func (p *probe) window() time.Duration {
	period, failures := p.PeriodSeconds, p.FailureThreshold
	if period == 0 {
		period = 10
	}
	if failures == 0 {
		failures = 3
	}
	return time.Duration(period*failures) * time.Second
}

type volume struct {
	Name      string `yaml:"name"`
	ConfigMap *struct {
		Name string `yaml:"name"`
	} `yaml:"configMap"`
	EmptyDir              *struct{} `yaml:"emptyDir"`
	PersistentVolumeClaim *struct{} `yaml:"persistentVolumeClaim"`
}

type serviceDoc struct {
	Spec struct {
		Selector map[string]string `yaml:"selector"`
		Ports    []struct {
			Name       string `yaml:"name"`
			Port       int    `yaml:"port"`
			TargetPort string `yaml:"targetPort"`
		} `yaml:"ports"`
	} `yaml:"spec"`
}

type hpaDoc struct {
	Spec struct {
		ScaleTargetRef struct {
			APIVersion string `yaml:"apiVersion"`
			Kind       string `yaml:"kind"`
			Name       string `yaml:"name"`
		} `yaml:"scaleTargetRef"`
		MinReplicas *int `yaml:"minReplicas"`
		MaxReplicas int  `yaml:"maxReplicas"`
		Metrics     []struct {
			Type     string `yaml:"type"`
			Resource *struct {
				Name string `yaml:"name"`
			} `yaml:"resource"`
		} `yaml:"metrics"`
	} `yaml:"spec"`
}

type pdbDoc struct {
	Spec struct {
		Selector       labelSelector `yaml:"selector"`
		MinAvailable   string        `yaml:"minAvailable"`
		MaxUnavailable string        `yaml:"maxUnavailable"`
	} `yaml:"spec"`
}

type configMapDoc struct {
	Data map[string]string `yaml:"data"`
}

// kustomizationDoc is the part of a kustomization.yaml these tests read.
type kustomizationDoc struct {
	Namespace          string          `yaml:"namespace"`
	Resources          []string        `yaml:"resources"`
	Components         []string        `yaml:"components"`
	Patches            []patchRef      `yaml:"patches"`
	ConfigMapGenerator []generatorSpec `yaml:"configMapGenerator"`
	SecretGenerator    []generatorSpec `yaml:"secretGenerator"`
}

type patchRef struct {
	Path   string `yaml:"path"`
	Patch  string `yaml:"patch"`
	Target *struct {
		Group   string `yaml:"group"`
		Version string `yaml:"version"`
		Kind    string `yaml:"kind"`
		Name    string `yaml:"name"`
	} `yaml:"target"`
}

type generatorSpec struct {
	Name     string   `yaml:"name"`
	Files    []string `yaml:"files"`
	Envs     []string `yaml:"envs"`
	Literals []string `yaml:"literals"`
}

// generatorFile returns the file of a generator's files entry ("[key=]path").
func generatorFile(entry string) (key, file string) {
	if k, f, ok := strings.Cut(entry, "="); ok {
		return k, f
	}
	return path.Base(entry), entry
}

func readKustomization(t *testing.T, dir string) kustomizationDoc {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, kustomization))
	if err != nil {
		t.Fatal(err)
	}
	var k kustomizationDoc
	if err := yaml.Unmarshal(data, &k); err != nil {
		t.Fatalf("%s/%s: %v", dir, kustomization, err)
	}
	return k
}

// parseManifests splits a multi-document YAML stream into objects.
func parseManifests(t *testing.T, data []byte, source string) []k8sObject {
	t.Helper()
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var out []k8sObject
	for i := 0; ; i++ {
		var doc yaml.Node
		err := dec.Decode(&doc)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("%s, document %d: %v", source, i, err)
		}
		if len(doc.Content) == 0 || doc.Content[0].Tag == "!!null" {
			continue // an empty document between two ---
		}
		o := k8sObject{source: source, doc: &doc}
		if err := doc.Decode(&o); err != nil {
			t.Fatalf("%s, document %d: %v", source, i, err)
		}
		if o.APIVersion == "" || o.Kind == "" || o.Metadata.Name == "" {
			t.Fatalf("%s, document %d: want apiVersion, kind and metadata.name, got %q %q %q", source, i, o.APIVersion, o.Kind, o.Metadata.Name)
		}
		out = append(out, o)
	}
	return out
}

// k8sSet is what a kustomization produces, without running kustomize: the objects of its
// resource files, and the ConfigMaps its generators make (under their unhashed names).
type k8sSet struct {
	objects    []k8sObject
	configMaps map[string]map[string]string
}

// loadKustomization reads the objects a kustomization directory lists, recursively.
// Patches are not applied; overlays are checked separately (TestK8sKustomizations).
func loadKustomization(t *testing.T, dir string) k8sSet {
	t.Helper()
	set := k8sSet{configMaps: map[string]map[string]string{}}
	k := readKustomization(t, dir)
	for _, r := range k.Resources {
		p := filepath.Join(dir, r)
		if fi, err := os.Stat(p); err == nil && fi.IsDir() {
			sub := loadKustomization(t, p)
			set.objects = append(set.objects, sub.objects...)
			maps.Copy(set.configMaps, sub.configMaps)
			continue
		}
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatalf("%s: resource %s: %v", dir, r, err)
		}
		set.objects = append(set.objects, parseManifests(t, data, p)...)
	}
	for _, g := range k.ConfigMapGenerator {
		data := map[string]string{}
		for _, f := range g.Files {
			key, file := generatorFile(f)
			b, err := os.ReadFile(filepath.Join(dir, file))
			if err != nil {
				t.Fatalf("%s: configMapGenerator %s: %v", dir, g.Name, err)
			}
			data[key] = string(b)
		}
		set.configMaps[g.Name] = data
	}
	for _, o := range set.objects {
		if o.Kind == "ConfigMap" {
			set.configMaps[o.Metadata.Name] = spec[configMapDoc](t, o).Data
		}
	}
	return set
}

// render runs kustomize on dir (kubectl kustomize, or kustomize build) and returns its
// objects, or skips the test when neither is installed.
func render(t *testing.T, dir string) k8sSet {
	t.Helper()
	var cmd *exec.Cmd
	if p, err := exec.LookPath("kustomize"); err == nil {
		cmd = exec.Command(p, "build", dir)
	} else if p, err := exec.LookPath("kubectl"); err == nil {
		cmd = exec.Command(p, "kustomize", dir)
	} else {
		t.Skip("neither kustomize nor kubectl is on PATH")
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s: %v\n%s", cmd, err, stderr.Bytes())
	}
	set := k8sSet{objects: parseManifests(t, out, "kustomize "+dir), configMaps: map[string]map[string]string{}}
	for _, o := range set.objects {
		if o.Kind == "ConfigMap" {
			set.configMaps[o.Metadata.Name] = spec[configMapDoc](t, o).Data
		}
	}
	return set
}

func (s k8sSet) ofKind(kind string) []k8sObject {
	var out []k8sObject
	for _, o := range s.objects {
		if o.Kind == kind {
			out = append(out, o)
		}
	}
	return out
}

func (s k8sSet) named(kind, name string) (k8sObject, bool) {
	for _, o := range s.objects {
		if o.Kind == kind && o.Metadata.Name == name {
			return o, true
		}
	}
	return k8sObject{}, false
}

// selects reports whether a selector (every label of it) matches labels.
func selects(selector, labels map[string]string) bool {
	if len(selector) == 0 {
		return false
	}
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

func decodeConfig(t *testing.T, source string, data []byte) mesh.Config {
	t.Helper()
	cfg := mesh.Default()
	if err := cfg.Decode(bytes.NewReader(data)); err != nil {
		t.Fatalf("%s: %v", source, err)
	}
	return cfg
}

// ---------------------------------------------------------------------------------------
// Kubernetes tests.

// meshDeployment is a Deployment of the mantle image with what the checks derive from it.
type meshDeployment struct {
	obj       k8sObject
	doc       deploymentDoc
	container container
	target    string
	cfg       mesh.Config // the mantle.yaml it mounts
}

// checkMesh checks a set of manifests against the code: one Deployment per module with
// --target, its configuration, ports, probes, shutdown timing and security, a Service that
// the router's addresses point at, an autoscaler and a disruption budget.
func checkMesh(t *testing.T, set k8sSet) {
	modules := app.Names(mesh.Modules(mesh.Default()))
	byTarget := map[string]*meshDeployment{}
	var images []string
	for _, o := range set.ofKind("Deployment") {
		d := &meshDeployment{obj: o, doc: spec[deploymentDoc](t, o)}
		pod := d.doc.Spec.Template.Spec
		if len(pod.Containers) != 1 {
			t.Errorf("%s: %d containers, want the mantle container only", o, len(pod.Containers))
			continue
		}
		d.container = pod.Containers[0]
		args := d.container.Args
		if len(args) == 0 || args[0] != "serve" {
			t.Errorf("%s: args %q, want serve ...", o, args)
			continue
		}
		target, n := flagValue(args, targetFlag)
		if n != 1 {
			t.Errorf("%s: args %q have %d %s flags, want 1", o, args, n, targetFlag)
			continue
		}
		if !slices.Contains(modules, target) {
			t.Errorf("%s: --target=%s is not a module (have %s)", o, target, strings.Join(modules, ", "))
			continue
		}
		if prev, ok := byTarget[target]; ok {
			t.Errorf("%s and %s both run --target=%s", prev.obj, o, target)
			continue
		}
		d.target = target
		byTarget[target] = d
		images = append(images, d.container.Image)
	}
	for _, m := range modules {
		if byTarget[m] == nil {
			t.Errorf("no Deployment runs --target=%s", m)
		}
	}
	if slices.Sort(images); len(slices.Compact(images)) > 1 {
		t.Errorf("Deployments run images %q; want the one mantle image", images)
	}

	for _, target := range slices.Sorted(maps.Keys(byTarget)) {
		d := byTarget[target]
		t.Run(target, func(t *testing.T) {
			d.cfg = mountedConfig(t, set, d)
			checkDeployment(t, set, d)
		})
	}
	if router := byTarget["router"]; router != nil && router.cfg.Server.GRPCListenAddress != "" {
		checkAddresses(t, set, router.cfg, byTarget)
	}
	checkScaling(t, set, byTarget)
}

// mountedConfig finds the mantle.yaml the Deployment passes to --config.file in a
// ConfigMap volume, and checks that it loads and validates for the Deployment's target.
func mountedConfig(t *testing.T, set k8sSet, d *meshDeployment) mesh.Config {
	t.Helper()
	file, _ := flagValue(d.container.Args, configFlag)
	var volName, key string
	for _, m := range d.container.VolumeMounts {
		switch {
		case m.SubPath != "" && m.MountPath == file:
			volName, key = m.Name, m.SubPath
		case m.SubPath == "" && m.MountPath == path.Dir(file):
			volName, key = m.Name, path.Base(file)
		}
	}
	if volName == "" {
		t.Fatalf("nothing is mounted at %s (--config.file)", file)
	}
	var cmName string
	for _, v := range d.doc.Spec.Template.Spec.Volumes {
		if v.Name == volName && v.ConfigMap != nil {
			cmName = v.ConfigMap.Name
		}
	}
	data, ok := set.configMaps[cmName][key]
	if cmName == "" || !ok {
		t.Fatalf("volume %s mounted for %s is not a ConfigMap with key %s (ConfigMaps: %q)", volName, file, key, slices.Sorted(maps.Keys(set.configMaps)))
	}
	cfg := decodeConfig(t, "ConfigMap "+cmName+" "+key, []byte(data))
	cfg.Target = d.target
	if err := cfg.Validate(); err != nil {
		t.Fatalf("ConfigMap %s with --target=%s:\n%v", cmName, d.target, err)
	}
	if _, err := app.Resolve(mesh.Modules(cfg), cfg.Targets(), cfg.Addresses()); err != nil {
		t.Fatalf("ConfigMap %s with --target=%s: %v", cmName, d.target, err)
	}
	return cfg
}

func containerPort(c container, name string) int {
	for _, p := range c.Ports {
		if p.Name == name {
			return p.ContainerPort
		}
	}
	return 0
}

// resolvePort turns a probe or Service targetPort (a number or a port name) into a number.
func resolvePort(c container, port string) int {
	if n, err := strconv.Atoi(port); err == nil {
		return n
	}
	return containerPort(c, port)
}

func checkDeployment(t *testing.T, set k8sSet, d *meshDeployment) {
	c, pod, cfg := d.container, d.doc.Spec.Template.Spec, d.cfg
	grpcPort, httpPort := atoi(t, port(t, cfg.Server.GRPCListenAddress)), atoi(t, port(t, cfg.Server.HTTPListenAddress))

	if !selects(d.doc.Spec.Selector.MatchLabels, d.doc.Spec.Template.Metadata.Labels) {
		t.Errorf("selector %v does not select the pod template's labels %v", d.doc.Spec.Selector.MatchLabels, d.doc.Spec.Template.Metadata.Labels)
	}
	if got := containerPort(c, "grpc"); got != grpcPort {
		t.Errorf("container port grpc = %d, want %d (server.grpc_listen_address)", got, grpcPort)
	}
	if got := containerPort(c, "http"); got != httpPort {
		t.Errorf("container port http = %d, want %d (server.http_listen_address)", got, httpPort)
	}
	for _, p := range []struct {
		name  string
		probe *probe
		path  string
	}{{"readinessProbe", c.ReadinessProbe, readyzPath}, {"livenessProbe", c.LivenessProbe, healthzPath}} {
		switch {
		case p.probe == nil || p.probe.HTTPGet == nil:
			t.Errorf("%s: want an httpGet probe of %s", p.name, p.path)
		case p.probe.HTTPGet.Path != p.path:
			t.Errorf("%s path = %q, want %s", p.name, p.probe.HTTPGet.Path, p.path)
		case resolvePort(c, p.probe.HTTPGet.Port) != httpPort:
			t.Errorf("%s port %q is not the HTTP port %d", p.name, p.probe.HTTPGet.Port, httpPort)
		}
	}

	// Shutdown: /readyz turns 503, the process serves on for shutdown_delay (the readiness
	// probe must notice within it), then drains for up to graceful_shutdown_timeout; the
	// kubelet's SIGKILL must come after both.
	delay, drain := cfg.Server.ShutdownDelay, cfg.Server.GracefulShutdownTimeout
	if delay <= 0 {
		t.Errorf("server.shutdown_delay = %s; want a delay so endpoints drop the pod before it stops accepting", delay)
	}
	if c.ReadinessProbe != nil && c.ReadinessProbe.window() > delay {
		t.Errorf("the readiness probe takes %s to fail, longer than server.shutdown_delay %s", c.ReadinessProbe.window(), delay)
	}
	if g := pod.TerminationGracePeriodSeconds; g == nil || time.Duration(*g)*time.Second <= delay+drain {
		t.Errorf("terminationGracePeriodSeconds = %v; want more than shutdown_delay + graceful_shutdown_timeout = %s", derefOr(g, 30), delay+drain)
	}

	if !isTrue(pod.SecurityContext.RunAsNonRoot) && !isTrue(c.SecurityContext.RunAsNonRoot) {
		t.Error("runAsNonRoot is not set")
	}
	if !isTrue(c.SecurityContext.ReadOnlyRootFilesystem) {
		t.Error("readOnlyRootFilesystem is not set")
	}
	if c.SecurityContext.AllowPrivilegeEscalation == nil || *c.SecurityContext.AllowPrivilegeEscalation {
		t.Error("allowPrivilegeEscalation is not false")
	}
	// With a read-only root, every directory the module writes needs a volume.
	var writes []string
	if d.target == "verifier" {
		writes = append(writes, cfg.Verifier.Review.SpoolDir)
	}
	if d.target == "cache" && cfg.Cache.Backend == "embedded" && cfg.Cache.Embedded.SnapshotPath != "" {
		writes = append(writes, path.Dir(cfg.Cache.Embedded.SnapshotPath))
	}
	for _, dir := range writes {
		if !writableVolumeAt(pod, c, dir) {
			t.Errorf("%s is written by --target=%s but no writable emptyDir or volume claim is mounted there", dir, d.target)
		}
	}

	for _, kind := range []string{"cpu", "memory"} {
		if c.Resources.Requests[kind] == "" || c.Resources.Limits[kind] == "" {
			t.Errorf("resources: want requests and limits of %s, got %v / %v", kind, c.Resources.Requests, c.Resources.Limits)
		}
	}
	// Every process authenticates, so every container needs each tenant's key variable.
	for _, tenant := range cfg.Auth.Tenants {
		if tenant.KeyEnv == "" {
			continue
		}
		found := false
		for _, e := range c.Env {
			found = found || (e.Name == tenant.KeyEnv && e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil)
		}
		if !found {
			t.Errorf("no env %s from a Secret (auth.tenants %s key_env)", tenant.KeyEnv, tenant.ID)
		}
	}

	// A Service selects the pods and exposes both ports.
	exposed := false
	for _, so := range set.ofKind("Service") {
		s := spec[serviceDoc](t, so)
		if !selects(s.Spec.Selector, d.doc.Spec.Template.Metadata.Labels) {
			continue
		}
		var ports []int
		for _, p := range s.Spec.Ports {
			ports = append(ports, resolvePort(c, p.TargetPort))
		}
		exposed = exposed || (slices.Contains(ports, grpcPort) && slices.Contains(ports, httpPort))
	}
	if !exposed {
		t.Errorf("no Service selects the pods and exposes both %d (grpc) and %d (http)", grpcPort, httpPort)
	}
}

// writableVolumeAt reports whether dir is on an emptyDir or a volume claim mounted writable.
func writableVolumeAt(pod podSpec, c container, dir string) bool {
	for _, m := range c.VolumeMounts {
		if m.ReadOnly || (dir != m.MountPath && !strings.HasPrefix(dir, m.MountPath+"/")) {
			continue
		}
		for _, v := range pod.Volumes {
			if v.Name == m.Name && (v.EmptyDir != nil || v.PersistentVolumeClaim != nil) {
				return true
			}
		}
	}
	return false
}

// checkAddresses checks that router.<module>_address in the router's configuration names a
// Service that selects the pods running that module, on a port that reaches their gRPC port.
func checkAddresses(t *testing.T, set k8sSet, cfg mesh.Config, byTarget map[string]*meshDeployment) {
	grpcPort := atoi(t, port(t, cfg.Server.GRPCListenAddress))
	for module, addr := range cfg.Addresses() {
		t.Run("router reaches "+module, func(t *testing.T) {
			host, p, err := net.SplitHostPort(addr)
			if err != nil {
				t.Fatalf("router.%s_address %q: %v", module, addr, err)
			}
			so, ok := set.named("Service", host)
			if !ok {
				t.Fatalf("router.%s_address %q: no Service %s", module, addr, host)
			}
			if atoi(t, p) != grpcPort {
				t.Errorf("router.%s_address port %s, want the gRPC port %d", module, p, grpcPort)
			}
			s := spec[serviceDoc](t, so)
			for target, d := range byTarget {
				if got, want := selects(s.Spec.Selector, d.doc.Spec.Template.Metadata.Labels), target == module; got != want {
					t.Errorf("Service %s selects the pods of --target=%s: %t, want %t", host, target, got, want)
				}
			}
			d := byTarget[module]
			if d == nil {
				return
			}
			for _, sp := range s.Spec.Ports {
				if strconv.Itoa(sp.Port) == p {
					if got := resolvePort(d.container, sp.TargetPort); got != grpcPort {
						t.Errorf("Service %s port %d reaches container port %d, want %d", host, sp.Port, got, grpcPort)
					}
					return
				}
			}
			t.Errorf("Service %s has no port %s", host, p)
		})
	}
}

// checkScaling checks that every mantle Deployment has exactly one HorizontalPodAutoscaler
// and one PodDisruptionBudget of its own.
func checkScaling(t *testing.T, set k8sSet, byTarget map[string]*meshDeployment) {
	for _, target := range slices.Sorted(maps.Keys(byTarget)) {
		d := byTarget[target]
		t.Run(target+" scaling", func(t *testing.T) {
			var hpas []hpaDoc
			for _, o := range set.ofKind("HorizontalPodAutoscaler") {
				h := spec[hpaDoc](t, o)
				ref := h.Spec.ScaleTargetRef
				if ref.Kind != "Deployment" || ref.Name != d.obj.Metadata.Name {
					continue
				}
				if o.APIVersion != "autoscaling/v2" {
					t.Errorf("%s: apiVersion %s, want autoscaling/v2", o, o.APIVersion)
				}
				hpas = append(hpas, h)
			}
			if len(hpas) != 1 {
				t.Fatalf("%d HorizontalPodAutoscalers scale %s, want 1", len(hpas), d.obj.Metadata.Name)
			}
			h := hpas[0]
			minR := derefOr(h.Spec.MinReplicas, 1)
			if minR < 1 || h.Spec.MaxReplicas < minR {
				t.Errorf("replicas %d..%d; want 1 <= min <= max", minR, h.Spec.MaxReplicas)
			}
			cpu := false
			for _, m := range h.Spec.Metrics {
				cpu = cpu || (m.Type == "Resource" && m.Resource != nil && m.Resource.Name == "cpu")
			}
			if !cpu {
				t.Error("the autoscaler has no CPU resource metric")
			}
			if d.doc.Spec.Replicas != nil {
				t.Errorf("replicas: %d is set; the autoscaler owns the count and apply would reset it", *d.doc.Spec.Replicas)
			}
			// While Redis is down each quota replica enforces limit/replicas: dividing by
			// fewer replicas than may run would let the mesh exceed the limits.
			if target == "quota" && d.cfg.Quota.Backend == "redis" && d.cfg.Quota.Redis.Replicas < h.Spec.MaxReplicas {
				t.Errorf("quota.redis.replicas = %d, fewer than the %d the autoscaler may run", d.cfg.Quota.Redis.Replicas, h.Spec.MaxReplicas)
			}

			labels := d.doc.Spec.Template.Metadata.Labels
			var pdbs []string
			for _, o := range set.ofKind("PodDisruptionBudget") {
				p := spec[pdbDoc](t, o)
				if !selects(p.Spec.Selector.MatchLabels, labels) {
					continue
				}
				pdbs = append(pdbs, o.Metadata.Name)
				for other, od := range byTarget {
					if other != target && selects(p.Spec.Selector.MatchLabels, od.doc.Spec.Template.Metadata.Labels) {
						t.Errorf("%s also selects the pods of --target=%s", o, other)
					}
				}
				if (p.Spec.MinAvailable == "") == (p.Spec.MaxUnavailable == "") {
					t.Errorf("%s: want exactly one of minAvailable and maxUnavailable", o)
				}
			}
			if len(pdbs) != 1 {
				t.Errorf("PodDisruptionBudgets %q select the pods, want 1", pdbs)
			}
		})
	}
}

func TestK8sBase(t *testing.T) {
	t.Parallel()
	checkMesh(t, loadKustomization(t, k8sBase))
}

// TestK8sRendered runs kustomize and checks what it produces: generated names (hashed
// ConfigMap and Secret) must still be referenced, and the dev overlay's patches applied.
func TestK8sRendered(t *testing.T) {
	t.Parallel()
	for _, dir := range []string{k8sBase, k8sDev} {
		t.Run(dir, func(t *testing.T) {
			set := render(t, dir)
			checkMesh(t, set)
			if dir != k8sDev {
				return
			}
			for _, o := range set.ofKind("HorizontalPodAutoscaler") {
				h := spec[hpaDoc](t, o)
				if derefOr(h.Spec.MinReplicas, 1) != 1 || h.Spec.MaxReplicas != 1 {
					t.Errorf("%s: replicas %d..%d, want one replica in dev", o, derefOr(h.Spec.MinReplicas, 1), h.Spec.MaxReplicas)
				}
			}
			k := readKustomization(t, dir)
			for _, o := range set.objects {
				if o.Kind != "Namespace" && o.Metadata.Namespace != k.Namespace {
					t.Errorf("%s is in namespace %q, want %q", o, o.Metadata.Namespace, k.Namespace)
				}
			}
			// The Secret the pods read the tenant key from is generated by the overlay.
			for _, o := range set.ofKind("Deployment") {
				for _, c := range spec[deploymentDoc](t, o).Spec.Template.Spec.Containers {
					for _, e := range c.Env {
						if e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil {
							continue
						}
						if _, ok := set.named("Secret", e.ValueFrom.SecretKeyRef.Name); !ok {
							t.Errorf("%s: env %s reads Secret %s, which the overlay does not make", o, e.Name, e.ValueFrom.SecretKeyRef.Name)
						}
					}
				}
			}
		})
	}
}

func TestK8sConfigValidatesForEveryTarget(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile(k8sConfigFile)
	if err != nil {
		t.Fatal(err)
	}
	base := decodeConfig(t, k8sConfigFile, data)
	for _, target := range append([]string{app.TargetAll}, app.Names(mesh.Modules(base))...) {
		t.Run(target, func(t *testing.T) {
			cfg := base
			cfg.Target = target
			if err := cfg.Validate(); err != nil {
				t.Fatalf("Validate with --target=%s:\n%v", target, err)
			}
			if _, err := app.Resolve(mesh.Modules(cfg), cfg.Targets(), cfg.Addresses()); err != nil {
				t.Fatalf("Resolve with --target=%s: %v", target, err)
			}
		})
	}
}

// TestK8sKustomizations checks that the kustomizations name only files that exist, that
// every manifest in their directories is used, and that the overlay's JSON patches address
// paths that exist in the objects they target (kustomize fails on the cluster otherwise).
func TestK8sKustomizations(t *testing.T) {
	t.Parallel()
	for _, dir := range []string{k8sBase, k8sDev} {
		t.Run(dir, func(t *testing.T) {
			k := readKustomization(t, dir)
			used := map[string]bool{kustomization: true}
			exists := func(what, p string) {
				t.Helper()
				fi, err := os.Stat(filepath.Join(dir, p))
				switch {
				case err != nil:
					t.Errorf("%s %s: %v", what, p, err)
				case fi.IsDir():
					if _, err := os.Stat(filepath.Join(dir, p, kustomization)); err != nil {
						t.Errorf("%s %s is a directory without a %s", what, p, kustomization)
					}
				default:
					used[filepath.Clean(p)] = true
				}
			}
			for _, r := range k.Resources {
				exists("resource", r)
			}
			for _, r := range k.Components {
				exists("component", r)
			}
			for _, p := range k.Patches {
				if p.Path != "" {
					exists("patch", p.Path)
				}
			}
			for _, g := range append(slices.Clone(k.ConfigMapGenerator), k.SecretGenerator...) {
				for _, f := range g.Files {
					_, file := generatorFile(f)
					exists("generator "+g.Name+" file", file)
				}
				for _, f := range g.Envs {
					exists("generator "+g.Name+" envs", f)
				}
			}
			entries, err := os.ReadDir(dir)
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range entries {
				if ext := filepath.Ext(e.Name()); !e.IsDir() && (ext == ".yaml" || ext == ".yml") && !used[e.Name()] {
					t.Errorf("%s is in %s but the kustomization does not use it", e.Name(), dir)
				}
			}
			checkPatches(t, dir, k)
		})
	}
}

func checkPatches(t *testing.T, dir string, k kustomizationDoc) {
	set := loadKustomization(t, dir)
	for _, p := range k.Patches {
		data := []byte(p.Patch)
		if p.Path != "" {
			var err error
			if data, err = os.ReadFile(filepath.Join(dir, p.Path)); err != nil {
				continue // reported above
			}
		}
		var ops []struct {
			Op   string `yaml:"op"`
			Path string `yaml:"path"`
		}
		if err := yaml.Unmarshal(data, &ops); err != nil {
			// A strategic merge patch: it names the object it patches.
			for _, o := range parseManifests(t, data, p.Path) {
				if _, ok := set.named(o.Kind, o.Metadata.Name); !ok {
					t.Errorf("patch %s: no %s %s to patch", p.Path, o.Kind, o.Metadata.Name)
				}
			}
			continue
		}
		if p.Target == nil {
			t.Errorf("JSON patch %s has no target", p.Path)
			continue
		}
		var targets []k8sObject
		for _, o := range set.objects {
			group, version, ok := strings.Cut(o.APIVersion, "/")
			if !ok {
				group, version = "", o.APIVersion
			}
			tg := p.Target
			if (tg.Kind == "" || tg.Kind == o.Kind) && (tg.Name == "" || tg.Name == o.Metadata.Name) &&
				(tg.Group == "" || tg.Group == group) && (tg.Version == "" || tg.Version == version) {
				targets = append(targets, o)
			}
		}
		if len(targets) == 0 {
			t.Errorf("JSON patch %s: its target %+v matches nothing", p.Path, *p.Target)
		}
		for _, o := range targets {
			var doc any
			if err := o.doc.Decode(&doc); err != nil {
				t.Fatal(err)
			}
			for _, op := range ops {
				at := op.Path
				if op.Op == "add" {
					at = op.Path[:strings.LastIndex(op.Path, "/")] // add needs the parent
				}
				if !pointerExists(doc, at) {
					t.Errorf("JSON patch %s: %s %s, but %s has no %s", p.Path, op.Op, op.Path, o, at)
				}
			}
		}
	}
}

// pointerExists reports whether a JSON pointer (RFC 6901) addresses a value in doc.
func pointerExists(doc any, pointer string) bool {
	if pointer == "" {
		return true
	}
	cur := doc
	for _, tok := range strings.Split(strings.TrimPrefix(pointer, "/"), "/") {
		tok = strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")
		switch v := cur.(type) {
		case map[string]any:
			next, ok := v[tok]
			if !ok {
				return false
			}
			cur = next
		case []any:
			i, err := strconv.Atoi(tok)
			if err != nil || i < 0 || i >= len(v) {
				return false
			}
			cur = v[i]
		default:
			return false
		}
	}
	return true
}

// TestK8sProbesAnswer runs the Kubernetes configuration and asks the probe paths of the
// router's Deployment, and the path Prometheus scrapes, on the HTTP port.
func TestK8sProbesAnswer(t *testing.T) {
	set := loadKustomization(t, k8sBase)
	o, ok := set.named("Deployment", "mantle-router")
	if !ok {
		t.Fatal("no Deployment mantle-router")
	}
	d := spec[deploymentDoc](t, o)
	c := d.Spec.Template.Spec.Containers[0]
	data, err := os.ReadFile(k8sConfigFile)
	if err != nil {
		t.Fatal(err)
	}
	cfg := decodeConfig(t, k8sConfigFile, data)
	for _, tenant := range cfg.Auth.Tenants {
		if tenant.KeyEnv != "" {
			t.Setenv(tenant.KeyEnv, "sk-k8s-test")
		}
	}
	setOperatorAndMeshEnv(t, cfg)
	// The shutdown delay would hold every test cleanup for that long on the real clock.
	cfg.Server.ShutdownDelay = 0
	m := meshtest.Start(t, cfg, meshtest.All)

	paths := map[string]string{"metrics (prometheus.io/path)": d.Spec.Template.Metadata.Annotations["prometheus.io/path"]}
	if c.ReadinessProbe != nil && c.ReadinessProbe.HTTPGet != nil {
		paths["readinessProbe"] = c.ReadinessProbe.HTTPGet.Path
	}
	if c.LivenessProbe != nil && c.LivenessProbe.HTTPGet != nil {
		paths["livenessProbe"] = c.LivenessProbe.HTTPGet.Path
	}
	for what, p := range paths {
		t.Run(what, func(t *testing.T) {
			if p == "" {
				t.Fatal("no path")
			}
			res, err := http.Get("http://" + m.HTTPAddr + p)
			if err != nil {
				t.Fatal(err)
			}
			res.Body.Close()
			if res.StatusCode != http.StatusOK {
				t.Errorf("GET %s: %s, want 200", p, res.Status)
			}
		})
	}
}

// The paths pkg/app serves; TestK8sProbesAnswer proves they answer.
const (
	readyzPath  = "/readyz"
	healthzPath = "/healthz"
)

func atoi(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatalf("port %q: %v", s, err)
	}
	return n
}

func isTrue(b *bool) bool { return b != nil && *b }

func derefOr(p *int, def int) int {
	if p == nil {
		return def
	}
	return *p
}

// ---------------------------------------------------------------------------------------
// Metrics the code registers.

// metricDef is a metric some mantle process registers.
type metricDef struct {
	name   string
	kind   string // Counter, Gauge, Histogram, Summary, Untyped
	labels []string
	where  string
}

// grpcServerMetrics are registered by go-grpc-middleware's prometheus provider
// (pkg/rpc/interceptors.go, with the handling-time histogram on).
var grpcServerMetrics = []metricDef{
	{name: "grpc_server_started_total", kind: "Counter", labels: []string{"grpc_type", "grpc_service", "grpc_method"}},
	{name: "grpc_server_handled_total", kind: "Counter", labels: []string{"grpc_type", "grpc_service", "grpc_method", "grpc_code"}},
	{name: "grpc_server_msg_received_total", kind: "Counter", labels: []string{"grpc_type", "grpc_service", "grpc_method"}},
	{name: "grpc_server_msg_sent_total", kind: "Counter", labels: []string{"grpc_type", "grpc_service", "grpc_method"}},
	{name: "grpc_server_handling_seconds", kind: "Histogram", labels: []string{"grpc_type", "grpc_service", "grpc_method"}},
}

// goRuntimeMetrics are the Go runtime's metrics every process exports: what
// collectors.NewGoCollector, as pkg/app registers it, gathers here.
func goRuntimeMetrics(t *testing.T) []metricDef {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector())
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[dto.MetricType]string{dto.MetricType_COUNTER: "Counter", dto.MetricType_GAUGE: "Gauge",
		dto.MetricType_SUMMARY: "Summary", dto.MetricType_HISTOGRAM: "Histogram", dto.MetricType_UNTYPED: "Untyped"}
	var defs []metricDef
	for _, f := range families {
		d := metricDef{name: f.GetName(), kind: kinds[f.GetType()], where: "Go collector"}
		if ms := f.GetMetric(); len(ms) > 0 {
			for _, l := range ms[0].GetLabel() {
				d.labels = append(d.labels, l.GetName())
			}
		}
		defs = append(defs, d)
	}
	return defs
}

// prometheusMetrics are made by Prometheus itself for every target.
var prometheusMetrics = []metricDef{{name: "up", kind: "Gauge"}}

var newMetricFunc = regexp.MustCompile(`^New(Counter|Gauge|Histogram|Summary|Untyped)(Vec|Func)?$`)

// registeredMetrics finds every prometheus.New{Counter,Gauge,Histogram,Summary}[Vec|Func]
// call in the product's Go sources and reads its full name (Namespace, Subsystem, Name) and
// label names. Options built by a local helper (verifier's opts("verdicts_total", ...)) and
// label slices held in a variable are followed; anything else it cannot read is an error,
// so a new metric is never silently missing.
func registeredMetrics(t *testing.T) map[string]metricDef {
	t.Helper()
	defs := map[string]metricDef{}
	add := func(d metricDef) {
		// The same name declared twice must mean the same series, or queries mean two things.
		if prev, ok := defs[d.name]; ok && (prev.kind != d.kind || !slices.Equal(prev.labels, d.labels)) {
			t.Errorf("metric %s is a %s%q at %s and a %s%q at %s", d.name, prev.kind, prev.labels, prev.where, d.kind, d.labels, d.where)
		}
		defs[d.name] = d
	}
	for _, d := range append(slices.Clone(grpcServerMetrics), prometheusMetrics...) {
		d.where = "built in"
		add(d)
	}
	for _, d := range goRuntimeMetrics(t) {
		add(d)
	}
	fset := token.NewFileSet()
	for _, root := range []string{"services", "pkg", "cmd"} {
		err := filepath.WalkDir(filepath.Join(repoRoot, root), func(p string, e fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if e.IsDir() {
				if e.Name() == "testdata" || p == filepath.Join(repoRoot, "pkg", "api") {
					return filepath.SkipDir
				}
				return nil
			}
			if !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
				return nil
			}
			f, err := parser.ParseFile(fset, p, nil, 0)
			if err != nil {
				return err
			}
			for _, d := range metricsInFile(t, fset, f) {
				add(d)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, want := range []string{"mantle_router_requests_total", "mantle_quota_decisions_total", "mantle_cache_lookups_total", "mantle_verifier_verdicts_total"} {
		if _, ok := defs[want]; !ok {
			t.Fatalf("the source scan did not find %s; it no longer understands how metrics are declared", want)
		}
	}
	return defs
}

// optsHelper is a function returning prometheus options with fields from its parameters.
type optsHelper struct {
	fields map[string]ast.Expr
	params []string
}

func metricsInFile(t *testing.T, fset *token.FileSet, f *ast.File) []metricDef {
	t.Helper()
	helpers := map[string]optsHelper{}
	slicesByName := map[string]ast.Expr{}
	optsLit := func(e ast.Expr) *ast.CompositeLit {
		if u, ok := e.(*ast.UnaryExpr); ok && u.Op == token.AND {
			e = u.X
		}
		lit, ok := e.(*ast.CompositeLit)
		if !ok {
			return nil
		}
		if sel, ok := lit.Type.(*ast.SelectorExpr); ok && strings.HasSuffix(sel.Sel.Name, "Opts") {
			return lit
		}
		return nil
	}
	fieldsOf := func(lit *ast.CompositeLit) map[string]ast.Expr {
		out := map[string]ast.Expr{}
		for _, el := range lit.Elts {
			if kv, ok := el.(*ast.KeyValueExpr); ok {
				if k, ok := kv.Key.(*ast.Ident); ok {
					out[k.Name] = kv.Value
				}
			}
		}
		return out
	}
	helperOf := func(ft *ast.FuncType, body *ast.BlockStmt) (optsHelper, bool) {
		if body == nil || len(body.List) != 1 {
			return optsHelper{}, false
		}
		ret, ok := body.List[0].(*ast.ReturnStmt)
		if !ok || len(ret.Results) != 1 {
			return optsHelper{}, false
		}
		lit := optsLit(ret.Results[0])
		if lit == nil {
			return optsHelper{}, false
		}
		h := optsHelper{fields: fieldsOf(lit)}
		for _, field := range ft.Params.List {
			for _, n := range field.Names {
				h.params = append(h.params, n.Name)
			}
		}
		return h, true
	}
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.FuncDecl:
			if h, ok := helperOf(n.Type, n.Body); ok {
				helpers[n.Name.Name] = h
			}
		case *ast.AssignStmt:
			for i, lhs := range n.Lhs {
				id, ok := lhs.(*ast.Ident)
				if !ok || i >= len(n.Rhs) {
					continue
				}
				switch rhs := n.Rhs[i].(type) {
				case *ast.FuncLit:
					if h, ok := helperOf(rhs.Type, rhs.Body); ok {
						helpers[id.Name] = h
					}
				case *ast.CompositeLit:
					slicesByName[id.Name] = rhs
				}
			}
		}
		return true
	})

	var out []metricDef
	ast.Inspect(f, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok {
			return true
		}
		sel, ok := call.Fun.(*ast.SelectorExpr)
		if !ok {
			return true
		}
		if pkg, ok := sel.X.(*ast.Ident); !ok || pkg.Name != "prometheus" {
			return true
		}
		m := newMetricFunc.FindStringSubmatch(sel.Sel.Name)
		if m == nil || len(call.Args) == 0 {
			return true
		}
		where := fset.Position(call.Pos()).String()
		var fields map[string]ast.Expr
		subst := map[string]ast.Expr{}
		if lit := optsLit(call.Args[0]); lit != nil {
			fields = fieldsOf(lit)
		} else if hc, ok := call.Args[0].(*ast.CallExpr); ok {
			if id, ok := hc.Fun.(*ast.Ident); ok {
				if h, ok := helpers[id.Name]; ok {
					fields = h.fields
					for i, p := range h.params {
						if i < len(hc.Args) {
							subst[p] = hc.Args[i]
						}
					}
				}
			}
		}
		if fields == nil {
			t.Errorf("%s: cannot read the options of prometheus.%s", where, sel.Sel.Name)
			return true
		}
		str := func(key string) (string, bool) {
			e, ok := fields[key]
			if !ok {
				return "", true
			}
			if id, ok := e.(*ast.Ident); ok && subst[id.Name] != nil {
				e = subst[id.Name]
			}
			if lit, ok := e.(*ast.BasicLit); ok && lit.Kind == token.STRING {
				s, err := strconv.Unquote(lit.Value)
				return s, err == nil
			}
			return "", false
		}
		var parts [3]string
		for i, key := range []string{"Namespace", "Subsystem", "Name"} {
			s, ok := str(key)
			if !ok {
				t.Errorf("%s: %s of prometheus.%s is not a string literal", where, key, sel.Sel.Name)
				return true
			}
			parts[i] = s
		}
		d := metricDef{name: prometheus.BuildFQName(parts[0], parts[1], parts[2]), kind: m[1], where: where}
		if m[2] == "Vec" {
			if len(call.Args) < 2 {
				t.Errorf("%s: prometheus.%s without label names", where, sel.Sel.Name)
				return true
			}
			labels := call.Args[1]
			if id, ok := labels.(*ast.Ident); ok && slicesByName[id.Name] != nil {
				labels = slicesByName[id.Name]
			}
			lit, ok := labels.(*ast.CompositeLit)
			if !ok {
				t.Errorf("%s: cannot read the label names of %s", where, d.name)
				return true
			}
			for _, el := range lit.Elts {
				bl, ok := el.(*ast.BasicLit)
				if !ok || bl.Kind != token.STRING {
					t.Errorf("%s: a label name of %s is not a string literal", where, d.name)
					return true
				}
				s, _ := strconv.Unquote(bl.Value)
				d.labels = append(d.labels, s)
			}
		}
		out = append(out, d)
		return true
	})
	return out
}

// ---------------------------------------------------------------------------------------
// PromQL: the metric selectors of an expression, without a full parser.

type promSelector struct {
	metric   string
	matchers []promMatcher
}

type promMatcher struct {
	label, op, value string
}

// PromQL words that are not metric names. Functions are recognised by the "(" after them.
var promKeywords = map[string]bool{
	"sum": true, "min": true, "max": true, "avg": true, "group": true, "stddev": true, "stdvar": true,
	"count": true, "count_values": true, "bottomk": true, "topk": true, "quantile": true,
	"limitk": true, "limit_ratio": true,
	"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true,
	"bool": true, "and": true, "or": true, "unless": true, "offset": true, "atan2": true,
	"inf": true, "nan": true, "Inf": true, "NaN": true,
}

// labelListKeywords take a parenthesised list of label names.
var labelListKeywords = map[string]bool{"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true}

func isIdentStart(c byte) bool {
	return c == '_' || c == ':' || ('a' <= c && c <= 'z') || ('A' <= c && c <= 'Z')
}

func isIdent(c byte) bool { return isIdentStart(c) || ('0' <= c && c <= '9') }

// promSelectors lexes expr and returns its vector selectors: identifiers that are not
// keywords or function calls, with the label matchers in braces after them. Grafana
// variables ($x, ${x}) and range/subquery brackets are skipped.
func promSelectors(expr string) ([]promSelector, error) {
	var out []promSelector
	s := expr
	skipSpace := func(i int) int {
		for i < len(s) && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r') {
			i++
		}
		return i
	}
	readString := func(i int) (string, int, error) {
		q := s[i]
		var b strings.Builder
		for j := i + 1; j < len(s); j++ {
			switch {
			case s[j] == '\\' && q != '`' && j+1 < len(s):
				b.WriteByte(s[j+1])
				j++
			case s[j] == q:
				return b.String(), j + 1, nil
			default:
				b.WriteByte(s[j])
			}
		}
		return "", 0, fmt.Errorf("unterminated string at %d", i)
	}
	depth := 0
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case c == '"' || c == '\'' || c == '`':
			_, j, err := readString(i)
			if err != nil {
				return nil, err
			}
			i = j
		case c == '#':
			for i < len(s) && s[i] != '\n' {
				i++
			}
		case c == '$':
			i++
			if i < len(s) && s[i] == '{' {
				for i < len(s) && s[i] != '}' {
					i++
				}
				i++
			}
			for i < len(s) && isIdent(s[i]) {
				i++
			}
		case c == '[':
			j := strings.IndexByte(s[i:], ']')
			if j < 0 {
				return nil, fmt.Errorf("unclosed [ at %d", i)
			}
			i += j + 1
		case c == '(':
			depth++
			i++
		case c == ')':
			if depth--; depth < 0 {
				return nil, fmt.Errorf("unbalanced ) at %d", i)
			}
			i++
		case c == '{':
			return nil, fmt.Errorf("label matchers without a metric name at %d", i)
		case '0' <= c && c <= '9' || c == '.':
			for i < len(s) && (isIdent(s[i]) || s[i] == '.') {
				i++
			}
		case isIdentStart(c):
			j := i
			for j < len(s) && isIdent(s[j]) {
				j++
			}
			word := s[i:j]
			next := skipSpace(j)
			switch {
			case labelListKeywords[word] && next < len(s) && s[next] == '(':
				k := strings.IndexByte(s[next:], ')')
				if k < 0 {
					return nil, fmt.Errorf("unclosed label list after %s", word)
				}
				i = next + k + 1
			case promKeywords[word]:
				i = j
			case next < len(s) && s[next] == '(':
				i = j // a function call
			default:
				sel := promSelector{metric: word}
				i = j
				if next < len(s) && s[next] == '{' {
					k := next + 1
					for {
						k = skipSpace(k)
						for k < len(s) && s[k] == ',' {
							k = skipSpace(k + 1)
						}
						if k >= len(s) {
							return nil, fmt.Errorf("unclosed { after %s", word)
						}
						if s[k] == '}' {
							k++
							break
						}
						l := k
						for k < len(s) && isIdent(s[k]) {
							k++
						}
						label := s[l:k]
						k = skipSpace(k)
						o := k
						for k < len(s) && strings.IndexByte("=!~", s[k]) >= 0 {
							k++
						}
						op := s[o:k]
						k = skipSpace(k)
						if label == "" || (op != "=" && op != "!=" && op != "=~" && op != "!~") || k >= len(s) || strings.IndexByte("\"'`", s[k]) < 0 {
							return nil, fmt.Errorf("bad label matcher after %s at %d", word, l)
						}
						v, end, err := readString(k)
						if err != nil {
							return nil, err
						}
						sel.matchers = append(sel.matchers, promMatcher{label: label, op: op, value: v})
						k = end
					}
					i = k
				}
				out = append(out, sel)
			}
		default:
			i++
		}
	}
	if depth != 0 {
		return nil, errors.New("unbalanced parentheses")
	}
	return out, nil
}

// knownLabelValues are the values of labels that come from fixed sets in the code.
func knownLabelValues() map[string][]string {
	enum := func(names map[int32]string, prefix string) []string {
		var out []string
		for _, n := range names {
			out = append(out, strings.ToLower(strings.TrimPrefix(n, prefix)))
		}
		slices.Sort(out)
		return out
	}
	return map[string][]string{
		// router: shortClass and ShortLevel lower-case these enums.
		"class": enum(mantlev1.ErrorClass_name, "ERROR_CLASS_"),
		"level": enum(mantlev1.FallbackLevel_name, "FALLBACK_LEVEL_"),
		// resilience.State.String (an internal package of the router).
		"state": {"closed", "open", "half_open"},
	}
}

// promChecker checks PromQL expressions against the registered metrics.
type promChecker struct {
	metrics     map[string]metricDef
	records     map[string]bool // recording rules of alerts.yaml
	targetLabel []string        // labels every scraped series carries
	values      map[string][]string
}

func newPromChecker(t *testing.T) *promChecker {
	t.Helper()
	c := &promChecker{metrics: registeredMetrics(t), records: map[string]bool{}, values: knownLabelValues()}
	c.targetLabel = append([]string{"job", "instance"}, scrapeTargetLabels(t)...)
	for _, g := range loadRules(t).Groups {
		for _, r := range g.Rules {
			if r.Record != "" {
				c.records[r.Record] = true
			}
		}
	}
	return c
}

// check returns the problems of one expression.
func (c *promChecker) check(expr string) []string {
	sels, err := promSelectors(expr)
	if err != nil {
		return []string{err.Error()}
	}
	var problems []string
	for _, sel := range sels {
		if c.records[sel.metric] {
			continue
		}
		def, extra, ok := c.lookup(sel.metric)
		if !ok {
			problems = append(problems, fmt.Sprintf("metric %s is not registered by the code", sel.metric))
			continue
		}
		for _, m := range sel.matchers {
			if !slices.Contains(def.labels, m.label) && !slices.Contains(c.targetLabel, m.label) && m.label != extra {
				problems = append(problems, fmt.Sprintf("%s has no label %s (labels %q)", sel.metric, m.label, def.labels))
				continue
			}
			allowed, fixed := c.values[m.label]
			if !fixed || !slices.Contains(def.labels, m.label) {
				continue
			}
			for _, v := range strings.Split(m.value, "|") {
				if v != "" && (m.op == "=" || m.op == "!=" || plainAlternative.MatchString(v)) && !slices.Contains(allowed, v) {
					problems = append(problems, fmt.Sprintf("%s{%s%s%q}: %q is not a value of %s (%q)", sel.metric, m.label, m.op, m.value, v, m.label, allowed))
				}
			}
		}
	}
	return problems
}

// plainAlternative is a regex alternative that is a literal value, checkable as one.
var plainAlternative = regexp.MustCompile(`^[\w-]+$`)

// lookup finds the metric a series name belongs to: itself, or a histogram's or summary's
// _bucket, _sum or _count (the bucket adding the le label).
func (c *promChecker) lookup(name string) (def metricDef, extraLabel string, ok bool) {
	if d, ok := c.metrics[name]; ok {
		return d, "", true
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		base, found := strings.CutSuffix(name, suffix)
		if d, ok := c.metrics[base]; found && ok && (d.kind == "Histogram" || d.kind == "Summary") {
			if suffix == "_bucket" && d.kind == "Histogram" {
				return d, "le", true
			}
			if suffix != "_bucket" {
				return d, "quantile", true
			}
		}
	}
	return metricDef{}, "", false
}

func TestPromSelectors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		expr    string
		want    []string // metric{label op value,...}
		wantErr bool
	}{
		{`up`, []string{"up"}, false},
		{`sum by (model) (rate(a_total{class!~"none|x", model=~"$model"}[$__rate_interval]))`, []string{`a_total{class!~none|x,model=~$model}`}, false},
		{`histogram_quantile(0.95, sum by (le) (rate(h_bucket[5m])))`, []string{"h_bucket"}, false},
		{`a - (b or 0 * c) > 0`, []string{"a", "b", "c"}, false},
		{`x / ignoring (level) group_left sum(rate(y[1m] offset 1d))`, []string{"x", "y"}, false},
		{`rec:name:ratio > on (model) thr > 1e3`, []string{"rec:name:ratio", "thr"}, false},
		{`sum(rate(a[5m])`, nil, true},
		{`{job="x"}`, nil, true},
		{`a{b=c}`, nil, true},
	}
	for _, tt := range tests {
		t.Run(tt.expr, func(t *testing.T) {
			sels, err := promSelectors(tt.expr)
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, want error %t", err, tt.wantErr)
			}
			var got []string
			for _, s := range sels {
				out := s.metric
				if len(s.matchers) > 0 {
					var ms []string
					for _, m := range s.matchers {
						ms = append(ms, m.label+m.op+m.value)
					}
					out += "{" + strings.Join(ms, ",") + "}"
				}
				got = append(got, out)
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("selectors = %q, want %q", got, tt.want)
			}
		})
	}
}

// ---------------------------------------------------------------------------------------
// Prometheus.

type ruleFile struct {
	Groups []struct {
		Name     string `yaml:"name"`
		Interval string `yaml:"interval"`
		Rules    []rule `yaml:"rules"`
	} `yaml:"groups"`
}

type rule struct {
	Alert         string            `yaml:"alert"`
	Record        string            `yaml:"record"`
	Expr          string            `yaml:"expr"`
	For           string            `yaml:"for"`
	KeepFiringFor string            `yaml:"keep_firing_for"`
	Labels        map[string]string `yaml:"labels"`
	Annotations   map[string]string `yaml:"annotations"`
}

// loadRules decodes alerts.yaml strictly: Prometheus refuses unknown fields too.
func loadRules(t *testing.T) ruleFile {
	t.Helper()
	data, err := os.ReadFile(alertsFile)
	if err != nil {
		t.Fatal(err)
	}
	var rf ruleFile
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&rf); err != nil {
		t.Fatalf("%s: %v", alertsFile, err)
	}
	return rf
}

var promDuration = regexp.MustCompile(`^(\d+(ms|s|m|h|d|w|y))+$`)

func TestAlertRules(t *testing.T) {
	t.Parallel()
	rf := loadRules(t)
	check := newPromChecker(t)
	if len(rf.Groups) == 0 {
		t.Fatal("no rule groups")
	}
	groups := map[string]bool{}
	alerts := map[string]rule{}
	thresholds := map[string]bool{} // models with a P95 threshold
	for _, g := range rf.Groups {
		if g.Name == "" || groups[g.Name] {
			t.Errorf("group name %q is empty or repeated", g.Name)
		}
		groups[g.Name] = true
		if len(g.Rules) == 0 {
			t.Errorf("group %s has no rules", g.Name)
		}
		for i, r := range g.Rules {
			name := cmp.Or(r.Alert, r.Record)
			where := fmt.Sprintf("group %s rule %d (%s)", g.Name, i, name)
			if (r.Alert == "") == (r.Record == "") {
				t.Errorf("%s: want exactly one of alert and record", where)
			}
			if strings.TrimSpace(r.Expr) == "" {
				t.Errorf("%s: no expr", where)
			}
			for _, p := range check.check(r.Expr) {
				t.Errorf("%s: %s", where, p)
			}
			if r.Record != "" {
				if !strings.Contains(r.Record, ":") {
					t.Errorf("%s: recorded names follow level:metric:operations", where)
				}
				if r.For != "" || len(r.Annotations) > 0 {
					t.Errorf("%s: a recording rule has no for or annotations", where)
				}
				if r.Record == "mantle:provider_attempt_p95_threshold_seconds" {
					thresholds[r.Labels["model"]] = true
				}
				continue
			}
			if _, dup := alerts[r.Alert]; dup {
				t.Errorf("%s: alert name repeated", where)
			}
			alerts[r.Alert] = r
			if !promDuration.MatchString(r.For) {
				t.Errorf("%s: for = %q, want a duration", where, r.For)
			}
			if s := r.Labels["severity"]; s != "critical" && s != "warning" {
				t.Errorf("%s: labels.severity = %q, want critical or warning", where, s)
			}
			if strings.TrimSpace(r.Annotations["summary"]) == "" {
				t.Errorf("%s: no annotations.summary", where)
			}
		}
	}

	// The alert list an LLM gateway needs, each with what makes it that alert.
	queueSizes := map[string]bool{}
	var models []string
	for _, file := range []string{configFile, k8sConfigFile} {
		cfg := loadConfig(t, file)
		queueSizes[strconv.Itoa(cfg.Quota.Queue.Size)] = true
		for _, m := range cfg.Router.Models {
			models = append(models, m.Name)
		}
	}
	if len(queueSizes) != 1 {
		t.Errorf("quota.queue.size differs between %s and %s; MantleQuotaQueueNearBound has one bound", configFile, k8sConfigFile)
	}
	seeds := []struct {
		alert, what, forDuration string
		contains                 []string
	}{
		{"MantleModelErrorRateHigh", "model error rate over 5% for 1 minute", "1m", []string{"> 0.05"}},
		{"MantleModelLatencyP95High", "P95 over the per-model threshold", "", []string{"mantle:provider_attempt_p95_threshold_seconds"}},
		{"MantleBreakerOpen", "any breaker open", "", []string{"mantle_router_breaker_state == 2", `state="open"`}},
		{"MantleCacheHitRateDrop", "cache hit rate down more than 20%", "", []string{"0.8 *", "offset 1h"}},
		{"MantleTokenUsageSurge", "token use 50% over the same hour yesterday", "", []string{"mantle_router_tokens_total", "by (tenant)", "1.5 *", "offset 1d"}},
		{"MantleQuotaQueueNearBound", "queue depth near its bound", "", slices.Collect(maps.Keys(queueSizes))},
	}
	for _, s := range seeds {
		r, ok := alerts[s.alert]
		if !ok {
			t.Errorf("no alert %s (%s)", s.alert, s.what)
			continue
		}
		if s.forDuration != "" && r.For != s.forDuration {
			t.Errorf("%s: for = %s, want %s (%s)", s.alert, r.For, s.forDuration, s.what)
		}
		expr := r.Expr
		if s.alert == "MantleModelErrorRateHigh" {
			expr += recordExpr(rf, "model:mantle_router_attempt_errors:ratio_rate1m")
		}
		for _, want := range s.contains {
			if !strings.Contains(expr, want) {
				t.Errorf("%s: expr does not contain %q (%s):\n%s", s.alert, want, s.what, expr)
			}
		}
	}
	for _, m := range models {
		if !thresholds[m] {
			t.Errorf("model %s has no mantle:provider_attempt_p95_threshold_seconds; add one to %s", m, alertsFile)
		}
	}

	// promtool evaluates what this parser cannot: the rules against their unit tests.
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Log("promtool is not on PATH: the rules' unit tests were not run")
		return
	}
	for _, args := range [][]string{{"check", "rules", alertsFile}, {"test", "rules", alertTestsFile}} {
		if out, err := exec.Command(promtool, args...).CombinedOutput(); err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

func recordExpr(rf ruleFile, name string) string {
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			if r.Record == name {
				return r.Expr
			}
		}
	}
	return ""
}

type prometheusConfig struct {
	RuleFiles     []string `yaml:"rule_files"`
	ScrapeConfigs []struct {
		JobName       string `yaml:"job_name"`
		MetricsPath   string `yaml:"metrics_path"`
		StaticConfigs []struct {
			Targets []string          `yaml:"targets"`
			Labels  map[string]string `yaml:"labels"`
		} `yaml:"static_configs"`
	} `yaml:"scrape_configs"`
}

func loadPrometheusConfig(t *testing.T) prometheusConfig {
	t.Helper()
	data, err := os.ReadFile(prometheusFile)
	if err != nil {
		t.Fatal(err)
	}
	var pc prometheusConfig
	if err := yaml.Unmarshal(data, &pc); err != nil {
		t.Fatalf("%s: %v", prometheusFile, err)
	}
	return pc
}

// scrapeTargetLabels are the labels prometheus.yml adds to the mantle targets.
func scrapeTargetLabels(t *testing.T) []string {
	t.Helper()
	var out []string
	for _, sc := range loadPrometheusConfig(t).ScrapeConfigs {
		for _, st := range sc.StaticConfigs {
			for l := range st.Labels {
				if !slices.Contains(out, l) {
					out = append(out, l)
				}
			}
		}
	}
	return out
}

// TestPrometheusConfig checks that Prometheus in compose loads the rules and scrapes every
// mantle service on its HTTP port, labelled with the module it runs.
func TestPrometheusConfig(t *testing.T) {
	t.Parallel()
	pc := loadPrometheusConfig(t)
	c := loadCompose(t)
	cfg := loadConfig(t, configFile)
	httpPort := port(t, cfg.Server.HTTPListenAddress)

	if !slices.Contains(pc.RuleFiles, filepath.Base(alertsFile)) {
		t.Errorf("rule_files %q do not load %s", pc.RuleFiles, filepath.Base(alertsFile))
	}
	for _, f := range pc.RuleFiles {
		if _, err := os.Stat(filepath.Join(filepath.Dir(prometheusFile), f)); err != nil {
			t.Errorf("rule_files: %v", err)
		}
	}

	want := map[string]string{} // target -> module
	for name, s := range mantleServices(t, c) {
		target, _ := flagValue(s.Command, targetFlag)
		want[net.JoinHostPort(name, httpPort)] = target
	}
	got := map[string]string{}
	for _, sc := range pc.ScrapeConfigs {
		if sc.JobName != "mantle" {
			continue
		}
		if sc.MetricsPath != "" && sc.MetricsPath != "/metrics" {
			t.Errorf("job mantle scrapes %s; mantle serves /metrics", sc.MetricsPath)
		}
		for _, st := range sc.StaticConfigs {
			for _, target := range st.Targets {
				got[target] = st.Labels["service"]
			}
		}
	}
	if !maps.Equal(got, want) {
		t.Errorf("job mantle scrapes %v (target: service label), want %v", got, want)
	}

	prom, ok := c.Services["prometheus"]
	if !ok {
		t.Fatal("no prometheus service in compose")
	}
	cfgPath, n := flagValue(prom.Command, "--config.file=")
	if n != 1 {
		t.Fatalf("prometheus command %q: want one --config.file", prom.Command)
	}
	host, _, ok := hostPath(prom.Volumes, path.Dir(cfgPath))
	if !ok || filepath.Clean(host) != filepath.Join("deploy", filepath.Dir(prometheusFile)) {
		t.Errorf("prometheus reads %s, but %s is not mounted at %s (volumes %q)", cfgPath, filepath.Dir(prometheusFile), path.Dir(cfgPath), prom.Volumes)
	}
	if path.Base(cfgPath) != filepath.Base(prometheusFile) {
		t.Errorf("prometheus reads %s, want %s", cfgPath, filepath.Base(prometheusFile))
	}
}

// ---------------------------------------------------------------------------------------
// Grafana.

type dashboard struct {
	UID        string  `json:"uid"`
	Title      string  `json:"title"`
	Panels     []panel `json:"panels"`
	Templating struct {
		List []struct {
			Name  string          `json:"name"`
			Type  string          `json:"type"`
			Query json.RawMessage `json:"query"`
		} `json:"list"`
	} `json:"templating"`
}

type panel struct {
	ID         int    `json:"id"`
	Type       string `json:"type"`
	Title      string `json:"title"`
	Datasource *struct {
		Type string `json:"type"`
		UID  string `json:"uid"`
	} `json:"datasource"`
	GridPos struct {
		H, W, X, Y int
	} `json:"gridPos"`
	Targets []struct {
		Expr  string `json:"expr"`
		RefID string `json:"refId"`
	} `json:"targets"`
	Panels []panel `json:"panels"` // a collapsed row's panels
}

func loadDashboard(t *testing.T) dashboard {
	t.Helper()
	data, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	return d
}

type grafanaDatasources struct {
	APIVersion  int `yaml:"apiVersion"`
	Datasources []struct {
		Name      string `yaml:"name"`
		UID       string `yaml:"uid"`
		Type      string `yaml:"type"`
		URL       string `yaml:"url"`
		IsDefault bool   `yaml:"isDefault"`
	} `yaml:"datasources"`
}

type grafanaProviders struct {
	APIVersion int `yaml:"apiVersion"`
	Providers  []struct {
		Name    string `yaml:"name"`
		Type    string `yaml:"type"`
		Options struct {
			Path string `yaml:"path"`
		} `yaml:"options"`
	} `yaml:"providers"`
}

func yamlFiles(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	for _, pattern := range []string{"*.yaml", "*.yml"} {
		m, err := filepath.Glob(filepath.Join(dir, pattern))
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, m...)
	}
	if len(out) == 0 {
		t.Fatalf("no provisioning file in %s", dir)
	}
	return out
}

func loadDatasources(t *testing.T) grafanaDatasources {
	t.Helper()
	var all grafanaDatasources
	for _, f := range yamlFiles(t, datasourcesDir) {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var ds grafanaDatasources
		if err := yaml.Unmarshal(data, &ds); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if ds.APIVersion != 1 {
			t.Errorf("%s: apiVersion %d, want 1", f, ds.APIVersion)
		}
		all.Datasources = append(all.Datasources, ds.Datasources...)
	}
	return all
}

// TestDashboard checks the dashboard's panels and queries: the minimum metric set of
// The golden signals plus breakers and the ladder, each query on metrics the code registers, on
// the provisioned Prometheus, with variables the dashboard defines.
func TestDashboard(t *testing.T) {
	t.Parallel()
	d := loadDashboard(t)
	check := newPromChecker(t)
	if d.UID == "" || d.Title == "" {
		t.Errorf("uid %q, title %q: want both", d.UID, d.Title)
	}
	var promUID string
	for _, ds := range loadDatasources(t).Datasources {
		if ds.Type == "prometheus" {
			promUID = ds.UID
		}
	}
	if promUID == "" {
		t.Fatal("no provisioned prometheus data source with a uid")
	}

	vars := map[string]bool{}
	labelValues := regexp.MustCompile(`^label_values\((\w+),\s*(\w+)\)$`)
	for _, v := range d.Templating.List {
		vars[v.Name] = true
		var q string
		var qo struct {
			Query string `json:"query"`
		}
		if json.Unmarshal(v.Query, &q) != nil && json.Unmarshal(v.Query, &qo) == nil {
			q = qo.Query
		}
		if v.Type != "query" {
			continue
		}
		m := labelValues.FindStringSubmatch(q)
		if m == nil {
			t.Errorf("variable %s: query %q, want label_values(metric, label)", v.Name, q)
			continue
		}
		def, ok := check.metrics[m[1]]
		if !ok || !slices.Contains(def.labels, m[2]) {
			t.Errorf("variable %s: %s is not a registered metric with label %s", v.Name, m[1], m[2])
		}
	}
	builtin := map[string]bool{"__rate_interval": true, "__interval": true, "__range": true}
	varRef := regexp.MustCompile(`\$\{?(\w+)`)

	ids := map[int]bool{}
	var titles, exprs []string
	var walk func(ps []panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			if ids[p.ID] {
				t.Errorf("panel id %d repeated (%s)", p.ID, p.Title)
			}
			ids[p.ID] = true
			if p.GridPos.W <= 0 || p.GridPos.X+p.GridPos.W > 24 || p.GridPos.H <= 0 {
				t.Errorf("panel %q: gridPos %+v outside the 24 columns", p.Title, p.GridPos)
			}
			if p.Type == "row" {
				walk(p.Panels)
				continue
			}
			titles = append(titles, p.Title)
			if p.Datasource == nil || p.Datasource.UID != promUID {
				t.Errorf("panel %q: datasource %+v, want uid %s", p.Title, p.Datasource, promUID)
			}
			if len(p.Targets) == 0 {
				t.Errorf("panel %q has no query", p.Title)
			}
			for _, tg := range p.Targets {
				exprs = append(exprs, tg.Expr)
				for _, problem := range check.check(tg.Expr) {
					t.Errorf("panel %q query %s: %s", p.Title, tg.RefID, problem)
				}
				for _, m := range varRef.FindAllStringSubmatch(tg.Expr, -1) {
					if !vars[m[1]] && !builtin[m[1]] {
						t.Errorf("panel %q uses $%s, which the dashboard does not define", p.Title, m[1])
					}
				}
			}
		}
	}
	walk(d.Panels)

	// The minimum metric set: end-to-end success rate, end-to-end P50/P95/P99, model call error rate,
	// breaker trips, queue depth, cost per request; and (issue 8) breaker states, the ladder.
	for _, want := range []string{
		"End-to-end success rate", "End-to-end latency P50 / P95 / P99", "Model call error rate",
		"Breaker trips", "Quota queue depth", "Tokens per request (cost proxy)",
		"Breakers open now", "Breaker transitions by state", "Degradations by ladder level",
		// Issue 8: streaming, retries and why requests degrade.
		"Time to first token P95 by model", "Retries by model and error class", "Degradations by reason",
	} {
		if !slices.Contains(titles, want) {
			t.Errorf("no panel %q", want)
		}
	}

	// promtool checks the syntax the lexer above does not, when it is installed.
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		return
	}
	var rules []map[string]string
	for i, e := range exprs {
		e = strings.NewReplacer("$__rate_interval", "5m", "$__interval", "1m", "$__range", "1h").Replace(e)
		rules = append(rules, map[string]string{"record": fmt.Sprintf("dashboard:query:%d", i), "expr": e})
	}
	data, err := yaml.Marshal(map[string]any{"groups": []any{map[string]any{"name": "dashboard", "rules": rules}}})
	if err != nil {
		t.Fatal(err)
	}
	f := filepath.Join(t.TempDir(), "dashboard-queries.yaml")
	if err := os.WriteFile(f, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(promtool, "check", "rules", f).CombinedOutput(); err != nil {
		t.Errorf("promtool check rules on the dashboard's queries: %v\n%s", err, out)
	}
}

// TestGrafanaProvisioning checks that compose mounts the provisioning files where Grafana
// reads them, and that they point at the compose services and the dashboard directory.
func TestGrafanaProvisioning(t *testing.T) {
	t.Parallel()
	c := loadCompose(t)
	g, ok := c.Services["grafana"]
	if !ok {
		t.Fatal("no grafana service in compose")
	}
	mountOf := func(host string) string {
		for _, v := range g.Volumes {
			parts := strings.Split(v, ":")
			if len(parts) >= 2 && filepath.Clean(parts[0]) == filepath.Clean(host) {
				return parts[1]
			}
		}
		return ""
	}
	if got := mountOf("./deploy/grafana/provisioning"); got != "/etc/grafana/provisioning" {
		t.Errorf("deploy/grafana/provisioning is mounted at %q, want /etc/grafana/provisioning", got)
	}
	dashDir := mountOf("./deploy/grafana/dashboards")
	if dashDir == "" {
		t.Fatal("deploy/grafana/dashboards is not mounted")
	}

	ds := loadDatasources(t)
	defaults := 0
	for _, d := range ds.Datasources {
		if d.UID == "" {
			t.Errorf("data source %s has no uid; dashboards refer to it by uid", d.Name)
		}
		if d.IsDefault {
			defaults++
		}
		host := strings.TrimPrefix(strings.TrimPrefix(d.URL, "http://"), "https://")
		host, _, _ = strings.Cut(host, "/")
		name, _, err := net.SplitHostPort(host)
		if err != nil {
			t.Errorf("data source %s: url %q: %v", d.Name, d.URL, err)
			continue
		}
		if _, ok := c.Services[name]; !ok {
			t.Errorf("data source %s: url %q names no compose service", d.Name, d.URL)
		}
	}
	if defaults != 1 {
		t.Errorf("%d default data sources, want 1", defaults)
	}

	for _, f := range yamlFiles(t, providersDir) {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var pv grafanaProviders
		if err := yaml.Unmarshal(data, &pv); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if pv.APIVersion != 1 || len(pv.Providers) == 0 {
			t.Errorf("%s: apiVersion %d with %d providers, want 1 and some", f, pv.APIVersion, len(pv.Providers))
		}
		for _, p := range pv.Providers {
			if p.Type != "file" || p.Options.Path != dashDir {
				t.Errorf("%s: provider %s reads %s (%s), want the file provider on %s where compose mounts the dashboards", f, p.Name, p.Options.Path, p.Type, dashDir)
			}
		}
	}
	if home := g.Environment["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]; home != "" {
		rel, ok := strings.CutPrefix(home, dashDir+"/")
		if _, err := os.Stat(filepath.Join(filepath.Dir(dashboardFile), rel)); !ok || err != nil {
			t.Errorf("home dashboard %s is not a file of deploy/grafana/dashboards", home)
		}
	}
	if g.Environment["GF_AUTH_ANONYMOUS_ENABLED"] != "true" || g.Environment["GF_AUTH_ANONYMOUS_ORG_ROLE"] != "Viewer" {
		t.Errorf("grafana environment %v: want anonymous viewers", g.Environment)
	}
}

// TestComposeObservability checks the images of the observability services are pinned and
// that the trace viewer receives OTLP.
func TestComposeObservability(t *testing.T) {
	t.Parallel()
	c := loadCompose(t)
	for _, name := range []string{"prometheus", "grafana", "jaeger"} {
		s, ok := c.Services[name]
		if !ok {
			t.Errorf("no %s service in compose", name)
			continue
		}
		_, tag, ok := strings.Cut(s.Image, ":")
		if !ok || tag == "" || tag == "latest" {
			t.Errorf("%s: image %q, want a pinned tag", name, s.Image)
		}
	}
	if !slices.Contains(containerPorts(c.Services["jaeger"].Ports), "4317") {
		t.Errorf("jaeger publishes %q, want the OTLP/gRPC port 4317", c.Services["jaeger"].Ports)
	}
}
