package provider

import "context"

// EmbedRequest asks for one vector per input. Exactly one of Input and InputTokens is set.
type EmbedRequest struct {
	// Model is the provider's model name.
	Model string
	// Input are texts.
	Input []string
	// InputTokens are inputs given as token ids of the model's tokenizer.
	InputTokens [][]int64
	// Dimensions asks for shorter vectors; nil: the model's own size.
	Dimensions *int
	// User is the end user the request is made for.
	User string
}

// EmbedResponse is one vector per input, in input order.
type EmbedResponse struct {
	Vectors [][]float32
	// Model is the model the provider says answered.
	Model     string
	Usage     Usage
	RateLimit RateLimit
	RequestID string
}

// Embedder is implemented by adapters whose API has embeddings. The router sends an
// embeddings request only to a model with the embeddings capability whose adapter is one.
type Embedder interface {
	Embed(ctx context.Context, req EmbedRequest) (EmbedResponse, error)
}
