package anthropic

import (
	"context"
	"testing"

	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	"github.com/mantle-mesh/mantle/pkg/provider"
)

func TestEmbedRefused(t *testing.T) {
	_, err := New(Config{}).Embed(context.Background(), provider.EmbedRequest{Model: "m", Input: []string{"x"}})
	if provider.ClassOf(err) != mantlev1.ErrorClass_ERROR_CLASS_BAD_REQUEST {
		t.Errorf("err = %v, want BAD_REQUEST", err)
	}
}
