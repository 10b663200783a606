package anthropic

import (
	"context"

	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	"github.com/mantle-mesh/mantle/pkg/provider"
)

var _ provider.Embedder = (*Client)(nil)

// Embed refuses: the Anthropic API has no embeddings. The router's configuration check
// keeps embeddings models off Anthropic providers, so this answers only a caller that
// skipped it; BAD_REQUEST, because no retry can change the answer.
func (c *Client) Embed(context.Context, provider.EmbedRequest) (provider.EmbedResponse, error) {
	return provider.EmbedResponse{}, &provider.Error{
		Class:   mantlev1.ErrorClass_ERROR_CLASS_BAD_REQUEST,
		Message: "the Anthropic API has no embeddings endpoint",
	}
}
