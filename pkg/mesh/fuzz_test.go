package mesh_test

import (
	"strings"
	"testing"

	"github.com/mantle-mesh/mantle/pkg/mesh"
)

// FuzzConfigDecode: any YAML document is applied to the defaults or refused with an error,
// and Validate judges whatever decoded; neither panics.
func FuzzConfigDecode(f *testing.F) {
	for _, seed := range []string{
		"target: all\nserver:\n  http_listen_address: 127.0.0.1:8080\n",
		"router:\n  routes:\n    - {name: chat, scenario: chat, candidates: [a]}\n  models: [{name: a, provider: p}]\n  providers: [{name: p, type: sim}]\n",
		"verifier:\n  max_schema_depth: 0\n  rules:\n    - {id: r, condition: 'text.contains(\"x\")', action: {type: mask, pattern: x, value: y}}\n",
		"auth:\n  tenants: [{id: a, key_sha256: abc}]\nquota:\n  tenants: {a: {rpm: 1}}\n",
		"server: {idle_timeout: -1s, max_header_bytes: 1}\n", "&a [*a]", "{", "",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, doc string) {
		cfg := mesh.Default()
		if err := cfg.Decode(strings.NewReader(doc)); err != nil {
			return
		}
		_ = cfg.Validate()
	})
}
