// Package router is mantle's front door and executor. For each request it authenticates the
// tenant, builds the QualityContext and its deadline budget, reserves quota, looks up the
// cache, calls the route's candidate models in order (moving on when a failure class says
// another candidate may succeed), has the verifier check the answer, settles the real token
// usage, stores verified answers, and publishes a degradation event whenever anything but
// the route's first choice answered.
//
// It serves gRPC (mantle.router.v1.RouterService) and an OpenAI-compatible HTTP API
// (POST /v1/chat/completions, GET /v1/models) on the process's HTTP port. It reaches quota,
// cache and verifier only through their generated gRPC clients; it never imports them.
// Its only state is per-replica latency statistics per upstream key.
package router
