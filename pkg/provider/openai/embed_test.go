package openai

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	"github.com/mantle-mesh/mantle/pkg/provider"
)

func TestEmbed(t *testing.T) {
	var got map[string]json.RawMessage
	var path, auth string
	answer := `{"object":"list","data":[{"object":"embedding","index":1,"embedding":[3,4]},{"object":"embedding","index":0,"embedding":"AACAPwAAAEA="}],"model":"m-up","usage":{"prompt_tokens":5,"total_tokens":5}}`
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		path, auth = r.URL.Path, r.Header.Get("Authorization")
		b, _ := io.ReadAll(r.Body)
		_ = json.Unmarshal(b, &got)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, answer)
	}))
	defer srv.Close()
	c := New(Config{BaseURL: srv.URL + "/v1", APIKey: "sk"})
	dims := 2
	res, err := c.Embed(context.Background(), provider.EmbedRequest{Model: "m", Input: []string{"a", "b"}, Dimensions: &dims, User: "u"})
	if err != nil {
		t.Fatal(err)
	}
	if path != "/v1/embeddings" || auth != "Bearer sk" {
		t.Errorf("path %s auth %q", path, auth)
	}
	for k, want := range map[string]string{"model": `"m"`, "input": `["a","b"]`, "dimensions": `2`, "user": `"u"`, "encoding_format": `"float"`} {
		if string(got[k]) != want {
			t.Errorf("%s = %s, want %s", k, got[k], want)
		}
	}
	// Placed by index; base64 (little-endian float32 1, 2) decoded like floats.
	if len(res.Vectors) != 2 || res.Vectors[0][0] != 1 || res.Vectors[0][1] != 2 || res.Vectors[1][1] != 4 || res.Usage.InputTokens != 5 || res.Model != "m-up" {
		t.Errorf("response %+v", res)
	}
	if _, err := c.Embed(context.Background(), provider.EmbedRequest{Model: "m", InputTokens: [][]int64{{1, 2}, {3}}}); err != nil {
		t.Fatal(err)
	}
	if string(got["input"]) != `[[1,2],[3]]` {
		t.Errorf("token input sent as %s", got["input"])
	}
}

func TestParseEmbeddingsRefusesMalformed(t *testing.T) {
	tests := []struct{ name, body string }{
		{"not json", `nope`},
		{"fewer vectors", `{"data":[{"index":0,"embedding":[1]}]}`},
		{"index out of range", `{"data":[{"index":0,"embedding":[1]},{"index":5,"embedding":[1]}]}`},
		{"duplicate index", `{"data":[{"index":0,"embedding":[1]},{"index":0,"embedding":[1]}]}`},
		{"sizes differ", `{"data":[{"index":0,"embedding":[1]},{"index":1,"embedding":[1,2]}]}`},
		{"empty vector", `{"data":[{"index":0,"embedding":[]},{"index":1,"embedding":[]}]}`},
		{"not numbers", `{"data":[{"index":0,"embedding":["a"]},{"index":1,"embedding":[1]}]}`},
		{"bad base64", `{"data":[{"index":0,"embedding":"AAA"},{"index":1,"embedding":[1]}]}`},
		{"overflow to inf", `{"data":[{"index":0,"embedding":[1e300]},{"index":1,"embedding":[1]}]}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parseEmbeddings([]byte(tt.body), 2)
			if err == nil || err.Class != mantlev1.ErrorClass_ERROR_CLASS_MALFORMED_OUTPUT {
				t.Errorf("err = %v, want MALFORMED_OUTPUT", err)
			}
		})
	}
	big := make([]float64, MaxEmbeddingDimensions+1)
	b, _ := json.Marshal(map[string]any{"data": []any{map[string]any{"index": 0, "embedding": big}}})
	if _, err := parseEmbeddings(b, 1); err == nil {
		t.Error("a vector above MaxEmbeddingDimensions was accepted")
	}
}

// FuzzParseEmbeddings: any upstream body is want vectors of one finite size within
// MaxEmbeddingDimensions, or a classified error; never a panic.
func FuzzParseEmbeddings(f *testing.F) {
	f.Add([]byte(`{"data":[{"index":0,"embedding":[1,2]},{"index":1,"embedding":"AACAPwAAAEA="}]}`), 2)
	f.Add([]byte(`{"data":[]}`), 0)
	f.Fuzz(func(t *testing.T, body []byte, want int) {
		if want < 0 || want > 4096 {
			return
		}
		res, err := parseEmbeddings(body, want)
		if err != nil {
			if err.Class == mantlev1.ErrorClass_ERROR_CLASS_NONE {
				t.Fatalf("unclassified error %v", err)
			}
			return
		}
		if len(res.Vectors) != want {
			t.Fatalf("%d vectors, want %d", len(res.Vectors), want)
		}
		for _, v := range res.Vectors {
			if len(v) == 0 || len(v) > MaxEmbeddingDimensions || len(v) != len(res.Vectors[0]) {
				t.Fatalf("vector of %d", len(v))
			}
		}
	})
}
