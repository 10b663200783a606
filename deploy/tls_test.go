package deploy_test

import (
	"flag"
	"io"
	"os"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/mantle-mesh/mantle/pkg/mesh"
	"github.com/mantle-mesh/mantle/pkg/tlsconfig"
)

const (
	composeTLSFile    = "compose/tls.yml"
	prometheusTLSFile = "compose/prometheus-tls.yml"
	certsDir          = "/home/nonroot/certs"
)

// TestComposeTLS reads each mantle service's command in the TLS override the way
// `mantle serve` parses it, on top of the compose configuration, and checks that the
// result validates, presents the service's own certificate from the volume the certs
// service writes, and asks the right client authentication of each listener.
func TestComposeTLS(t *testing.T) {
	data, err := os.ReadFile(composeTLSFile)
	if err != nil {
		t.Fatal(err)
	}
	var c compose
	if err := yaml.Unmarshal(data, &c); err != nil {
		t.Fatalf("%s: %v", composeTLSFile, err)
	}
	certs := c.Services["certs"]
	if certs.Image != mantleImage || !slices.Equal(certs.Command, []string{"certs", "--out", certsDir}) || !slices.Contains(certs.Volumes, "mantle-certs:/home/nonroot") {
		t.Errorf("certs service: image %q command %q volumes %q; want %s writing %s on the mantle-certs volume", certs.Image, certs.Command, certs.Volumes, mantleImage, certsDir)
	}
	for _, svc := range tlsconfig.DevServices {
		t.Run(svc, func(t *testing.T) {
			s, ok := c.Services[svc]
			if !ok {
				t.Fatalf("%s: no service %s", composeTLSFile, svc)
			}
			if len(s.Command) < 1 || s.Command[0] != "serve" {
				t.Fatalf("command %q, want serve ...", s.Command)
			}
			fs := flag.NewFlagSet("serve", flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			f := mesh.RegisterFlags(fs)
			if err := fs.Parse(s.Command[1:]); err != nil {
				t.Fatalf("command %q: %v", s.Command, err)
			}
			if f.File != "/etc/mantle/mantle.yaml" {
				t.Errorf("--config.file=%s, want /etc/mantle/mantle.yaml", f.File)
			}
			f.File = configFile
			cfg, err := mesh.Load(f)
			if err != nil {
				t.Fatal(err)
			}
			if err := cfg.Validate(); err != nil {
				t.Fatalf("configuration does not validate:\n%v", err)
			}
			want := tlsconfig.Config{
				CertFile: certsDir + "/" + svc + ".crt", KeyFile: certsDir + "/" + svc + ".key", CAFile: certsDir + "/ca.crt",
				GRPCClientAuth: tlsconfig.ClientAuthRequire, HTTPClientAuth: tlsconfig.ClientAuthVerifyIfGiven,
			}
			if svc == "router" {
				want.GRPCClientAuth = tlsconfig.ClientAuthVerifyIfGiven // tenants have no certificate
			}
			if cfg.TLS != want {
				t.Errorf("tls = %+v\nwant %+v", cfg.TLS, want)
			}
			if got := cfg.Targets(); !slices.Equal(got, []string{svc}) {
				t.Errorf("targets %q, want %s", got, svc)
			}
			if !slices.Contains(s.Volumes, "mantle-certs:/home/nonroot:ro") {
				t.Errorf("volumes %q: want the certificates volume read-only at /home/nonroot", s.Volumes)
			}
		})
	}
	prom := c.Services["prometheus"]
	if !slices.Contains(prom.Volumes, "mantle-certs:/certs:ro") || !slices.Contains(prom.Volumes, "./deploy/compose/prometheus-tls.yml:/etc/prometheus/prometheus.yml:ro") {
		t.Errorf("prometheus volumes %q: want the TLS scrape configuration and the certificates", prom.Volumes)
	}
	scrape, err := os.ReadFile(prometheusTLSFile)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(scrape), "scheme: https") || !strings.Contains(string(scrape), "ca_file: /certs/certs/ca.crt") {
		t.Errorf("%s: want scheme https and the CA the certs service writes", prometheusTLSFile)
	}
}
