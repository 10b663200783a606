package embed

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"math"
	"testing"
)

// fingerprint hashes the coordinates and weights of text's vector.
func fingerprint(text string) string {
	v, err := NewLexical().Embed(context.Background(), text)
	if err != nil {
		return "error: " + err.Error()
	}
	h := sha256.New()
	for i, ix := range v.Indices {
		_ = binary.Write(h, binary.LittleEndian, ix)
		_ = binary.Write(h, binary.LittleEndian, math.Float32bits(v.Values[i]))
	}
	return fmt.Sprintf("%x", h.Sum(nil)[:8])
}

// TestLexicalNamespaceIsStable pins the lexical embedder's vectors for a few texts. Entries
// in snapshots and Qdrant collections were embedded under LexicalNamespace; if a change to
// the features, weights or hashing makes this test fail, bump LexicalNamespace (so old
// vectors stop being compared with new ones) and then update the fingerprints.
func TestLexicalNamespaceIsStable(t *testing.T) {
	t.Parallel()
	if LexicalNamespace != "lexical-v1" {
		t.Skip("a new namespace: record new fingerprints")
	}
	golden := []struct{ text, fingerprint string }{
		{"How do I reset my password?", "ea45358e888cb5a3"},
		{"how to reset password", "67646d782320342e"},
		{"I don't know what it's for; e-mail me", "cda10cd9ecd4232e"},
		{"怎么重置密码", "9a2102d8ceb3220d"},
		{"请问退货的流程是什么？", "fc9a7cf13c5e4282"},
		{"华为手机 A123怎么退货", "43c108b1a65a970f"},
		{"iPhone 15 Pro Max 退货", "21665486e1daeaa6"},
		{"ＦＵＬＬ ｗｉｄｔｈ １２３", "55cf81c84fbcbb1e"},
		{"Why can't I log in to the admin dashboard from my phone?", "39cd9a0fb74742f4"},
		{"résumé café naïve", "f300f62cc59599f3"},
		{"привет мир как дела", "f91fabd2de33da42"},
		{"カタカナとひらがな", "3e8b3ab716f4cdf3"},
		{"a", "0e1cb253df648a2c"},
		{"日", "c439acea1ff7e097"},
		{"The the the the the", "883671616dbe7d4a"},
		{"它们在这里吗", "c123414f5b2fe221"},
		{"x1 y2 z3 a-b-c", "e2845b2dd91dc75c"},
		// A trigram shared by words of different lengths (ual, ing): the first one's weight.
		{"How long does shipping usually take?", "9b977c9873535abd"},
		{"Is there a student discount?", "9128842a2d9ddee0"},
	}
	for _, g := range golden {
		if got := fingerprint(g.text); got != g.fingerprint {
			t.Errorf("vector of %q changed (fingerprint %s, was %s): bump LexicalNamespace", g.text, got, g.fingerprint)
		}
	}
}
